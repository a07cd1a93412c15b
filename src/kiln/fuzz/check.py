"""Compile a case at each configuration and compare with the reference interpreter.

    outcome = check_case(case, CONFIGS, cache_dir)
    for failure in outcome.failures: print(failure)

Per configuration: compile (with ``verify``, checking the graph after every pass), run on the
case's inputs
in their layouts, compare each output at the strength `kiln.fuzz.exactness` gives it, check
that no input was written, then run again on other values and check that the first results
did not change (an output must never live in a buffer the next call reuses).
A case whose reference run raises (integer division by zero, an index out of range) is not a
test of kiln: it is counted as invalid, never as a failure.
"""

from __future__ import annotations

import dataclasses
import enum
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.engine import CompiledGraph, compile_graph
from kiln.fuzz.case import Case, FuzzInput
from kiln.fuzz.compare import Strength, compare
from kiln.fuzz.exactness import rounding_of, strengths
from kiln.fuzz.reference import trace_values, wide_outputs
from kiln.fuzz.values import bits
from kiln.ir.graph import Value
from kiln.options import Options


@dataclass(frozen=True)
class Config:
    """One way of compiling: an opt level, generated kernels on or off, fast math."""

    name: str
    opt_level: int
    kernels: bool = False  # generated kernels, generated GEMMs and prepacked library kernels
    fast_math: bool = False

    def options(self, cache_dir: str, verify: bool = False) -> Options:
        return Options(opt_level=self.opt_level, debug=verify, fast_math=self.fast_math,
                       generated_kernels=self.kernels, generated_gemm=self.kernels,
                       prepacked_library=self.kernels, measure_kernels=False,
                       kernel_cache_dir=cache_dir)


CONFIGS: tuple[Config, ...] = (
    Config("O0", 0), Config("O1", 1), Config("O2", 2), Config("O3", 3),
    Config("O2+kernels", 2, kernels=True), Config("O3+kernels", 3, kernels=True),
    Config("O2+fast_math", 2, fast_math=True),
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
        return True

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
    _wide: list[Any] | None = None
    _wide_done: bool = False

    def wide(self) -> list[Any] | None:
        if not self._wide_done:
            self._wide = wide_outputs(self.case.graph, self.case.materialize())
            self._wide_done = True
        return self._wide


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
    for i, (out, ref, value) in enumerate(zip(first, expected.outputs, graph.outputs)):
        strength = strength_of[value]
        stats.outputs[strength] += 1
        problem = compare(out, ref, strength)
        if problem is not None and strength in (Strength.CLOSE, Strength.NEAR):
            # ill-conditioned elements?
            wide = expected.wide()
            problem = compare(out, ref, strength, wide[i] if wide is not None else None)
        if problem is not None:
            return Failure(config.name, Kind.MISMATCH, f"{strength.name.lower()}: {problem}", i)
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
