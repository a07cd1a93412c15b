"""ONNX model -> kiln Graph, and ``kiln.compile`` of an ONNX model.

    imported = import_onnx("model.onnx", shapes={"input_ids": (1, 128)})
    imported.graph             # kiln ir.Graph: initializers are constants, shapes static
    compiled = compile_onnx("model.onnx")   # kiln.compile(path) comes here
    y = compiled(x)            # torch tensors or numpy arrays in, torch tensors out

The path: load and check (load.py) -> specialize the input shapes -> run the graph once at
import (interpret.py: fold what is known, choose each node's translation) -> torch.export of
the resulting module, lowered to core ATen -> the ATen importer shared with the PyTorch
frontends. Passes, kernels and the runtime are the same as for a PyTorch model.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

import onnx
from kiln.engine import compile_graph
from kiln.frontend.export import CompiledModel, InputSpec
from kiln.frontend.importer import ImportedGraph, UnsupportedGraph, fill_outputs, import_fx
from kiln.frontend.onnx.errors import OnnxImportError
from kiln.frontend.onnx.interpret import OnnxProgram, Plan, plan_graph
from kiln.frontend.onnx.load import MAX_TENSOR_BYTES, load_onnx, opset_version
from kiln.frontend.onnx.types import torch_dtype
from kiln.options import Options
from kiln.report import CompileReport

log = logging.getLogger("kiln")

Source = str | os.PathLike[str] | onnx.ModelProto
INT_INPUT_BOUND = 2  # random integer inputs lie in [0, 2): valid token ids, masks and indices


@dataclass(frozen=True)
class InputSlot:
    """One graph input: its name, element type and declared dims (a name where dynamic)."""

    name: str
    dtype: torch.dtype
    dims: tuple[int | str, ...]

    def specialized(self, shapes: Mapping[str, Sequence[int]]) -> tuple[int, ...]:
        if self.name in shapes:
            shape = tuple(int(d) for d in shapes[self.name])
            if len(shape) != len(self.dims) or any(
                    isinstance(d, int) and d != s for d, s in zip(self.dims, shape)):
                raise OnnxImportError(f"shape {list(shape)} given for input '{self.name}' "
                                      f"does not fit its declared dims {list(self.dims)}")
            return shape
        dynamic = [d for d in self.dims if not isinstance(d, int)]
        if dynamic:
            raise OnnxImportError(
                f"input '{self.name}' has dynamic dims {list(self.dims)}; kiln specializes "
                f"them: pass shapes={{'{self.name}': (...)}} (CLI: --shape {self.name}=1x128) "
                f"or example inputs")
        return tuple(int(d) for d in self.dims)


@dataclass
class ImportedOnnx:
    """An ONNX model imported at fixed input shapes."""

    model: onnx.ModelProto
    inputs: tuple[InputSlot, ...]
    shapes: dict[str, tuple[int, ...]]  # the specialized input shapes
    plan: Plan
    gm: torch.fx.GraphModule  # captured in core ATen: (*weights, *inputs) -> outputs
    frozen: dict[int, tuple[str, torch.Tensor]]  # the weights, by placeholder position
    imported: ImportedGraph | None  # None where kiln's IR cannot hold the graph
    why_not: str = ""  # why ``imported`` is None

    @property
    def graph(self) -> Any:
        if self.imported is None:
            raise OnnxImportError(f"kiln's IR cannot hold this model's graph: {self.why_not}")
        return self.imported.graph

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self.plan.output_names)

    @property
    def opaque_ops(self) -> list[str]:
        """ONNX op types of the nodes that run as they are (onnxruntime / onnx.reference)."""
        return self.plan.opaque_ops

    def example_inputs(self, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Random inputs of the specialized shapes: floats normal, integers in
        [0, INT_INPUT_BOUND), booleans either."""
        generator = torch.Generator().manual_seed(seed)
        return tuple(_random(self.shapes[s.name], s.dtype, generator) for s in self.inputs)


