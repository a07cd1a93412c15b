"""Where a kernel's operand is a view: the strides it will have at run time."""

from __future__ import annotations

import torch

from kiln.ir.graph import Graph, Value
from kiln.ir.interp import evaluate_node
from kiln.ir.ops import Op, OpGroup
from kiln.passes.layout import KEEPS_LAYOUT, channels_last_values
from kiln.tir.nodes import contiguous_strides

__all__ = ["runtime_strides"]


def runtime_strides(graph: Graph, value: Value) -> tuple[int, ...] | None:
    """The strides ``value`` will have at run time where it is a chain of views (permute,
    view, slice, split, ...) of a value taken to be contiguous, or channels-last where the
    layout pass made it so, or of a weight with the strides it has: the chain replayed on
    a meta tensor, as the executor runs it (a view that cannot alias copies, as there).
    None: contiguous. A guess the executor checks before each call (`layout_check`); where
    it is wrong, the node's library call runs."""
    chain: list[Value] = []
    while value.node.op.is_a(OpGroup.VIEW):
        chain.append(value)
        value = value.node.inputs[0]
    if not chain:
        return None
    tensor = torch.empty(value.type.shape, dtype=value.type.dtype.torch, device="meta")
    if value.node.op is Op.CONSTANT:  # its own strides (folding may leave a slice's)
        tensor = torch.empty_strided(value.type.shape, graph.constant(value.node).stride(),
                                     dtype=value.type.dtype.torch, device="meta")
    elif _channels_last(graph, value):  # (a view of NHWC memory: ConvNeXt's permutes)
        tensor = tensor.contiguous(memory_format=torch.channels_last)
    for v in reversed(chain):
        node = v.node
        args = [tensor if i == 0 else (x.node.attrs.value if x.node.op is Op.SCALAR
                                       else torch.empty(x.type.shape, device="meta"))
                for i, x in enumerate(node.inputs)]
        try:
            tensor = evaluate_node(node, args, graph)[v.index]
        except Exception:  # noqa: BLE001 - a view the meta device cannot replay: contiguous
            return None
    strides = tuple(tensor.stride())
    return None if strides == contiguous_strides(tensor.shape) else strides


def _channels_last(graph: Graph, value: Value) -> bool:
    """Whether ``value`` (not a view) is NHWC at run time (`channels_last_values`), asked
    only of ops that can make NHWC values."""
    node = value.node
    if len(value.type.shape) != 4 or not (
            node.op in KEEPS_LAYOUT or node.op is Op.TO_LAYOUT or node.op.is_a(OpGroup.POOLING)
            or node.op.is_a(OpGroup.ELEMENTWISE)):
        return False
    return value in channels_last_values(graph)
