"""Scatters written into their base's memory where nothing reads that memory afterwards.

A captured graph is functional: ``x[:, :, 1:, 1:] += rel`` (MViT's relative positions)
arrives as ``slice_scatter(x, slice_scatter(slice(x, 2, 1), y, 3, 1), 2, 1)``, and ATen's
``slice_scatter`` copies all of ``x`` for each: two copies of a 6273x1569 attention per
layer where eager writes the box once (MViT-v2 ran 8x slower than eager). Once the kernels
are placed (run order fixed), a scatter whose base's memory (the buffer it views, followed
through views and earlier in-place writes) is read by nothing after it writes its source
into that memory and returns the base; the memory planner then counts the result as a view
of the base (`kiln.runtime.memory.aliases`).

The nested form is recognized: the inner scatter's base is the outer one's region, and the
outer one only puts the inner result back where it already is. The inner one writes in
place (the outer's read of its base sees the region it is about to write), and the outer
one, finding its source already there, copies nothing.

Never in place: a base that is a graph input or a weight (the caller's or the model's
memory), or whose memory a graph output shows other than through the scatter's result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kiln.ir import calls
from kiln.ir.attrs import Operand
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.infer import meta_operand
from kiln.ir.ops import Op, OpGroup
from kiln.ir.semantics import lower_node, run_call

__all__ = ["INTO", "written_in_place"]

aten = torch.ops.aten


def _region(base: torch.Tensor, target: Any, args: tuple[Any, ...]) -> torch.Tensor:
    if target is aten.select_scatter.default:
        dim, index = args
        return base.select(dim, index)
    dim, start, end, step = (list(args) + [0, None, None, 1][len(args):])
    return aten.slice.Tensor(base, dim, start, end, step)


def _write(target: Any) -> Any:
    def write(base: torch.Tensor, src: torch.Tensor, *args: Any) -> torch.Tensor:
        region = _region(base, target, args)
        if not (region.data_ptr() == src.data_ptr() and region.stride() == src.stride()
                and region.shape == src.shape):  # (the nested form's outer scatter)
            region.copy_(src)
        return base

    write.__name__ = f"{target._opname}_into_base"
    return write


# the run-time function of each scatter written in place: same arguments, returns the base
INTO = {target: _write(target) for target in (aten.slice_scatter.default,
                                              aten.select_scatter.default)}


def written_in_place(graph: Graph, fused: Sequence[Any] = ()) -> frozenset[Node]:
    """The scatters of ``graph`` (nodes in run order, kernels gathered) that may write into
    their base. ``fused``: the kernels' `FusedCall`s (a kernel reads its inputs when its
    last node runs)."""
    from kiln.runtime.memory import escaping

    candidates = [n for n in graph.nodes if _scatter(n)]
    if not candidates:
        return frozenset()
    index = {n: i for i, n in enumerate(graph.nodes)}
    at = dict(index)  # where each node reads its operands: a kernel's member at its call
    for call in fused:
        last = max(index[n] for n in call.nodes)
        at.update((n, last) for n in call.nodes)
    readers: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        for v in node.inputs:
            readers.setdefault(v, []).append(node)
    shown = escaping(graph)  # what outputs show directly (in-place results not followed)
    chosen = frozenset(candidates)
    while True:  # the first that cannot, out; then again: a scatter left out of place
        # gives those after it a root of their own (a chain of row writes into a weight)
        failed = next((n for n in candidates if n in chosen
                       and not _may_write(n, at, readers, shown, chosen)), None)
        if failed is None:
            return chosen
        chosen = chosen - {failed}


def _scatter(node: Node) -> bool:
    if node.op is not Op.CALL or node.attrs.target not in INTO:  # type: ignore[attr-defined]
        return False
    args = node.attrs.args  # type: ignore[attr-defined]
    return (len(args) >= 2 and args[0] == Operand(0) and args[1] == Operand(1)
            and not node.attrs.kwargs)  # type: ignore[attr-defined]


def _shares_memory(node: Node, chosen: frozenset[Node]) -> bool:
    return node.op.is_a(OpGroup.VIEW) or node in chosen


def _root(value: Value, chosen: frozenset[Node]) -> Value:
    """The value owning ``value``'s memory: through views and in-place scatters."""
    while _shares_memory(value.node, chosen):
        value = value.node.inputs[0]
    return value


def _may_write(node: Node, at: dict[Node, int], readers: dict[Value, list[Node]],
               shown: set[Value], chosen: frozenset[Node]) -> bool:
    base, src = node.inputs[0], node.inputs[1]
    root = _root(base, chosen)
    owner = root.node
    if owner.op in (Op.INPUT, Op.CONSTANT, Op.SCALAR) or root in shown:
        return False
    if owner.op is Op.CALL and owner not in chosen and calls.results_alias_operands(owner):
        return False  # (memory of an operand's)
    if _root(src, chosen) == root and not (_put_back(node, src, chosen)
                                           or _is_region(src, node, chosen)):
        return False  # (the source overlaps what the write changes)
    # every value sharing the root's memory other than through this scatter's result is
    # read no later than the scatter, but by an outer scatter putting this one's result back
    here = at[node]
    stack = [root]
    while stack:
        value = stack.pop()
        for user in readers.get(value, []):
            if user is node:
                continue
            if user in chosen and user.inputs[0] == value and at[user] > here:
                # a later in-place write into this memory: fine where it puts this one's
                # result back (its result is then what this write made), else not
                if not _put_back(user, node.out(), chosen):
                    return False
            elif _shares_memory(user, chosen) and user.inputs[0] == value:
                stack.extend(user.outputs)
            elif at[user] > here:
                return False
    return True


def _put_back(outer: Node, src: Value, chosen: frozenset[Node]) -> bool:
    """``src`` is an in-place scatter's result whose base is ``outer``'s region of its own
    base: ``outer`` then finds its source already in place."""
    inner = src.node
    return inner in chosen and _is_region(inner.inputs[0], outer, chosen)


def _is_region(src: Value, scatter: Node, chosen: frozenset[Node]) -> bool:
    """``src`` is the very memory ``scatter`` writes (a slice written back onto itself)."""
    try:
        base = _meta(scatter.inputs[0], chosen)
        want = _region(base, scatter.attrs.target,  # type: ignore[attr-defined]
                       tuple(scatter.attrs.args[2:]))  # type: ignore[attr-defined]
        got = _meta(src, chosen)
    except (RuntimeError, IndexError, TypeError, ValueError):
        return False
    return (got.shape == want.shape and got.stride() == want.stride()
            and got.storage_offset() == want.storage_offset())


def _meta(value: Value, chosen: frozenset[Node]) -> torch.Tensor:
    """``value`` as a meta tensor laid out on its root's memory (the root dense)."""
    node = value.node
    if node in chosen:
        return _meta(node.inputs[0], chosen)
    if not node.op.is_a(OpGroup.VIEW):
        return torch.empty(value.type.shape, dtype=value.type.dtype.torch, device="meta")
    source = _meta(node.inputs[0], chosen)
    results = run_call(lower_node(node), [source, *map(meta_operand, node.inputs[1:])],
                       source.device)
    return results[value.index]
