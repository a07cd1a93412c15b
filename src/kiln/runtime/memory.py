"""Static memory planning: give intermediates offsets in one reused arena.

A value is *planned* when an op writes it through an efficient ``out=`` ATen variant, or a
generated kernel writes it, and it never escapes the graph (it is not an output, nor viewed
by one). A kernel's inputs live until its call and its outputs from its first node, so no
output of a kernel shares bytes with what it reads; values inside a kernel never exist.
Each planned value lives from the node that defines it to the last node that reads it or any
view of it; two values whose lifetimes overlap never share bytes. Offsets come from
greedy-by-size placement (large tensors first, each at the lowest offset free over its
lifetime), as TFLite's arena planner does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from kiln.ir import calls, fused
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op, OpGroup

ALIGNMENT = 64  # bytes; keeps every buffer aligned for vector loads

aten = torch.ops.aten

# ops whose out= variant is a native kernel (not a generated "compute, then copy" wrapper)
OUT_VARIANTS: dict[Op, object] = {
    Op.ADD: aten.add.out, Op.SUB: aten.sub.out, Op.MUL: aten.mul.out, Op.DIV: aten.div.out,
    Op.EXP: aten.exp.out, Op.TANH: aten.tanh.out, Op.SIGMOID: aten.sigmoid.out,
    Op.GELU: aten.gelu.out, Op.RSQRT: aten.rsqrt.out, Op.CLAMP: aten.clamp.out,
    Op.MM: aten.mm.out, Op.BMM: aten.bmm.out, Op.ADDMM: aten.addmm.out,
    Op.SOFTMAX: aten._softmax.out, Op.CAT: aten.cat.out, Op.WHERE: aten.where.self_out,
    Op.SUM: aten.sum.IntList_out, Op.MEAN: aten.mean.out,
    Op.ADDMM_ACT: fused.addmm_act,
}


@dataclass(frozen=True)
class FusedCall:
    """One generated kernel standing for ``nodes``: what the planner must know of it."""

    nodes: Sequence[Node]
    inputs: Sequence[Value]
    outputs: Sequence[Value]
    internal: frozenset[Value] = field(default_factory=frozenset)  # never materialized
    writes_into: bool = True  # False: the call allocates its outputs (a library entry point)


@dataclass(frozen=True)
class Lifetime:
    first: int  # index of the defining node in the body
    last: int  # index of the last node that reads it (or a view of it)


@dataclass(frozen=True)
class MemoryPlan:
    offsets: dict[Value, int]  # byte offset in the arena of every planned value
    arena_bytes: int  # planned peak: the arena's size
    intermediate_bytes: int  # every intermediate's bytes added up (no reuse at all)
    planned_bytes: int  # bytes of the planned values added up, aligned, before reuse

    @property
    def reuse_ratio(self) -> float:
        return self.planned_bytes / self.arena_bytes if self.arena_bytes else 1.0


def plannable(node: Node) -> bool:
    """Does the runtime write this node's result into a planned buffer?"""
    if node.op not in OUT_VARIANTS or len(node.types) != 1 or node.types[0].nbytes == 0:
        return False
    if node.op in (Op.SUM, Op.MEAN) and node.attrs.dims is None:  # type: ignore[attr-defined]
        return False  # the all-dimensions forms have no out= overload
    if node.op is Op.DIV and node.attrs.rounding_mode is not None:  # type: ignore[attr-defined]
        return False  # div.out_mode: another overload
    # Python numbers as operands need the functional overloads
    return all(v.node.op is not Op.SCALAR for v in node.inputs)


def aliases(node: Node, writes: frozenset[Node] = frozenset()) -> Sequence[Value]:
    """Operands whose storage the node's results may share; ``writes``: the scatters that
    write into their base (`kiln.runtime.scatters`), whose result is that base."""
    if node.op.is_a(OpGroup.VIEW) or node in writes:
        return node.inputs[:1]
    if node.op is Op.CALL and calls.results_alias_operands(node):
        return node.inputs
    return ()


