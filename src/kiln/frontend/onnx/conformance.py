"""ONNX's backend node tests (onnx.backend.test.case.node: one small model per op and
variant, with inputs and expected outputs) run through kiln's importer and runtime.

A case is *applicable* when kiln is meant to take it: its opset resolves to one kiln takes
(kiln.frontend.onnx.load.opset_version), its inputs and outputs are plain tensors of element
types torch has, and it does not draw random numbers. It *passes* when kiln's outputs have
the expected types and shapes and values within the case's tolerance (at least two machine
epsilons for 16-bit floats, whose results a different order of operations rounds apart). An
applicable case kiln refuses with OnnxImportError counts as not passing.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kiln.frontend.onnx.errors import OnnxImportError
from kiln.frontend.onnx.load import opset_version
from kiln.frontend.onnx.types import from_numpy, to_numpy, torch_dtype
from kiln.options import Options


class Outcome(enum.Enum):
    PASS = "pass"
    WRONG = "wrong"  # ran, and an output differs: the one outcome that must never happen
    REFUSED = "refused"  # OnnxImportError: a clear refusal
    CRASH = "crash"  # any other exception
    NOT_APPLICABLE = "n/a"


@dataclass(frozen=True)
class Result:
    name: str
    outcome: Outcome
    detail: str = ""
    # ONNX ops of the nodes that ran as they are (by onnx.reference, which defines the
    # expected outputs): a pass with none is kiln's own translation throughout
    run_as_is: tuple[str, ...] = ()


def node_cases() -> list[Any]:
    """All of onnx's node test cases (built in memory by onnx's own generators, ~5 s)."""
    import onnx.backend.test.case.node as node_tests

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return list(node_tests.collect_testcases(None))


def not_applicable(case: Any) -> str:
    """Why kiln does not take this case, or '' if it does."""
    model = case.model
    try:
        opset_version(model)
    except OnnxImportError as err:
        return f"opset: {err}"
    for value in [*model.graph.input, *model.graph.output]:
        if not value.type.HasField("tensor_type"):
            return f"{value.name} is not a tensor"
        try:
            torch_dtype(value.type.tensor_type.elem_type)
        except OnnxImportError as err:
            return str(err)
    ops = {n.op_type for n in model.graph.node}
    if ops & {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
              "Multinomial", "Bernoulli"}:
        return "random"
    graph_inputs = {v.name for v in model.graph.input}
    if any(n.op_type == "Dropout" and len(n.input) > 2 and n.input[2] in graph_inputs
           for n in model.graph.node):
        return "random: Dropout with training_mode given at run time"
    return ""


def run_case(case: Any, options: Options | None = None) -> Result:
    from kiln.frontend.onnx.importer import compile_onnx

    why = not_applicable(case)
    if why:
        return Result(case.name, Outcome.NOT_APPLICABLE, why)
    options = options or Options(opt_level=1)
    inputs, expected = case.data_sets[0]
    try:
        tensors = [from_numpy(np.asarray(x)) for x in inputs]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = compile_onnx(case.model, tensors, options)
            got = compiled(*tensors)
    except OnnxImportError as err:
        return Result(case.name, Outcome.REFUSED, str(err))
    except Exception as err:  # noqa: BLE001 - a crash is what this counts
        return Result(case.name, Outcome.CRASH, f"{type(err).__name__}: {err}"[:300])
    got = list(got) if isinstance(got, tuple) else [got]
    mismatch = compare(got, expected, case.rtol, case.atol)
    as_is = tuple(sorted({op.removeprefix("onnx::") for g in compiled.report.graphs
                          for op in g.opaque_ops if op.startswith("onnx::")}))
    return Result(case.name, Outcome.WRONG if mismatch else Outcome.PASS, mismatch, as_is)


def compare(got: Sequence[torch.Tensor], expected: Sequence[Any], rtol: float,
            atol: float) -> str:
    """'' when every output has the expected type, shape and values; else what differs."""
    if len(got) != len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        e = np.asarray(e)
        g_np = to_numpy(g)
        if g_np.dtype != e.dtype or g_np.shape != e.shape:
            return f"output {i}: {g_np.dtype}{list(g_np.shape)}, expected {e.dtype}" \
                   f"{list(e.shape)}"
        if e.dtype.kind in "fc" or str(e.dtype) == "bfloat16":
            a, b = g_np.astype(np.float64), e.astype(np.float64)
            eps = _EPS.get(str(e.dtype), 0.0)  # a few roundings apart in 16 bits
            close = np.isclose(a, b, rtol=max(rtol, 2 * eps), atol=max(atol, 2 * eps),
                               equal_nan=True)
        else:
            close = g_np == e
        if not close.all():
            return f"output {i}: {int((~close).sum())} of {close.size} values differ"
    return ""


_EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}  # the machine epsilon of 16-bit floats


def summarize(results: Iterable[Result]) -> dict[Outcome, int]:
    counts = dict.fromkeys(Outcome, 0)
    for r in results:
        counts[r.outcome] += 1
    return counts
