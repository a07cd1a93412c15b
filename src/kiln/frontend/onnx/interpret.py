"""From an ONNX graph to a torch module torch.export can capture.

At import, the graph runs once, eagerly, on the example inputs (``plan_graph``). On the way:

* a node whose inputs are all known (initializers, Constants, shapes, and nodes of those)
  is computed there and then: its outputs are known values, constants of the captured graph
  (that is what lets Reshape's shape or Slice's starts be read as numbers);
* every other node becomes a ``Step``: its handler's torch ops (kiln.frontend.onnx.optable),
  or, where the handler declines or no handler exists, the node as it is
  (kiln.frontend.onnx.opaque), with output types measured on this run;
* a handler's result is checked against ONNX's own shape inference: a disagreement runs the
  node as it is instead, so a handler mistake costs speed, not a wrong answer.

``OnnxProgram`` replays the steps with torch ops, taking the known values it reads as
arguments (they become the captured graph's weights).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

import onnx
from kiln.frontend.onnx import ops_math, ops_nn, ops_shape  # noqa: F401 - fill HANDLERS
from kiln.frontend.onnx.errors import OnnxImportError, where
from kiln.frontend.onnx.load import MAX_TENSOR_BYTES
from kiln.frontend.onnx.opaque import node_key, run_key
from kiln.frontend.onnx.optable import HANDLERS, Decline, NodeCall
from kiln.frontend.onnx.types import tensor_of, to_numpy, torch_dtype

log = logging.getLogger("kiln")

# shapes are specialized at import, so these ops' results are known whatever their input
_SHAPE_OPS = frozenset({"Shape", "Size"})
# random ops: one value frozen at import would be wrong, and two runs never agree
_RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                         "RandomUniformLike", "Multinomial", "Bernoulli"})
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})


@dataclass(frozen=True)
class Step:
    """One node that depends on the inputs; ``key`` set: it runs as it is (opaque)."""

    node: onnx.NodeProto
    key: str | None = None


@dataclass
class Plan:
    input_names: list[str]
    output_names: list[str]
    opset: int
    known: dict[str, torch.Tensor]  # values computed at import, by ONNX name
    numbers: dict[str, np.ndarray]  # the same, as numbers handlers may read while tracing
    steps: list[Step] = field(default_factory=list)

    @property
    def opaque_ops(self) -> list[str]:
        return [s.node.op_type for s in self.steps if s.key is not None]


def plan_graph(model: onnx.ModelProto, opset: int, inputs: Mapping[str, torch.Tensor],
               max_tensor_bytes: int = MAX_TENSOR_BYTES) -> Plan:
    graph = model.graph
    known = {t.name: tensor_of(t) for t in graph.initializer}
    numbers = {name: to_numpy(t) for name, t in known.items()}
    plan = Plan(list(inputs), [o.name for o in graph.output], opset, known, numbers)
    inferred = _inferred_types(model, inputs)
    env: dict[str, torch.Tensor] = {**known, **inputs}
    for node in graph.node:
        _refuse(node, opset, numbers)
        _check_output_sizes(node, opset, inferred, max_tensor_bytes)
        args = [env[name] if name else None for name in node.input]
        outputs, key = _evaluate(node, NodeCall(node, opset, numbers), args, model, inferred)
        named = {name: out for name, out in zip(node.output, outputs) if name}
        env.update(named)
        if node.op_type in _SHAPE_OPS or all(not n or n in known for n in node.input):
            known.update(named)
            numbers.update((name, to_numpy(t)) for name, t in named.items())
        else:
            plan.steps.append(Step(node, key))
    missing = [name for name in plan.output_names if name not in env]
    if missing:
        raise OnnxImportError(f"the model's outputs {missing} are computed by no node")
    return plan


def _refuse(node: onnx.NodeProto, opset: int, numbers: Mapping[str, np.ndarray]) -> None:
    if node.op_type in _RANDOM_OPS or _training_dropout(node, numbers):
        raise OnnxImportError(f"{where(node.name, node.op_type, opset)} draws random numbers; "
                              f"kiln compiles deterministic inference graphs only")
    if node.op_type in _CONTROL_FLOW:
        raise OnnxImportError(f"{where(node.name, node.op_type, opset)} is control flow, "
                              f"which kiln does not compile: export the model without it "
                              f"(trace at fixed shapes)")


def _check_output_sizes(node: onnx.NodeProto, opset: int,
                        inferred: Mapping[str, tuple[torch.dtype, tuple | None]],
                        limit: int) -> None:
    """Refuses, before it runs, a node ONNX infers to make a tensor past the size limit
    (ConstantOfShape or Expand to a huge shape: a known way to exhaust a loader's memory)."""
    for name in node.output:
        dtype, shape = inferred.get(name, (None, None))
        if dtype is not None and shape is not None:
            size = math.prod(shape) * dtype.itemsize
            if size > limit:
                raise OnnxImportError(
                    f"{where(node.name, node.op_type, opset)} would make output '{name}' of "
                    f"shape {list(shape)}, {size} bytes, more than kiln's limit of {limit}")


def _training_dropout(node: onnx.NodeProto, numbers: Mapping[str, np.ndarray]) -> bool:
    """Dropout whose training_mode is true, or known only at run time."""
    if node.op_type != "Dropout" or len(node.input) < 3 or not node.input[2]:
        return False
    mode = numbers.get(node.input[2])
    return mode is None or bool(mode.reshape(-1)[0])


def _evaluate(node: onnx.NodeProto, call: NodeCall, args: list[torch.Tensor | None],
              model: onnx.ModelProto, inferred: Mapping[str, tuple[torch.dtype, tuple]],
              ) -> tuple[list[torch.Tensor | None], str | None]:
    """The node's outputs on these inputs, and its opaque key if it runs as it is."""
    handler = HANDLERS.get(node.op_type)
    if handler is not None:
        try:
            outputs = _as_list(handler(call, *args))
            _check(node, outputs, inferred)
            return outputs, None
        except OnnxImportError:
            raise
        except Decline as why:
            log.debug("kiln: %s runs as it is: %s", node.name, why)
        except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError) as err:
            log.debug("kiln: handler for %s failed on %s: %s", node.op_type, node.name, err)
    return _run_as_is(node, call, args, model)


