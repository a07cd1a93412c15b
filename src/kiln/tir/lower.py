"""Lowering of kiln ops to loop nests: one node, or a producer->consumer chain of nodes into
one PrimFunc (intermediates become allocated buffers that the schedule can inline).

    lowered = lower_chain([add, relu], outputs=[relu.out()])
    lowered.func      # PrimFunc(inputs=buffers of lowered.inputs, outputs=...)
    lowered.inputs    # the kiln Values to pass, in parameter order

For ``relu(x + y)`` the function is::

    def add_relu(x: f32[4, 8], y: f32[1, 8], relu: f32[4, 8]):
      alloc add: f32[4, 8]:
        for i0 in range(4):
          for i1 in range(8):
            block add(vi0: spatial[4] = i0, vi1: spatial[8] = i1):
              add[vi0, vi1] = x[vi0, vi1] + y[0, vi1]
        for i0_1 in range(4):
          for i1_1 in range(8):
            block relu(vi0_1: spatial[4] = i0_1, vi1_1: spatial[8] = i1_1):
              relu[vi0_1, vi1_1] = max(add[vi0_1, vi1_1], 0.0)

An op without a definition raises `NotLowerable` (the partitioner keeps it a library call).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kiln.ir.graph import Node, Value
from kiln.ir.ops import Op
from kiln.tir.lower_contract import CONTRACTIONS
from kiln.tir.lower_elementwise import ELEMENTWISE, LowerFn
from kiln.tir.lower_movement import MOVEMENT
from kiln.tir.lower_reduce import REDUCTIONS
from kiln.tir.nodes import Buffer, PrimFunc
from kiln.tir.te import Builder, NotLowerable, TensorRef

LOWERINGS: dict[Op, LowerFn] = {**ELEMENTWISE, **REDUCTIONS, **CONTRACTIONS, **MOVEMENT}

__all__ = ["LOWERINGS", "Lowered", "NotLowerable", "can_lower", "lower_chain", "lower_node"]


@dataclass(frozen=True)
class Lowered:
    """A PrimFunc and the kiln values bound to its parameters, in order."""

    func: PrimFunc
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]


def can_lower(node: Node) -> bool:
    """Whether ``node``'s op has a loop definition (it may still refuse its operands)."""
    return node.op in LOWERINGS


def lower_node(node: Node, outputs: Sequence[Value] | None = None,
               name: str | None = None) -> Lowered:
    return lower_chain([node], outputs, name)


def lower_chain(nodes: Sequence[Node], outputs: Sequence[Value] | None = None,
                name: str | None = None) -> Lowered:
    """One PrimFunc computing ``nodes`` (in topological order).

    Operands produced outside the chain become input buffers (SCALAR operands become
    constants); ``outputs`` (default: every output of the last node) become output buffers;
    every other value the chain produces is an allocated intermediate.
    """
    if not nodes:
        raise ValueError("nothing to lower")
    wanted = tuple(outputs) if outputs is not None else nodes[-1].outputs
    chain = set(nodes)
    for v in wanted:
        if v.node not in chain:
            raise ValueError(f"output {v} is not produced by the chain")
    b = Builder()
    refs: dict[Value, TensorRef] = {}
    inputs: list[tuple[Value, Buffer]] = []
    out_bufs: dict[Value, Buffer] = {}

    def operand(v: Value) -> TensorRef:
        if v not in refs:
            t = v.type
            if v.node.op is Op.SCALAR:
                refs[v] = TensorRef(t.shape, t.dtype, number=v.node.attrs.value)  # type: ignore
            else:
                suffix = f"_{v.index}" if v.index else ""
                buf = b.buffer(v.node.name + suffix, t.shape, t.dtype)
                inputs.append((v, buf))
                refs[v] = TensorRef(t.shape, t.dtype, buf)
        return refs[v]

    for node in nodes:
        lower = LOWERINGS.get(node.op)
        if lower is None:
            raise NotLowerable(node.op, "no loop definition for this op")
        args = [operand(v) for v in node.inputs]
        outs = []
        for k, v in enumerate(node.outputs):
            suffix = f"_{k}" if len(node.types) > 1 and k else ""
            t = v.type
            if v in wanted:
                buf = b.buffer(node.name + suffix, t.shape, t.dtype)
                out_bufs[v] = buf
            else:
                buf = b.temp(node.name + suffix, t.shape, t.dtype)
            outs.append(buf)
            refs[v] = TensorRef(t.shape, t.dtype, buf)
        lower(b, node, args, outs)
    func = PrimFunc(name or _kernel_name(nodes), tuple(buf for _, buf in inputs),
                    tuple(out_bufs[v] for v in wanted), b.body())
    return Lowered(func, tuple(v for v, _ in inputs), wanted)


def _kernel_name(nodes: Sequence[Node]) -> str:
    text = "_".join(dict.fromkeys(n.op.text for n in nodes))
    return "".join(c if c.isalnum() or c == "_" else "_" for c in text)[:60] or "kernel"
