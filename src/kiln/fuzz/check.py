"""Compile a case at each configuration and compare with the reference interpreter.

    outcome = check_case(case, CONFIGS, cache_dir)
    for failure in outcome.failures: print(failure)

Per configuration: compile (with ``verify``, checking the graph after every pass), run on the
case's inputs in their layouts, compare each output at the strength `kiln.fuzz.exactness`
gives it, check that no input was written, then run again on other values and check that the
first results did not change (an output must never live in a buffer the next call reuses).
Where a rounded node's reference value is ill-conditioned (`Reference.ill_conditioned`), what
follows it is not compared.
A case whose reference run raises (integer division by zero, an index out of range) is not a
test of kiln: it is counted as invalid, never as a failure.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.engine import CompiledGraph, compile_graph
from kiln.fuzz.case import Case, FuzzInput
from kiln.fuzz.compare import RTOL, Strength, compare, rtol_of
from kiln.fuzz.exactness import rounding_of, strengths
from kiln.fuzz.reference import ill_conditioned, trace_values, type_gaps, wide_values
from kiln.fuzz.values import bits
from kiln.ir.attrs import AddmmActAttrs, AddmmAttrs, ConvActAttrs
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.interp import evaluate_node
from kiln.ir.ops import Op
from kiln.kernels.attention import attention_call, scores_bounded
from kiln.options import Options


@dataclass(frozen=True)
class Config:
    """One way of compiling: an opt level, generated kernels on or off, fast math, the
    strategy that applies the rules."""

    name: str
    opt_level: int
    kernels: bool = False  # generated kernels, generated GEMMs and prepacked library kernels
    fast_math: bool = False
    search: str = "greedy"

    def options(self, cache_dir: str, verify: bool = False) -> Options:
        return Options(opt_level=self.opt_level, debug=verify, fast_math=self.fast_math,
                       generated_kernels=self.kernels, generated_gemm=self.kernels,
                       prepacked_library=self.kernels, measure_kernels=False,
                       kernel_cache_dir=cache_dir, search=self.search)


REFERENCE = "reference"  # the "configuration" of a failure of the IR itself (Kind.WRONG_TYPE)
CONFIGS: tuple[Config, ...] = (
    Config("O0", 0), Config("O1", 1), Config("O2", 2), Config("O3", 3),
    Config("O2+kernels", 2, kernels=True), Config("O3+kernels", 3, kernels=True),
    Config("O2+fast_math", 2, fast_math=True), Config("O2+search", 2, search="backtrack"),
)
LIBRARY_CONFIGS = tuple(c for c in CONFIGS if not c.kernels)
KERNEL_CONFIGS = tuple(c for c in CONFIGS if c.kernels)


def config_named(name: str) -> Config:
    for config in CONFIGS:
        if config.name == name:
            return config
    raise KeyError(f"no fuzz configuration {name!r}; known: "
                   f"{', '.join(c.name for c in CONFIGS)}")


class Kind(enum.Enum):
    WRONG_TYPE = "wrong type"  # the reference computes another type than the IR declares
    MISMATCH = "mismatch"  # an output differs from the reference
    CRASH = "crash"  # compiling or running raised
    WROTE_INPUT = "wrote an input"
    STALE_OUTPUT = "output changed by the next call"


@dataclass(frozen=True)
class Failure:
    config: str
    kind: Kind
    detail: str
    output: int | None = None  # MISMATCH: which output

    def same_bug(self, other: Failure) -> bool:
        """Shrinking keeps a change only if the failure stays of the same kind (and, for a
        crash, the same exception type)."""
        if self.kind is not other.kind or self.config != other.config:
            return False
        if self.kind is Kind.CRASH:  # "compile: IndexError: ...": the stage and the type
            return self.detail.split(":")[:2] == other.detail.split(":")[:2]
        return self.category == other.category

    @property
    def category(self) -> str:
        """What kind of difference: "NaN positions differ", "got float32 ... expected"
        (a type), "beyond rtol" (a value) ...: the detail without strength and numbers."""
        text = self.detail.split(": ", 1)[-1]
        if text.startswith("got ") or " outputs, expected " in text:
            return "type"
        return re.split(r" at \d| \d", text, maxsplit=1)[0]

    def __str__(self) -> str:
        where = f" (output {self.output})" if self.output is not None else ""
        return f"[{self.config}] {self.kind.value}{where}: {self.detail}"


@dataclass
class ConfigStats:
    """What one configuration checked: outputs compared at each strength, kernels used."""

    outputs: dict[Strength, int] = field(default_factory=lambda: dict.fromkeys(Strength, 0))
    generated: int = 0  # generated kernels that ran
    prepacked: int = 0
    warnings: list[str] = field(default_factory=list)  # kiln's own warnings while compiling


@dataclass
class Outcome:
    case: Case
    valid: bool = True
    invalid_reason: str = ""
    failures: list[Failure] = field(default_factory=list)
    stats: dict[str, ConfigStats] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass
class Reference:
    """The interpreter's run of a case: every value, the outputs, and (computed when first
    needed) the float64 twin's outputs."""

    case: Case
    values: dict[Value, Any]
    outputs: list[Any]
    _wide: dict[Value, Any] | None = None
    _wide_done: bool = False

    def wide(self) -> dict[Value, Any] | None:
        """The float64 twin's value of every value (None where it cannot run)."""
        if not self._wide_done:
            self._wide = wide_values(self.case.graph, self.case.materialize())
            self._wide_done = True
        return self._wide

    def ill_conditioned(self, strength_of: dict[Value, Strength]) -> set[str]:
        """Rounded nodes whose reference result already depends on rounding and overflow
        (the twin disagrees on NaN/inf/finite): what follows them is not compared. Where
        the twin cannot run (a float16 or integer operand it has no wider type for), the
        tests that need no twin still apply."""
        wide = self.wide()
        ill = set()
        for v, s in strength_of.items():
            if s not in (Strength.CLOSE, Strength.NEAR) or v.node.op is Op.INPUT:
                continue
            twin_disagrees = wide is not None and (
                ill_conditioned(self.values.get(v), wide.get(v))
                or self._ill_before_activation(v.node, wide))
            if twin_disagrees or self._amplifies(v.node) or self._may_overflow(v.node) or \
                    self._scales_subnormal(v.node, strength_of) or \
                    self._attention_backend_decides(v.node):
                ill.add(v.node.name)
        return ill

    def _scales_subnormal(self, node: Node, strength_of: dict[Value, Strength]) -> bool:
        """Does the node scale up a rounded operand that is subnormal somewhere? There an
        ulp is the whole value (erf(1.4e-45) is 1 or 2 units of 1.4e-45, both within an ulp),
        so erf(x) / x is 1.0 or 2.0 (fuzz seed 9, graph 56562): relative tolerance cannot
        hold after a division or a product."""
        if node.op not in _SCALING:
            return False
        for v in node.inputs:
            x = self.values.get(v)
            if strength_of.get(v) in (Strength.CLOSE, Strength.NEAR) and \
                    isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
                tiny = torch.finfo(x.dtype).tiny
                if bool(((x != 0) & (x.abs() < tiny)).any()):
                    return True
        return False

    def _attention_backend_decides(self, node: Node) -> bool:
        """ATen's fused attention call with a non-finite Q, K or V, or scores that may come
        near the float range (`kiln.kernels.attention.scores_bounded` fails): its answer
        then depends on the backend its operands' strides choose, and a compiled graph hands
        it other strides (inputs made dense). Its flash kernel answers
        0 for a row whose scores are all NaN where its math path answers NaN, and the two
        scale Q and K at different points, so that one overflows where the other does not
        (fuzz seed 2, graphs 50, 139 and 164; a fully masked row is 0 on both)."""
        call = attention_call(node)
        if call is None or not call.aten:
            return False
        q, k, v = (self.values.get(x) for x in (call.q, call.k, call.v))
        if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in (q, k, v)):
            return False
        scale = call.scale if call.scale is not None else q.shape[-1] ** -0.5
        return not scores_bounded(q, k, v, scale)  # (the kernels' own run-time test)

    def _may_overflow(self, node: Node) -> bool:
        """A sum whose terms' magnitudes add up past the float range (summed in another
        order it may overflow where the reference did not, or the other way round, even when
        the result is small: -3.4e38 + 3.8e38 is 4e37, or inf), or far past the result's own
        scale (cancellation: the rounding of the terms is all that is left)."""
        if node.op is Op.BATCH_NORM:
            return self._batch_norm_may_overflow(node)
        if node.op is Op.VAR:
            return self._variance_cancels(node)
        if node.op is Op.LAYER_NORM:
            return self._normalization_amplifies(node)
        if node.op in (Op.ADD, Op.SUB) and node.types[0].dtype.is_floating:
            return self._difference_cancels(node)
        if node.op not in _LINEAR_SUMS or not node.types[0].dtype.is_floating:
            return False
        sums = without_activation(node) or node
        operands = [_magnitude(self.values[v]) for v in node.inputs]
        try:
            with torch.no_grad():
                total = evaluate_node(sums, operands, self.case.graph)[0].abs()
        except Exception:  # noqa: BLE001 - no answer: counted as well-conditioned
            return False
        dtype = node.types[0].dtype.torch
        if bool((total >= torch.finfo(dtype).max).any()):
            return True
        result = self.values[node.out()]
        return _cancels(float(total.nan_to_num(0.0).amax()) if total.numel() else 0.0,
                        result, dtype)

    def _difference_cancels(self, node: Node) -> bool:
        """A sum or difference of two values far larger than itself: m - (m + w) with m near
        1.6e38 is 0 in ATen and -w or 0 in a kernel that contracts m = b*w into an fma (fuzz
        seed 10, graph 7786); what is left is the operands' rounding."""
        a, b = (self.values.get(v) for v in node.inputs[:2])
        if not all(isinstance(t, torch.Tensor) and t.is_floating_point() or
                   isinstance(t, (int, float)) for t in (a, b)):
            return False
        try:
            terms = torch.as_tensor(a).double().abs() + torch.as_tensor(b).double().abs()
        except RuntimeError:  # shapes that do not broadcast: no answer
            return False
        terms = terms[terms.isfinite()]
        if not terms.numel():
            return False
        return _cancels(float(terms.amax()), self.values[node.out()], node.types[0].dtype.torch)

    def _normalization_amplifies(self, node: Node) -> bool:
        """A layer norm of a (nearly) constant row: x - mean is rounding alone, and rstd
        (up to 1/sqrt(eps)) scales it up past the tolerance."""
        x, rstd = self.values[node.inputs[0]], self.values.get(node.out(2))
        if not isinstance(x, torch.Tensor) or not isinstance(rstd, torch.Tensor) or \
                not x.is_floating_point() or not x.numel():
            return False
        finite_x, finite_r = x[x.isfinite()].double().abs(), rstd[rstd.isfinite()].double()
        if not finite_x.numel() or not finite_r.numel():
            return False
        error = 2 * torch.finfo(x.dtype).eps * float(finite_x.amax()) * float(finite_r.amax())
        return error > RTOL[x.dtype]

    def _variance_cancels(self, node: Node) -> bool:
        """A variance far below its values' squared mean: (x - mean)**2 is all rounding."""
        x = self.values[node.inputs[0]]
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or not x.numel():
            return False
        squares = float(x.double().pow(2).nan_to_num(0.0, 0.0, 0.0).amax())
        return _cancels(squares, self.values[node.out()], x.dtype)

    def _batch_norm_may_overflow(self, node: Node) -> bool:
        """ATen's batch norm computes x * a + c (a = w / sqrt(var + eps), c = b - mean * a)
        in one layout and ((x - mean) / sqrt(var + eps)) * w + b in another: where a, mean *
        a or x * a is past the float range, one may overflow where the other does not."""
        x, w, b, mean, var = (_magnitude(self.values[v]) for v in node.inputs)
        eps = node.attrs.eps  # type: ignore[attr-defined]
        with torch.no_grad():
            a = w / torch.sqrt((var if isinstance(var, torch.Tensor) else var) + eps).abs()
            shape = [1, -1] + [1] * (x.dim() - 2) if isinstance(x, torch.Tensor) else [-1]
            worst = torch.stack([a, mean * a]).amax(0).reshape(shape)
            if isinstance(x, torch.Tensor) and x.numel():
                worst = torch.maximum(worst, x.amax(dim=[d for d in range(x.dim()) if d != 1],
                                                    keepdim=True) * a.reshape(shape))
        limit = torch.finfo(node.types[0].dtype.torch).max
        return bool((worst.nan_to_num(nan=0.0) >= limit).any())

    def _amplifies(self, node: Node) -> bool:
        """Does the node turn a rounding error of its input into a large error, at the input
        the reference has? sin and cos of |x| >= 2**10 (an ulp of x is an error of about
        1e-4 in the result), a softmax of logits beyond 2**20 (exp of an ulp of 1e25 is any
        number). The latter is also a kiln bug: the generated row kernel takes the max of
        the rounded prologue x*y but exponentiates the fused fma(x, y, -max), so at 2.7e25
        the largest element's exp is exp(-1.1e16) = 0 and the row 0/0 = NaN (reported; the
        fix belongs to the row schedule)."""
        limit = _AMPLIFYING.get(node.op)
        if limit is None:
            return False
        x = self.values.get(node.inputs[0])
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return False
        finite = x[x.isfinite()]
        return bool(finite.numel()) and float(finite.abs().max()) >= limit

    def _ill_before_activation(self, node: Node, wide: dict[Value, Any]) -> bool:
        """For a contraction with a fused activation: is the sum before the activation
        ill-conditioned (sigmoid turns an overflowed sum's inf and NaN into 1.0 and NaN)?"""
        sums = without_activation(node)
        if sums is None:
            return False
        try:
            with torch.no_grad():
                ref = evaluate_node(sums, [self.values[v] for v in node.inputs], self.case.graph)
                twin = evaluate_node(sums, [wide[v] for v in node.inputs], self.case.graph)
        except Exception:  # noqa: BLE001 - no answer: counted as well-conditioned
            return False
        return ill_conditioned(ref[0], twin[0])


