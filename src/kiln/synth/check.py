"""Checking a law: proofs where the prover has them, runs where it has not, and the safety
tag the evidence supports.

    verdict = check_law(rule.laws[0], rule)
    verdict.status     # proven | checked | refuted | unknown
    verdict.evidence   # the strongest tag the evidence supports: exact, ieee, fast_math, None

The evidence, in the order it is gathered:

1. **Instances.** Small shapes on which the source type-checks and, for a hand-written rule,
   on which the rule itself fires (its pattern and guard; weights are constants).
2. **Real arithmetic** (`kiln.synth.prove.prove_real`): src = dst proven by z3 (for every
   shape by the axioms, or on the instances' shapes), refuted with a counterexample, or
   unknown. Where z3 has no model of an op, random finite inputs decide ("checked").
3. **Bit-identity**, for laws tagged exact: z3's floating-point theory on scalar instances
   (`prove_exact`), and always a run on the instances with random and special inputs
   (NaN, ±inf, ±0, subnormals, values near the float range), compared bit for bit.
4. **IEEE behaviour**, for laws tagged exact or ieee: the special-input run must put NaN,
   ±inf and signed zeros in the same places on both sides, finite values close. Elements
   where either side overflowed or underflowed an intermediate are left out: there the
   side's float32 value and its float64 twin's disagree on being NaN, ±inf or finite
   (the fuzzer's ill-conditioned elements). So `ieee` promises that NaN, ±inf and ±0 coming
   from the inputs behave the same; where the float range ends moves with the arithmetic.
   Moving a scale into a contraction (conv-bn, (a@b)*s -> (a*s)@b) is ieee in this sense:
   a*s may overflow where (a@b)*s does not, and that element is then left out.

A law is *refuted* when the real-number check fails, or when its declared tag is stronger
than the evidence and the evidence contradicts it (a counterexample, not a missing proof).
Weights (`(weight ?w)`) are drawn finite: folding a non-finite weight is the fold pass's
concern, not the law's.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kiln.ir.infer import InferenceError
from kiln.ir.interp import interpret
from kiln.ir.types import DType, TensorType
from kiln.rewrite.law import EXACT, FAST_MATH, IEEE, Law, Safety
from kiln.rewrite.rule import Rule
from kiln.synth.instance import (
    Built,
    LawError,
    build,
    find_instances,
    rule_fires,
    sample_weights,
    type_errors,
    weight_names,
)
from kiln.synth.prove import Proof, ProofStatus, prove_exact, prove_real

TRIALS = 6  # random input sets per instance, half of them with special values
STRENGTH = {FAST_MATH: 1, IEEE: 2, EXACT: 3}


class Status(enum.Enum):
    PROVEN = "proven"  # z3 proved it in reals, and its tag's evidence holds
    CHECKED = "checked"  # no proof; the runs on random and special inputs agree
    REFUTED = "refuted"  # a counterexample to the law, or to its tag
    UNKNOWN = "unknown"  # neither: no instance found, or z3 gave up and runs were impossible


@dataclass(frozen=True)
class Verdict:
    law: Law
    status: Status
    evidence: Safety | None
    method: str = ""
    detail: str = ""  # the counterexample, or why unknown
    seconds: float = 0.0
    proofs: tuple[Proof, ...] = field(default=(), compare=False)

    @property
    def tag_ok(self) -> bool:
        return self.evidence is not None and \
            STRENGTH[self.evidence] >= STRENGTH[self.law.safety]


def check_law(law: Law, rule: Rule | None = None, time_limit_s: float = 10.0,
              seed: int = 0) -> Verdict:
    start = time.perf_counter()
    accept = None if rule is None else (lambda built: rule_fires(rule, built))
    try:
        builts = find_instances(law, count=3, seed=seed, accept=accept)
    except LawError as err:
        return Verdict(law, Status.UNKNOWN, None, detail=str(err),
                       seconds=time.perf_counter() - start)
    if not builts:
        why = "no small shapes found on which the source type-checks" + \
            (f" and rule {rule.name} fires" if rule else "")
        return Verdict(law, Status.UNKNOWN, None, detail=why,
                       seconds=time.perf_counter() - start)
    errors = type_errors(law, builts)
    if errors:
        return Verdict(law, Status.REFUTED, None, "types", f"the sides' types differ {errors[0]}",
                       time.perf_counter() - start)
    instances = [b.instance for b in builts]
    real = _guarded(lambda: prove_real(law, instances, time_limit_s))
    runs = _Runs(law, builts, seed)
    proofs: list[Proof] = [real]
    exact = None
    if law.safety is EXACT:
        exact = _guarded(lambda: prove_exact(law, time_limit_s))
        proofs.append(exact)
    verdict = _judge(law, real, exact, runs)
    return Verdict(law, verdict[0], verdict[1], verdict[2], verdict[3],
                   time.perf_counter() - start, tuple(proofs))


def _guarded(prove: Callable[[], Proof]) -> Proof:
    """A prover that fails on a law leaves it unknown (the runs still decide), with why."""
    try:
        return prove()
    except Exception as err:  # noqa: BLE001 - z3 and the encoders raise many kinds
        return Proof(ProofStatus.UNKNOWN, "z3", f"the prover failed: {type(err).__name__}: "
                     f"{str(err).splitlines()[0] if str(err) else ''}")


def _judge(law: Law, real: Proof, exact: Proof | None, runs: _Runs
           ) -> tuple[Status, Safety | None, str, str]:
    """(status, evidence, method, detail) from the proofs and the runs."""
    if real.status is ProofStatus.REFUTED:
        return Status.REFUTED, None, real.method, real.detail
    if runs.real_mismatch:
        return Status.REFUTED, None, "random inputs", runs.real_mismatch
    if not runs.ran and real.status is not ProofStatus.PROVEN:
        return Status.UNKNOWN, None, real.method, real.detail or runs.skipped
    proven = real.status is ProofStatus.PROVEN
    method = real.method if proven else "random inputs"
    evidence: Safety = FAST_MATH
    if not runs.ieee_mismatch:
        evidence = IEEE
        exact_refuted = exact is not None and exact.status is ProofStatus.REFUTED
        if not runs.bit_mismatch and not exact_refuted:
            evidence = EXACT
    if STRENGTH[evidence] < STRENGTH[law.safety]:
        contradiction = _contradiction(law.safety, exact, runs)
        return Status.REFUTED, evidence, method, f"tagged {law.safety.value}: {contradiction}"
    if exact is not None and exact.status is ProofStatus.PROVEN:
        method += f"; bit-identical: {exact.method}"
    elif evidence is EXACT and law.safety is EXACT:
        why = f"z3 float32: {exact.status.value}" if exact is not None else "no proof"
        method += f"; bit-identical on {runs.ran} runs ({why})"
    if law.safety is IEEE and evidence is not FAST_MATH:
        method += f"; special values agree on {runs.ran // 2} runs"
    status = Status.PROVEN if proven else Status.CHECKED
    return status, evidence, method, "" if proven else real.detail


def _contradiction(safety: Safety, exact: Proof | None, runs: _Runs) -> str:
    if safety is EXACT and exact is not None and exact.status is ProofStatus.REFUTED:
        return f"not bit-identical ({exact.method}): {exact.detail}"
    if safety is EXACT and runs.bit_mismatch:
        return f"not bit-identical: {runs.bit_mismatch}"
    return f"special values differ: {runs.ieee_mismatch}"


# --- runs on random and special inputs -----------------------------------------------------

SPECIALS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-40, -1e-40, 3e38, -3e38, 1.0, -1.0,
            0.5, 2.0)


class _Runs:
    """Both sides run by the reference interpreter on random and special inputs."""

    def __init__(self, law: Law, builts: list[Built], seed: int) -> None:
        self.ran = 0
        self.skipped = ""
        self.real_mismatch = ""
        self.ieee_mismatch = ""
        self.bit_mismatch = ""
        gen = torch.Generator().manual_seed(seed)
        weights = weight_names(law)
        for built in builts:
            for trial in range(TRIALS):
                special = trial % 2 == 1
                self._run(law, built, gen, special, weights)

    def _run(self, law: Law, built: Built, gen: torch.Generator, special: bool,
             weights: frozenset[str]) -> None:
        values = sample_weights(law, built.instance, gen)
        try:
            full = build(law, built.instance, weights=values)
        except (InferenceError, LawError) as err:
            self.skipped = str(err).splitlines()[0]
            return
        inputs = [random_input(node.type, gen, special) for node in full.src.inputs]
        try:
            src = interpret(full.src, inputs)
            dst = interpret(full.dst, inputs)
            wide = _widened_runs(law, built, values, inputs) if special else None
        except RuntimeError as err:
            self.skipped = f"a side does not run: {str(err).splitlines()[0]}"
            return
        self.ran += 1
        shown = _show_inputs(full.src, inputs) if not self.real_mismatch else ""
        for i, (a, b) in enumerate(zip(src, dst)):
            if not special and not self.real_mismatch and not _close(a, b):
                self.real_mismatch = f"{shown}: src {_brief(a)}, dst {_brief(b)}"
            if special and not self.ieee_mismatch:
                rounding = ill_conditioned(a, wide[0][i]) | ill_conditioned(b, wide[1][i]) \
                    if wide else None
                why = ieee_difference(a, b, rounding)
                if why:
                    self.ieee_mismatch = f"{why} on {_show_inputs(full.src, inputs)}"
            if not self.bit_mismatch and not bit_identical(a, b):
                self.bit_mismatch = f"{_first_bit_difference(a, b)} on " \
                    f"{_show_inputs(full.src, inputs)}"


def random_input(type_, gen: torch.Generator, special: bool) -> torch.Tensor:  # noqa: ANN001
    """A random tensor of ``type_``; with ``special``, most elements drawn from `SPECIALS`."""
    shape, dtype = type_.shape, type_.dtype.torch
    if not type_.dtype.is_floating:
        return torch.randint(-5, 6, shape, generator=gen).to(dtype)
    values = torch.randn(shape, generator=gen, dtype=torch.float64)
    if special:
        pick = torch.randint(0, len(SPECIALS) + 3, shape, generator=gen)
        table = torch.tensor(SPECIALS + (0.3, -1.7, 4.2), dtype=torch.float64)
        values = torch.where(pick < len(SPECIALS), table[pick], values)
    return values.to(dtype)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    return bool(torch.isclose(a.double(), b.double(), rtol=1e-4, atol=1e-5,
                              equal_nan=True).all())


def _widened_runs(law: Law, built: Built, weights: dict[str, torch.Tensor],
                  inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Both sides in float64 on the same values: where a float32 side's NaN/inf class differs
    from its float64 twin's, an intermediate overflowed, which is rounding, not IEEE
    behaviour (the fuzzer's ill-conditioned elements, `kiln.fuzz.reference`)."""
    tensors = {k: TensorType(t.shape, DType.F64) if t.dtype is DType.F32 else t
               for k, t in built.instance.tensors.items()}
    wide = dataclasses.replace(built.instance, tensors=tensors)
    full = build(law, wide, weights={k: _widen(v) for k, v in weights.items()})
    wide_inputs = [_widen(x) for x in inputs]
    return interpret(full.src, wide_inputs), interpret(full.dst, wide_inputs)


