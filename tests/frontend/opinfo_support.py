"""PyTorch's OpInfo samples through both kiln frontends, compared with eager.

Used by test_opinfo.py, and runnable on its own to count outcomes for a report:

    python tests/frontend/opinfo_support.py --dtype float32 --frontend export [--all-samples]

Each sample becomes a small module whose tensor arguments are its inputs (the sample's other
arguments are baked in), compiled with ``torch.compile(backend="kiln")`` ("dynamo") or
``kiln.compile`` ("export"), and run with the same random seed as eager, so ops that draw
random numbers must match too: kiln runs the same ATen random ops in the same order. The seed
is 42 because OpInfo wraps its random ops in ``wrapper_set_seed``, which calls
``torch.manual_seed(42)`` inside the op; torch.export does not record that call.
"""

from __future__ import annotations

import argparse
import collections
import enum
import functools
import logging
import random
import re
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy
import torch
import torch.utils._pytree as pytree
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import SEED as OPINFO_SEED
from torch.testing._internal.opinfo.core import OpInfo, SampleInput

import kiln
from kiln.frontend.aten import CONVERTERS
from kiln.frontend.dynamo import kiln_backend
from kiln.report import CompileReport

FRONTENDS = ("dynamo", "export")
SEED = 42
OPTIONS = kiln.Options(measure_kernels=False)  # every checked generated kernel is used

# Ops whose outputs are undefined (uninitialized memory): nothing to compare.
UNDEFINED_OUTPUT = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                    "new_empty_strided"}

# Cases not run, each with the reason.
SKIPS: dict[tuple[str, str], str] = {
    # (op name, frontend) -> why
    ("broadcast_shapes", "export"): "returns a torch.Size and no tensor; torch.export's output "
                                    "spec rebuilds it as a plain tuple before kiln sees it",
}


class Outcome(enum.Enum):
    COMPILED = "compiled"  # kiln compiled every graph, results match eager
    FALLBACK = "fallback"  # part of it ran eagerly, for a reason listed in FALLBACK_REASONS
    NO_GRAPH = "no graph"  # Dynamo captured nothing (no tensor op): kiln never saw it


# Why a graph may run eagerly (matched against the fallback message), and the reason it is
# right that it does. Any other fallback fails the test.
FALLBACK_REASONS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), reason) for pattern, reason in (
        (r"dtype torch\.complex\d+ is not supported",
         "kiln's IR has no complex dtypes; such a graph runs as captured"),
        (r"dtype torch\.uint(16|32|64) is not supported",
         "kiln's IR has no uint16/32/64 (ATen's own support for them is partial)"),
        (r"dtype torch\.sparse_\w+ tensor is not supported",
         "kiln's IR holds dense strided tensors only"),
        (r"symbolic shapes must be specialized",
         "the output shape depends on the data (nonzero, unique, masked_select): kiln "
         "compiles static shapes only"),
        (r"kiln compiles sizes known before the run; \w+(, \w+)* depends on the data",
         "kiln.compile: torch.export's graph has a size or number known only at run time "
         "(nonzero, masked_select, .item()); it is compiled through torch.compile instead, "
         "which runs that op between the graphs kiln compiles"),
        (r"result [uz]uf?\d+ is not a tensor at node '_local_scalar_dense'",
         "a tensor read back as a Python number (.item(), tensor_split by a tensor) is a "
         "data-dependent value: the graph runs as captured"),
        (r"the model writes into its buffers or inputs",
         "torch.export: an in-place update of an input (cauchy_, normal_ on a tensor) or "
         "batch norm's running statistics in training; kiln.compile takes it through "
         "torch.compile instead, which handles the mutation outside the graph"),
        (r"Constant \w+ is mutated in the forward method",
         "torch.export refuses a function that mutates a constant it lifted (instance_norm's "
         "running statistics); kiln.compile takes it through torch.compile instead"),
        (r"(DataDependentOutputException|DynamicOutputShapeException|"
         r"GuardOnDataDependentSymNode)",
         "torch.export cannot capture data-dependent control flow or output shapes; "
         "kiln.compile takes the model through torch.compile instead"),
    ))


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    detail: str = ""  # the fallback's reason
    generated_kernels: int = 0


