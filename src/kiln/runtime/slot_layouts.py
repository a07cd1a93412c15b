"""The layout of a planned slot an elementwise library op writes: the one ATen would give
the result it allocates itself.

ATen's elementwise kernels lay their result out like their operands (a transposed operand, a
transposed result) and then run dense and vectorized. Written through ``out=`` into a
contiguous slot, a transposed operand makes them read and write in different orders, one
element at a time: GELU of data2vec-audio's transposed 512x3199 features took 10.3 ms into a
contiguous slot, 1.1 ms into a transposed one. So the slot takes the strides ATen picks on
meta tensors laid out as the operands will be at run time.

Only where no generated kernel reads the result: a kernel is compiled for the strides the IR
predicts (`kiln.kernels.strides`), and an unpredicted layout would fail its check.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch

from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op, OpGroup
from kiln.ir.semantics import lower_node, run_call
from kiln.kernels.strides import runtime_strides
from kiln.tir.nodes import contiguous_strides

__all__ = ["SlotLayouts"]


class SlotLayouts:
    """For one graph and its kernels: which values generated kernels read (through views)."""

    def __init__(self, graph: Graph, kernel_operands: Collection[Value]) -> None:
        self.graph = graph
        self.read_by_kernels: set[Value] = set()
        sources = {n.out(): n.inputs[0] for n in graph.nodes
                   if n.op.is_a(OpGroup.VIEW) and len(n.outputs) == 1}
        for v in kernel_operands:  # (and what each is a view of)
            while v not in self.read_by_kernels:
                self.read_by_kernels.add(v)
                if v not in sources:
                    break
                v = sources[v]

    def strides(self, node: Node, known: Callable[[Value], tuple[int, ...] | None]
                ) -> tuple[int, ...] | None:
        """The strides for ``node``'s slot, where they are not the contiguous ones; None to
        keep the slot contiguous. ``known``: an operand's run-time strides where the
        executor fixed them (a slot's), else None."""
        if not node.op.is_a(OpGroup.ELEMENTWISE) or len(node.outputs) != 1:
            return None
        out = node.out()
        if len(out.type.shape) < 2 or out in self.read_by_kernels:
            return None
        operands = []
        for v in node.inputs:
            if v.node.op is Op.SCALAR:
                operands.append(v.node.attrs.value)  # type: ignore[attr-defined]
                continue
            strides = known(v) or runtime_strides(self.graph, v) or contiguous_strides(
                v.type.shape)
            operands.append(torch.empty_strided(v.type.shape, strides,
                                                dtype=v.type.dtype.torch, device="meta"))
        try:
            (result, *_) = run_call(lower_node(node), operands, torch.device("meta"))
        except (RuntimeError, TypeError, ValueError):
            return None
        strides = tuple(result.stride())
        if tuple(result.shape) != out.type.shape or strides == contiguous_strides(
                out.type.shape):
            return None
        return strides