def _widen(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.dtype == torch.float32 else t


def ill_conditioned(narrow: torch.Tensor, wide: torch.Tensor) -> torch.Tensor:
    """Elements on which a side's float32 value and its float64 twin's disagree on being
    NaN, +inf, -inf or finite: an intermediate overflowed there (as the fuzzer defines it)."""
    if not narrow.is_floating_point() or narrow.shape != wide.shape:
        return torch.zeros(narrow.shape, dtype=torch.bool)
    rounded = wide.to(narrow.dtype)
    return (narrow.isnan() != rounded.isnan()) | (narrow.isposinf() != rounded.isposinf()) \
        | (narrow.isneginf() != rounded.isneginf())


def ieee_difference(a: torch.Tensor, b: torch.Tensor,
                     rounding: torch.Tensor | None = None) -> str:
    """Where NaN, ±inf or zero signs differ, or finite values by more than rounding, outside
    the ``rounding`` mask (elements where an intermediate overflowed); "" when they agree."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"src is {a.dtype}{list(a.shape)}, dst {b.dtype}{list(b.shape)}"
    if not a.is_floating_point():
        return "" if torch.equal(a, b) else "integer results differ"
    if rounding is not None:  # compare where neither side overflowed an intermediate
        keep = ~rounding
        a, b = a[keep], b[keep]
    for name, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        if not torch.equal(test(a), test(b)):
            at = (test(a) != test(b)).nonzero()[0].tolist()
            return f"{name} positions differ (at {at}: src {a[tuple(at)].item()}, " \
                f"dst {b[tuple(at)].item()})"
    zeros = (a == 0) & (b == 0)
    if not torch.equal(torch.signbit(a)[zeros], torch.signbit(b)[zeros]):
        return "signs of zero differ"
    finite = a.isfinite() & b.isfinite()
    if not torch.isclose(a[finite].double(), b[finite].double(), rtol=1e-3, atol=1e-5).all():
        return "finite values differ by more than rounding"
    return ""


def bit_identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape and dtype, and every element the same bits or NaN on both sides."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    both_nan = a.isnan() & b.isnan()
    same_bits = _bits(a) == _bits(b)
    return bool((both_nan | same_bits).all())


def _bits(t: torch.Tensor) -> torch.Tensor:
    view = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
            torch.bfloat16: torch.int16}[t.dtype]
    return t.contiguous().view(view)


def _first_bit_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"src is {a.dtype}{list(a.shape)}, dst {b.dtype}{list(b.shape)}"
    differ = ~((a.isnan() & b.isnan()) | (_bits(a) == _bits(b)))
    at = tuple(differ.nonzero()[0].tolist())
    return f"at {list(at)}: src {a[at].item()!r}, dst {b[at].item()!r}"


def _brief(t: torch.Tensor) -> str:
    flat = t.reshape(-1)[:4].tolist()
    return f"{[round(v, 6) if isinstance(v, float) else v for v in flat]}" + \
        ("..." if t.numel() > 4 else "")


def _show_inputs(graph, inputs: list[torch.Tensor]) -> str:  # noqa: ANN001
    parts = []
    for node, t in zip(graph.inputs, inputs):
        parts.append(f"{node.name} = {_brief(t)}")
    return ", ".join(parts) or "no inputs"