class Mismatch(AssertionError):
    pass


class _Sample(torch.nn.Module):
    """The sample as a module of its tensor arguments; the others are baked in."""

    def __init__(self, op: OpInfo, sample: SampleInput) -> None:
        super().__init__()
        leaves, self.spec = pytree.tree_flatten((sample.input, *sample.args))
        self.fixed = [None if isinstance(leaf, torch.Tensor) else (leaf,) for leaf in leaves]
        self.tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        self.op = op.op
        self.kwargs = sample.kwargs

    def forward(self, *tensors: torch.Tensor) -> Any:
        given = iter(tensors)
        leaves = [next(given) if fixed is None else fixed[0] for fixed in self.fixed]
        return self.op(*pytree.tree_unflatten(leaves, self.spec), **self.kwargs)


def ops_for(dtype: torch.dtype) -> list[OpInfo]:
    return [op for op in op_db if dtype in op.supported_dtypes("cpu")
            and op.name not in UNDEFINED_OUTPUT]


@functools.cache
def _converted_names() -> frozenset[str]:
    return frozenset(overload.overloadpacket.__name__ for overload in CONVERTERS)


def kiln_converts(op: OpInfo) -> bool:
    """kiln has a converter for the ATen op of this name (it may still keep a call)."""
    return (op.aten_name or op.name) in _converted_names()


def samples(op: OpInfo, dtype: torch.dtype, every: bool) -> Iterator[SampleInput]:
    """The op's samples (only the first unless ``every``), as ``op.sample_inputs`` gives them:
    the generator seeded before each sample as its iterator does (torch's `SEED`, Python's and
    numpy's too). Not through that iterator: it looks for a unittest test up the stack
    (``inspect.stack()``, about 0.1 s under pytest), and seeds through ``torch.manual_seed``,
    which records a stack trace for CUDA's lazy seeding (3 ms a call): two thirds of this
    file's time, when the first sample was taken from the whole list."""
    found = iter(op.sample_inputs_func(op, "cpu", dtype, False))
    while True:
        _seed(OPINFO_SEED)
        sample = next(found, None)
        if sample is None:
            return
        yield sample
        if not every:
            return