def lifetimes(graph: Graph, writes: frozenset[Node] = frozenset()) -> dict[Value, Lifetime]:
    """Lifetime of every body node's outputs; a view keeps its source alive."""
    index = {node: i for i, node in enumerate(graph.nodes)}
    last: dict[Value, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last[v] = i
    for i in range(len(graph.nodes) - 1, -1, -1):  # users come later: walk backwards
        node = graph.nodes[i]
        end = max((last.get(out, i) for out in node.outputs), default=i)
        for source in aliases(node, writes):
            last[source] = max(last.get(source, 0), end)
    return {out: Lifetime(index[n], max(last.get(out, index[n]), index[n]))
            for n in graph.nodes for out in n.outputs}


def escaping(graph: Graph, writes: frozenset[Node] = frozenset()) -> set[Value]:
    """Values the caller can reach: outputs and everything an output is a view of."""
    escaped: set[Value] = set()
    stack = list(graph.outputs)
    while stack:
        value = stack.pop()
        if value not in escaped:
            escaped.add(value)
            stack.extend(aliases(value.node, writes))
    return escaped


def plan_memory(graph: Graph, fused: Sequence[FusedCall] = (),
                writes: frozenset[Node] = frozenset()) -> MemoryPlan:
    spans = lifetimes(graph, writes)
    internal = {v for call in fused for v in call.internal}
    written = [v for call in fused if call.writes_into for v in call.outputs]
    allocated = {v for call in fused if not call.writes_into for v in call.outputs}
    spans.update(_kernel_spans(graph, spans, fused))
    escaped = escaping(graph, writes)
    intermediates = [out for n in graph.nodes if not n.op.is_a(OpGroup.SOURCE)
                     and not n.op.is_a(OpGroup.VIEW) for out in n.outputs
                     if out not in escaped and out not in internal]
    candidates = [n.out() for n in graph.nodes if plannable(n) and n.out() not in allocated]
    candidates += written
    planned = [v for v in dict.fromkeys(candidates) if v not in escaped and v not in internal
               and v.type.nbytes > 0]
    planned.sort(key=lambda v: (-v.type.nbytes, spans[v].first))
    # the placed buffers' first and last steps and byte ranges, as arrays: the overlap test
    # against all of them is one vector operation (a Python loop was quadratic: RWKV's 3000)
    firsts, lasts, starts, ends = (np.zeros(len(planned), dtype=np.int64) for _ in range(4))
    offsets: dict[Value, int] = {}
    for i, value in enumerate(planned):
        size = _aligned(value.type.nbytes)
        span = spans[value]
        live = (firsts[:i] <= span.last) & (lasts[:i] >= span.first)
        busy = sorted(zip(starts[:i][live].tolist(), ends[:i][live].tolist()))
        offset = 0
        for start, end in busy:
            if offset + size <= start:
                break
            offset = max(offset, end)
        offsets[value] = offset
        firsts[i], lasts[i], starts[i], ends[i] = span.first, span.last, offset, offset + size
    arena = int(ends.max(initial=0))
    return MemoryPlan(offsets, arena, sum(v.type.nbytes for v in intermediates),
                      sum(_aligned(v.type.nbytes) for v in planned))


def _kernel_spans(graph: Graph, spans: dict[Value, Lifetime],
                  fused: Sequence[FusedCall]) -> dict[Value, Lifetime]:
    """A kernel reads all its inputs and writes all its outputs in one call: inputs live
    until its last node, outputs from its first."""
    index = {node: i for i, node in enumerate(graph.nodes)}
    changed: dict[Value, Lifetime] = {}
    for call in fused:
        lo = min(index[n] for n in call.nodes)
        hi = max(index[n] for n in call.nodes)
        for v in call.inputs:
            if v in spans:
                span = changed.get(v, spans[v])
                changed[v] = Lifetime(span.first, max(span.last, hi))
        for v in call.outputs:
            span = changed.get(v, spans[v])
            changed[v] = Lifetime(min(span.first, lo), max(span.last, hi))
    return changed


def _aligned(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
