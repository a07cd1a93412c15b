"""An ONNX node kiln has no translation for runs as it is: one torch custom op,
``kiln_onnx::node(inputs, key)``, whose ``key`` is the node as a one-node ONNX model (its
inputs' and outputs' types and shapes included), run by onnx's reference evaluator, or by
onnxruntime where the reference cannot run it.

To torch.export and to kiln it is an opaque call whose output types the key states; kiln keeps
it as a CALL node. The node's output shapes were specialized at import (for NonZero, say,
they depend on the data): a run whose outputs differ raises instead of returning them.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import onnx
from kiln.frontend.onnx.errors import OnnxImportError
from kiln.frontend.onnx.types import from_numpy, onnx_dtype, to_numpy, torch_dtype
from onnx import helper


def node_key(node: onnx.NodeProto, opsets: Sequence[onnx.OperatorSetIdProto],
             inputs: Sequence[torch.Tensor | None],
             outputs: Sequence[tuple[tuple[int, ...], torch.dtype]] | None = None) -> str:
    """The one-node model for ``node``, as text a custom op can take. Absent optional inputs
    (``None``) stay absent; ``outputs`` (shape, dtype) are stated once known."""
    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    del copy.input[:]
    copy.input.extend(names)
    del copy.output[:]
    copy.output.extend(f"out{i}" if name else "" for i, name in enumerate(node.output))
    graph_inputs = [_value_info(n, tuple(x.shape), x.dtype)
                    for n, x in zip(names, inputs) if x is not None]
    named = [n for n in copy.output if n]
    if outputs is None:
        graph_outputs = [helper.make_value_info(n, onnx.TypeProto()) for n in named]
    else:  # one (shape, dtype) per named output, in order
        graph_outputs = [_value_info(n, shape, dtype) for n, (shape, dtype) in zip(named, outputs)]
    graph = helper.make_graph([copy], "kiln_onnx_node", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=list(opsets))
    model.ir_version = min(model.ir_version, 10)  # what the installed onnxruntime reads
    return base64.b64encode(model.SerializeToString()).decode("ascii")


def _value_info(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, onnx_dtype(dtype), list(shape))


@functools.lru_cache(maxsize=512)
def _model(key: str) -> onnx.ModelProto:
    return onnx.load_model_from_string(base64.b64decode(key))


@functools.lru_cache(maxsize=512)
def _runner(key: str) -> _NodeRunner:
    return _NodeRunner(_model(key))


class _NodeRunner:
    """Runs the node on numpy arrays by onnx's reference evaluator, which defines what ONNX
    ops compute (onnxruntime departs from it on some: DFT, STFT, MaxUnpool, Resize with
    align_corners); by onnxruntime from the first time the reference cannot (an op or a type
    it lacks), which is at import, where the node first runs."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.names = [i.name for i in model.graph.input]
        self.run: Any = None

    def __call__(self, arrays: list[np.ndarray]) -> list[Any]:
        if self.run is None:
            try:
                from onnx.reference import ReferenceEvaluator

                evaluator = ReferenceEvaluator(self.model)
                results = evaluator.run(None, dict(zip(self.names, arrays)))
                self.run = lambda a: evaluator.run(None, dict(zip(self.names, a)))
                return results
            except Exception:  # noqa: BLE001 - the reference lacks it: onnxruntime then
                self.run = _onnxruntime(self.model)
        return self.run(arrays)


def _onnxruntime(model: onnx.ModelProto) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # one node: thread start-up costs more than it saves
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return lambda arrays: session.run(None, dict(zip(names, arrays)))


def run_key(key: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    arrays = [to_numpy(x) for x in inputs]
    results = _runner(key)(arrays)
    return [from_numpy(np.asarray(r)) for r in results]


def declared_outputs(key: str) -> list[tuple[tuple[int, ...], torch.dtype]]:
    outputs = []
    for out in _model(key).graph.output:
        t = out.type.tensor_type
        shape = tuple(d.dim_value for d in t.shape.dim)
        outputs.append((shape, torch_dtype(t.elem_type)))
    return outputs


@torch.library.custom_op("kiln_onnx::node", mutates_args=())
def run_node(inputs: list[torch.Tensor], key: str) -> list[torch.Tensor]:
    results = run_key(key, inputs)
    expected = declared_outputs(key)
    for i, (r, (shape, dtype)) in enumerate(zip(results, expected)):
        if tuple(r.shape) != shape or r.dtype != dtype:
            node = _model(key).graph.node[0]
            raise OnnxImportError(
                f"{node.op_type} node '{node.name}' gave output {i} of shape "
                f"{tuple(r.shape)} ({r.dtype}), but kiln specialized it to {shape} ({dtype}) "
                f"on the example inputs: its output shape depends on the data; compile again "
                f"with inputs like these")
    return results


@run_node.register_fake
def _run_node_fake(inputs: list[torch.Tensor], key: str) -> list[torch.Tensor]:
    return [torch.empty(shape, dtype=dtype) for shape, dtype in declared_outputs(key)]
