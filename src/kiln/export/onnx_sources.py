"""What `kiln.export.onnx.optimize` starts from: a kiln Graph, the names its inputs and
outputs have in ONNX, the model as ONNX before kiln (to count and to compare with) and inputs
to run both on.

    "model.onnx" / ModelProto  -> kiln.frontend.onnx.import_onnx          (names kept)
    "resnet18" (a zoo name)    -> kiln.models.build, then as an nn.Module
    nn.Module + example inputs -> torch.export (as kiln.compile captures it) for kiln's graph,
                                  torch.onnx.export for the ONNX before kiln
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch

from kiln.export.onnx_context import OnnxExportError
from kiln.export.onnx_graph import unique_names_of
from kiln.ir.graph import Graph


@dataclass(frozen=True)
class Prepared:
    graph: Graph  # as captured or imported, before any pass
    input_names: list[str]
    output_names: list[str]
    original: onnx.ModelProto  # the model as ONNX before kiln
    feeds: dict[str, np.ndarray]  # example inputs, by input name


def prepare(source: Any, *, shapes: Mapping[str, Sequence[int]] | None, quick: bool,
            example_inputs: Sequence[torch.Tensor] | None, opset: int) -> Prepared:
    if isinstance(source, onnx.ModelProto) or isinstance(source, os.PathLike) or (
            isinstance(source, str) and (source.lower().endswith(".onnx")
                                         or os.path.isfile(source))):
        return _from_onnx(source, shapes, example_inputs)
    if shapes is not None:
        raise OnnxExportError("shapes= names ONNX inputs; a PyTorch model takes its shapes "
                              "from its example inputs")
    if isinstance(source, str):
        model, inputs = _zoo_model(source, quick)
        return _from_torch(model, tuple(example_inputs or inputs), opset)
    if isinstance(source, torch.nn.Module):
        if example_inputs is None:
            raise OnnxExportError("optimize(nn.Module) needs example_inputs= (the tensors "
                                  "to trace it with)")
        return _from_torch(source, tuple(example_inputs), opset)
    raise OnnxExportError(f"optimize takes an .onnx path, an onnx.ModelProto, a zoo model name "
                          f"or an nn.Module, not {type(source).__name__}")


def _zoo_model(name: str, quick: bool) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from kiln import models

    try:
        models.get(name)
    except ValueError as err:  # unknown name (listing the known ones), or a missing extra
        raise OnnxExportError(str(err)) from None
    return models.build(name, quick=quick, seed=0)


def _from_onnx(source: Any, shapes: Mapping[str, Sequence[int]] | None,
               example_inputs: Sequence[torch.Tensor] | None) -> Prepared:
    from kiln.frontend.onnx import import_onnx

    imported = import_onnx(source, shapes=shapes, example_inputs=example_inputs)
    graph = imported.graph
    inputs = tuple(example_inputs) if example_inputs is not None else imported.example_inputs()
    if len(graph.inputs) != len(imported.input_names) or \
            len(graph.outputs) != len(imported.output_names):
        raise OnnxExportError(
            f"kiln's graph of this model has {len(graph.inputs)} input(s) and "
            f"{len(graph.outputs)} output(s) where the ONNX model has "
            f"{len(imported.input_names)} and {len(imported.output_names)}; kiln cannot "
            f"write it back under the same names")
    feeds = {n: x.numpy() for n, x in zip(imported.input_names, inputs)}
    return Prepared(graph, imported.input_names, imported.output_names, imported.model, feeds)


def _from_torch(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                opset: int) -> Prepared:
    model = model.eval()
    graph = capture(model, inputs)
    input_names = unique_names_of([node.name for node in graph.inputs])
    n = len(graph.outputs)
    output_names = ["output"] if n == 1 else [f"output_{i}" for i in range(n)]
    original = torch_to_onnx(model, inputs, input_names, output_names, opset)
    feeds = {name: x.detach().numpy() for name, x in zip(input_names, inputs)}
    return Prepared(graph, input_names, output_names, original, feeds)


def capture(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Graph:
    """The graph kiln.compile would optimize: torch.export to core ATen, weights frozen."""
    from kiln.frontend.export import import_model
    from kiln.frontend.importer import UnsupportedGraph

    if not all(isinstance(x, torch.Tensor) for x in inputs):
        raise OnnxExportError("example inputs must all be tensors")
    try:
        imported = import_model(model, inputs, whole=())  # (ONNX has no form for those)
    except UnsupportedGraph as err:
        raise OnnxExportError(f"kiln cannot hold {type(model).__name__}'s graph: {err}") from None
    if any(not isinstance(t, int) for t in imported.output_template):
        raise OnnxExportError(f"{type(model).__name__} returns values that are not tensors; "
                              f"ONNX outputs are tensors")
    return imported.graph


def torch_to_onnx(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                  input_names: list[str], output_names: list[str],
                  opset: int) -> onnx.ModelProto:
    """The model as torch.onnx.export writes it: the TorchScript exporter (fast: 0.1 s for a
    quick zoo model where the dynamo one takes 1 to 3 s), else the dynamo one."""
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(model, inputs, buffer, dynamo=False, opset_version=opset,
                              input_names=input_names, output_names=output_names)
            return onnx.load_from_string(buffer.getvalue())
        except Exception:  # noqa: BLE001 - the old exporter fails in many ways; try the new
            pass
        try:
            program = torch.onnx.export(model, inputs, dynamo=True, opset_version=opset,
                                        input_names=input_names, output_names=output_names)
        except Exception as err:  # noqa: BLE001 - as above
            raise OnnxExportError(f"torch.onnx.export cannot export {type(model).__name__} "
                                  f"({type(err).__name__}: {str(err).splitlines()[0]}); "
                                  f"kiln compares its result with that export") from err
        return program.model_proto