def _seed(seed: int) -> None:
    """`torch.testing._internal.common_utils.set_rng_seed` without CUDA's lazy seeding."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    numpy.random.seed(seed)


def run_case(op: OpInfo, sample: SampleInput, frontend: str) -> Result | None:
    """Compile the sample, run it, compare with eager; None if eager itself raises."""
    module = _Sample(op, sample)
    tensors = module.tensors
    try:
        torch.default_generator.manual_seed(SEED)  # (torch.manual_seed: see `samples`)
        expected = module(*tensors)
    except Exception:  # noqa: BLE001 - OpInfo samples that error in eager test error paths
        return None
    report = CompileReport()
    torch._dynamo.reset()
    if frontend == "dynamo":
        backend = functools.partial(kiln_backend, options=OPTIONS, report=report)
        compiled = torch.compile(module, backend=backend)
        compiled(*tensors)  # compiles; the compile itself must not draw random numbers
    else:
        compiled = kiln.compile(module, tensors, OPTIONS)
        report = compiled.report
    torch.default_generator.manual_seed(SEED)  # (torch.manual_seed: see `samples`)
    got = compiled(*tensors)
    try:
        _compare(got, expected)
    except AssertionError:
        if not any(t.dtype in REDUCED for t in tensors):
            raise
        _compare_reduced(module, tensors, got, expected)
    generated = sum(1 for g in report.graphs for k in g.kernels if k.kind == "generated")
    if report.fallbacks:
        return Result(Outcome.FALLBACK, _allowed(report.fallbacks), generated)
    if not report.graphs:
        return Result(Outcome.NO_GRAPH)
    return Result(Outcome.COMPILED, generated_kernels=generated)


def _allowed(fallbacks: list[str]) -> str:
    reasons = []
    for message in fallbacks:
        reason = next((r for pattern, r in FALLBACK_REASONS if pattern.search(message)), None)
        if reason is None:
            raise Mismatch(f"kiln fell back to eager for no listed reason: {message}")
        reasons.append(reason)
    return "; ".join(dict.fromkeys(reasons))


def _compare(got: Any, expected: Any) -> None:
    got_leaves, got_spec = pytree.tree_flatten(got)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    if got_spec != expected_spec:
        raise Mismatch(f"result structure {got_spec} differs from eager's {expected_spec}")
    for g, e in zip(got_leaves, expected_leaves):
        if type(g) is not type(e) and not (isinstance(g, torch.Tensor)
                                            and isinstance(e, torch.Tensor)):
            raise Mismatch(f"result {type(g).__name__} where eager gives {type(e).__name__}")
    torch.testing.assert_close(got, expected, equal_nan=True)


REDUCED = (torch.bfloat16, torch.float16)


def _compare_reduced(module: _Sample, tensors: list[torch.Tensor], got: Any,
                     expected: Any) -> None:
    """In bfloat16 the captured graph's decompositions round their intermediates
    (logit becomes log(x / (1 - x)), three roundings), so kiln and eager may differ by a few
    units in the last place. There kiln must be as close to a float64 run as eager is."""
    wide = [t.double() if t.dtype in REDUCED else t for t in tensors]
    torch.default_generator.manual_seed(SEED)  # (torch.manual_seed: see `samples`)
    reference = pytree.tree_leaves(module(*wide))
    for g, e, r in zip(pytree.tree_leaves(got), pytree.tree_leaves(expected), reference):
        if not isinstance(g, torch.Tensor) or g.dtype not in REDUCED:
            torch.testing.assert_close(g, e, equal_nan=True)
            continue
        torch.testing.assert_close(g.isnan(), e.isnan())
        ulp = torch.finfo(g.dtype).eps * r.abs().clamp_min(1.0)
        kiln_error = ((g.double() - r).abs() - ulp).nan_to_num(0.0).max()
        eager_error = (e.double() - r).abs().nan_to_num(0.0).max()
        if kiln_error > eager_error:
            raise Mismatch(f"{g.dtype}: kiln is {kiln_error + ulp.max():.3g} from a float64 "
                           f"run, eager {eager_error:.3g}")


def _summary(dtype: torch.dtype, frontend: str, every: bool) -> None:
    counts: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    failures = []
    start = time.perf_counter()
    for op in ops_for(dtype):
        if (op.name, frontend) in SKIPS:
            counts["skipped"] += 1
            continue
        for i, sample in enumerate(samples(op, dtype, every)):
            try:
                result = run_case(op, sample, frontend)
            except Exception as err:  # noqa: BLE001 - counted and listed
                counts["fail"] += 1
                failures.append(f"{op.name}[{i}]: {type(err).__name__}: "
                                f"{str(err).splitlines()[0] if str(err) else ''}")
                continue
            if result is None:
                counts["eager raises"] += 1
                continue
            counts[result.outcome.value] += 1
            counts["with generated kernels"] += result.generated_kernels > 0
            if result.detail:
                reasons[result.detail] += 1
    seconds = time.perf_counter() - start
    print(f"{frontend} {str(dtype).removeprefix('torch.')}: {dict(counts)} in {seconds:.0f} s")
    for reason, n in reasons.most_common():
        print(f"  fallback x{n}: {reason}")
    for line in failures:
        print(f"  FAIL {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--frontend", choices=FRONTENDS, default="dynamo")
    parser.add_argument("--all-samples", action="store_true")
    args = parser.parse_args()
    logging.getLogger("kiln").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    _summary(getattr(torch, args.dtype), args.frontend, args.all_samples)


if __name__ == "__main__":
    sys.exit(main())