def _random(shape: tuple[int, ...], dtype: torch.dtype,
            generator: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    return torch.randint(0, INT_INPUT_BOUND, shape, generator=generator).to(dtype)


def parse_shapes(texts: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``["input_ids=1x128", "mask=1x128"]`` (the CLI's ``--shape``) -> ``shapes=``; a scalar
    input is ``name=`` with nothing after the sign."""
    shapes: dict[str, tuple[int, ...]] = {}
    for text in texts:
        name, sign, dims = text.partition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x")) if dims.strip() else ()
        except ValueError:
            shape = (-1,)
        if not sign or not name or any(d < 0 for d in shape):
            raise OnnxImportError(f"--shape {text!r}: write NAME=DIMS, dims joined by x, as "
                                  f"input_ids=1x128")
        shapes[name] = shape
    return shapes


def input_slots(model: onnx.ModelProto) -> tuple[InputSlot, ...]:
    initialized = {t.name for t in model.graph.initializer}
    slots = []
    for value in model.graph.input:
        if value.name in initialized:
            continue  # an input with a default: kiln takes the initializer as a constant
        if not value.type.HasField("tensor_type"):
            raise OnnxImportError(f"input '{value.name}' is not a tensor (sequences, maps "
                                  f"and optionals are not supported)")
        t = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                     for d in t.shape.dim)
        if not t.HasField("shape"):
            raise OnnxImportError(f"input '{value.name}' declares no rank; kiln needs one")
        slots.append(InputSlot(value.name, torch_dtype(t.elem_type), dims))
    return tuple(slots)


def import_onnx(source: Source, *, shapes: Mapping[str, Sequence[int]] | None = None,
                example_inputs: Sequence[Any] | None = None,
                max_tensor_bytes: int = MAX_TENSOR_BYTES) -> ImportedOnnx:
    """Import at the shapes ``shapes`` names, else the example inputs', else the declared
    ones (dynamic dims must be given one way or the other)."""
    model = load_onnx(source, max_tensor_bytes=max_tensor_bytes)
    opset = opset_version(model)
    slots = input_slots(model)
    values = _example_values(slots, example_inputs, shapes or {}, max_tensor_bytes)
    plan = plan_graph(model, opset, values, max_tensor_bytes)
    program = OnnxProgram(plan)
    weights = program.weights()
    gm = _capture(program, (*weights, *values.values()))
    frozen = {i: (name, t) for i, (name, t) in enumerate(zip(program.weight_names, weights))}
    try:
        imported: ImportedGraph | None = import_fx(gm, frozen)
        why_not = ""
    except UnsupportedGraph as err:
        imported, why_not = None, str(err)
    return ImportedOnnx(model, slots, {k: tuple(v.shape) for k, v in values.items()}, plan,
                        gm, frozen, imported, why_not)


def _example_values(slots: Sequence[InputSlot], example_inputs: Sequence[Any] | None,
                    shapes: Mapping[str, Sequence[int]],
                    limit: int) -> dict[str, torch.Tensor]:
    unknown = set(shapes) - {s.name for s in slots}
    if unknown:
        raise OnnxImportError(f"shapes names {sorted(unknown)}, which are not inputs of the "
                              f"model (its inputs: {[s.name for s in slots]})")
    if example_inputs is not None:
        tensors = [as_tensor(x, f"example input {i}") for i, x in enumerate(example_inputs)]
        if len(tensors) != len(slots):
            raise OnnxImportError(f"the model takes {len(slots)} inputs "
                                  f"({[s.name for s in slots]}), {len(tensors)} given")
        for slot, x in zip(slots, tensors):
            if x.dtype != slot.dtype:
                raise OnnxImportError(f"input '{slot.name}' is {slot.dtype}, example input "
                                      f"is {x.dtype}")
            slot.specialized({slot.name: tuple(x.shape)})  # raises if it does not fit
        return {s.name: x for s, x in zip(slots, tensors)}
    generator = torch.Generator().manual_seed(0)
    values = {}
    for slot in slots:
        shape = slot.specialized(shapes)
        size = int(np.prod(shape, dtype=np.float64)) * slot.dtype.itemsize
        if size > limit:
            raise OnnxImportError(f"input '{slot.name}' of shape {list(shape)} would take "
                                  f"{size} bytes, more than the limit of {limit}")
        values[slot.name] = _random(shape, slot.dtype, generator)
    return values


def as_tensor(x: Any, what: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    raise TypeError(f"{what} is a {type(x).__name__}; an ONNX model takes torch tensors or "
                    f"numpy arrays")


def _capture(program: OnnxProgram, args: tuple[torch.Tensor, ...]) -> torch.fx.GraphModule:
    """The program traced to core ATen (the table the Dynamo frontend uses), on fake
    tensors of the arguments' shapes."""
    with torch.no_grad():
        return make_fx(program, decomposition_table=_decompositions(),
                       tracing_mode="fake")(*args)


@functools.cache
def _decompositions() -> dict[Any, Any]:
    return dict(core_aten_decompositions().items())


def compile_onnx(source: Source, example_inputs: Sequence[Any] | None = None,
                 options: Options | None = None, *,
                 shapes: Mapping[str, Sequence[int]] | None = None) -> Any:
    """``kiln.compile`` of an ONNX model: a CompiledModel taking torch tensors or numpy
    arrays, returning a tensor (a tuple of them for several outputs)."""
    options = options or Options.from_env()
    start = time.perf_counter()
    imported = import_onnx(source, shapes=shapes, example_inputs=example_inputs)
    report = CompileReport()
    run_graph = _runner(imported, options, report, start)
    weights = [t for _, t in imported.frozen.values()]
    several = len(imported.output_names) > 1

    def run(*args: Any) -> Any:
        with torch.no_grad():
            outputs = run_graph([*weights, *args])
        return tuple(outputs) if several else outputs[0]

    signature = [InputSpec(imported.shapes[s.name], s.dtype) for s in imported.inputs]
    name = _model_name(source)
    return OnnxCompiledModel(run, signature, report, name)


def _runner(imported: ImportedOnnx, options: Options, report: CompileReport,
            start: float) -> Any:
    """The kiln-compiled graph, or, where kiln's IR cannot hold it, the captured ATen graph
    run as it is (strict options raise instead)."""
    gm = imported.gm
    if imported.imported is None:
        if options.strict:
            raise OnnxImportError(f"kiln cannot compile this graph: {imported.why_not}")
        message = f"kiln cannot compile the ONNX graph ({imported.why_not}); it runs eagerly"
        log.warning(message)
        report.fallbacks.append(message)
        return lambda boxed: list(gm(*boxed))
    graph_in = imported.imported
    opaque = [*graph_in.opaque, *(f"onnx::{op}" for op in imported.opaque_ops)]
    compiled = compile_graph(graph_in.graph, options, graph_in.tensor_positions, opaque,
                             started=start)
    report.graphs.append(compiled.report)
    return lambda boxed: fill_outputs(graph_in.output_template, compiled(boxed))


def _model_name(source: Source) -> str:
    if isinstance(source, onnx.ModelProto):
        return source.graph.name or "onnx_model"
    return os.path.basename(os.fspath(source))


class OnnxCompiledModel(CompiledModel):
    """A CompiledModel that also takes numpy arrays."""

    def __call__(self, *args: Any) -> Any:
        return super().__call__(*(as_tensor(x, f"argument {i}") for i, x in enumerate(args)))