# sums of products: evaluated on magnitudes in float64, they bound every partial sum
_LINEAR_SUMS = frozenset({Op.SUM, Op.MEAN, Op.MM, Op.BMM, Op.ADDMM, Op.ADDMM_ACT,
                          Op.CONVOLUTION, Op.CONV_ACT, Op.AVG_POOL2D, Op.ADAPTIVE_AVG_POOL2D})


def _cancels(terms: float, result: Any, dtype: torch.dtype) -> bool:
    """Is the terms' scale so far above the result's that their rounding (a few ulps each)
    exceeds the comparison's tolerance?"""
    if not isinstance(result, torch.Tensor) or not result.numel():
        return False
    finite = result[result.isfinite()].double().abs()
    scale = float(finite.amax()) if finite.numel() else 0.0
    eps = torch.finfo(dtype).eps
    return 2 * eps * terms > RTOL[dtype] * scale


def _magnitude(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double().abs()
    return abs(value) if isinstance(value, float) else value


_AMPLIFYING = {Op.SIN: 2.0**10, Op.COS: 2.0**10, Op.SOFTMAX: 2.0**20,
               Op.LOG_SOFTMAX: 2.0**20}


def without_activation(node: Node) -> Node | None:
    """The contraction of a conv_act / addmm_act node with an activation, without it."""
    attrs = node.attrs
    if isinstance(attrs, ConvActAttrs) and attrs.activation is not None:
        attrs = dataclasses.replace(attrs, activation=None, act_args=())
        return Node(Op.CONV_ACT, node.inputs, attrs, node.types, node.name)
    if isinstance(attrs, AddmmActAttrs):
        return Node(Op.ADDMM, node.inputs, AddmmAttrs(attrs.beta, attrs.alpha), node.types,
                    node.name)
    return None


def reference(case: Case) -> Reference | str:
    """The interpreter's run on the case's inputs, or why it cannot run them."""
    try:
        values = trace_values(case.graph, case.materialize())
    except Exception as err:  # noqa: BLE001 - ATen rejects the values, whatever the type
        return _describe(err)
    outputs = [values[v] for v in case.graph.outputs]
    outputs = [t.clone() if isinstance(t, torch.Tensor) else t for t in outputs]
    return Reference(case, values, outputs)


def check_case(case: Case, configs: Sequence[Config], cache_dir: str,
               stop_at_first: bool = False, verify: bool = False) -> Outcome:
    """Check ``case`` at each of ``configs``; ``verify`` checks the graph after every pass
    (`kiln.ir.verify`, Options.debug: slower, about half the graphs per second)."""
    outcome = Outcome(case)
    expected = reference(case)
    if isinstance(expected, str):
        outcome.valid, outcome.invalid_reason = False, expected
        return outcome
    gaps = type_gaps(case.graph, expected.values)
    if gaps:  # the IR itself is wrong: no compiled form can be checked against it
        outcome.failures.append(Failure(REFERENCE, Kind.WRONG_TYPE, gaps[0]))
        return outcome
    for config in configs:
        stats = ConfigStats()
        outcome.stats[config.name] = stats
        failure = check_config(case, config, cache_dir, expected, stats, verify)
        if failure is not None:
            outcome.failures.append(failure)
            if stop_at_first:
                break
    return outcome


def check_config(case: Case, config: Config, cache_dir: str, expected: Reference,
                 stats: ConfigStats | None = None, verify: bool = False) -> Failure | None:
    """The first way ``case`` fails at ``config``, or None."""
    stats = stats if stats is not None else ConfigStats()
    options = config.options(cache_dir, verify)
    graph = case.graph
    try:
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled = compile_graph(graph, options, range(len(graph.inputs)))
            rounding = rounding_of(graph, compiled, options, expected.values)
        stats.warnings += [str(w.message) for w in caught if str(w.message).startswith("kiln")]
    except Exception as err:  # noqa: BLE001 - any exception is a finding
        return Failure(config.name, Kind.CRASH, f"compile: {_describe(err)}")
    kinds = [k.kind for k in compiled.report.kernels]
    stats.generated, stats.prepacked = kinds.count("generated"), kinds.count("prepacked")
    strength_of = strengths(graph, rounding)
    inputs = case.materialize()
    before = [x.clone() for x in inputs]
    first = _run(compiled, inputs)
    if isinstance(first, str):
        return Failure(config.name, Kind.CRASH, f"run: {first}")
    if len(first) != len(expected.outputs):
        return Failure(config.name, Kind.MISMATCH,
                       f"{len(first)} outputs, expected {len(expected.outputs)}")
    problem = _compare_outputs(first, expected, strength_of, graph, stats)
    if problem is not None and problem[1] in (Strength.CLOSE, Strength.NEAR):
        # where a rounded node's reference value is ill-conditioned (an overflow inside a
        # float32 sum), what follows it depends on that rounding: not compared
        ill = expected.ill_conditioned(strength_of)
        if ill:
            rounding.fast |= ill
            problem = _compare_outputs(first, expected, strengths(graph, rounding), graph)
    if problem is not None:
        i, strength, text = problem
        return Failure(config.name, Kind.MISMATCH, f"{strength.name.lower()}: {text}", i)
    for i, (x, saved) in enumerate(zip(inputs, before)):
        if not _same(x, saved):
            return Failure(config.name, Kind.WROTE_INPUT, f"input {i} changed")
    kept = [t.clone() if isinstance(t, torch.Tensor) else t for t in first]
    second = _run(compiled, other_values(case).materialize())
    if isinstance(second, str):
        return Failure(config.name, Kind.CRASH, f"second run: {second}")
    for i, (out, saved) in enumerate(zip(first, kept)):
        if isinstance(out, torch.Tensor) and not _same(out, saved):
            return Failure(config.name, Kind.STALE_OUTPUT, f"output {i} changed", i)
    return None


def _compare_outputs(outputs: list[Any], expected: Reference,
                     strength_of: dict[Value, Strength], graph: Graph,
                     stats: ConfigStats | None = None) -> tuple[int, Strength, str] | None:
    """The first output that differs: its position, strength and what differs."""
    wide = None
    for i, (out, ref, value) in enumerate(zip(outputs, expected.outputs, graph.outputs)):
        strength = strength_of[value]
        if stats is not None:
            stats.outputs[strength] += 1
        rtol = rtol_of(graph, value) if strength in (Strength.CLOSE, Strength.NEAR) else 0.0
        problem = compare(out, ref, strength, rtol=rtol)
        if problem is not None and strength in (Strength.CLOSE, Strength.NEAR):
            wide = expected.wide() if wide is None else wide  # ill-conditioned elements?
            problem = compare(out, ref, strength, wide.get(value) if wide else None, rtol)
        if problem is not None:
            return i, strength, problem
    return None


# ops whose result's absolute error is an operand's error times a factor that can be large
_SCALING = frozenset({Op.DIV, Op.MUL, Op.RECIPROCAL, Op.RSQRT, Op.SQRT, Op.LOG, Op.POW})


def _run(compiled: CompiledGraph, inputs: list[torch.Tensor]) -> list[object] | str:
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return list(compiled(list(inputs)))
    except Exception as err:  # noqa: BLE001 - any exception is a finding
        return _describe(err)


def other_values(case: Case) -> Case:
    """The case with every input's values reversed (same types, ranges and layouts)."""
    flipped = tuple(FuzzInput(x.values.flip(list(range(x.values.dim()))), x.layout)
                    for x in case.inputs)
    return dataclasses.replace(case, inputs=flipped)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        return bool(torch.equal(bits(a), bits(b)))
    return bool(torch.equal(a, b))


def _describe(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]