def _as_list(result: object) -> list[torch.Tensor | None]:
    return list(result) if isinstance(result, (tuple, list)) else [result]  # type: ignore


def _check(node: onnx.NodeProto, outputs: Sequence[torch.Tensor | None],
           inferred: Mapping[str, tuple[torch.dtype, tuple]]) -> None:
    named = [n for n in node.output]
    if len(outputs) < sum(1 for n in named if n):
        raise Decline("fewer outputs than the node names")
    for name, out in zip(named, outputs):
        if not name:
            continue
        if not isinstance(out, torch.Tensor):
            raise Decline(f"output {name} not computed")
        if name in inferred:
            dtype, shape = inferred[name]
            if out.dtype != dtype or (shape is not None and tuple(out.shape) != shape):
                raise Decline(f"output {name}: {out.dtype}{list(out.shape)}, ONNX infers "
                              f"{dtype}{list(shape) if shape is not None else '[?]'}")


def _run_as_is(node: onnx.NodeProto, call: NodeCall, args: list[torch.Tensor | None],
               model: onnx.ModelProto) -> tuple[list[torch.Tensor | None], str]:
    opsets = list(model.opset_import)
    try:
        results = run_key(node_key(node, opsets, args), [a for a in args if a is not None])
    except Exception as err:  # noqa: BLE001 - onnxruntime and the reference raise anything
        message = str(err).strip().splitlines()[-1][:200] if str(err).strip() else ""
        raise OnnxImportError(
            f"{where(node.name, node.op_type, call.opset)}: kiln has no translation for it "
            f"and onnxruntime / onnx.reference cannot run it here ({type(err).__name__}: "
            f"{message})") from None
    it = iter(results)
    outputs = [next(it) if name else None for name in node.output]
    typed = [(tuple(o.shape), o.dtype) for o in outputs if o is not None]
    return outputs, node_key(node, opsets, args, typed)


def _inferred_types(model: onnx.ModelProto, inputs: Mapping[str, torch.Tensor],
                    ) -> dict[str, tuple[torch.dtype, tuple | None]]:
    """ONNX shape inference's types, on the specialized input shapes (empty if it fails)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for value in copy.graph.input:
        if value.name in inputs:
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for size in inputs[value.name].shape:
                dims.add().dim_value = size
    try:
        inferred = onnx.shape_inference.infer_shapes(copy, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is a check here, not a requirement
        return {}
    types: dict[str, tuple[torch.dtype, tuple | None]] = {}
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        t = value.type.tensor_type
        if not value.type.HasField("tensor_type") or not t.elem_type:
            continue
        try:
            dtype = torch_dtype(t.elem_type)
        except OnnxImportError:
            continue
        dims = t.shape.dim
        exact = t.HasField("shape") and all(d.HasField("dim_value") for d in dims)
        types[value.name] = (dtype, tuple(d.dim_value for d in dims) if exact else None)
    return types


class OnnxProgram:
    """The planned steps as a function of (weights, inputs) -> outputs, for tracing: the
    weights are the known values the steps read, in ``weight_names`` order; the inputs and
    outputs are in the ONNX graph's order."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        read = {n for s in plan.steps for n in s.node.input} | set(plan.output_names)
        self.weight_names = sorted(read & plan.known.keys())

    def weights(self) -> list[torch.Tensor]:
        return [self.plan.known[name] for name in self.weight_names]

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        split = len(self.weight_names)
        env: dict[str, torch.Tensor] = dict(zip(self.weight_names, args[:split]))
        env.update(zip(self.plan.input_names, args[split:]))
        for step in self.plan.steps:
            inputs = [env[name] if name else None for name in step.node.input]
            if step.key is not None:
                present = [x for x in inputs if x is not None]
                results = torch.ops.kiln_onnx.node(present, step.key)
                it = iter(results)
                outputs = [next(it) if name else None for name in step.node.output]
            else:
                call = NodeCall(step.node, self.plan.opset, self.plan.numbers)
                outputs = _as_list(HANDLERS[step.node.op_type](call, *inputs))
            env.update((n, o) for n, o in zip(step.node.output, outputs) if n)
        # an output that is an input or a weight is copied: the caller may write to it
        return tuple(env[name] if self._computed(name) else env[name].clone()
                     for name in self.plan.output_names)

    def _computed(self, name: str) -> bool:
        return any(name in s.node.output for s in self.plan.steps)
