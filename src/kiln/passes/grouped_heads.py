"""Attention's batched matmuls against key and value heads that a group of query heads
shares (grouped-query and multi-query attention: Llama, Mistral, Qwen, Falcon), as one matmul
per shared head with the group's query heads stacked as rows.

Hugging Face's eager attention repeats each of the G key/value heads R times
(``repeat_kv``: unsqueeze, expand, reshape) before its two matmuls, and reshaping an expanded
tensor copies it: each layer writes its keys and values R times over, and reads them back
R times. Query head ``g*R + r`` meets key head ``g``, so the R query heads of a group can
share one matmul, their rows stacked (a view where the queries are contiguous)::

    %kr = view(expand(unsqueeze(%k, 2)) {shape=(B, G, R, S, D)}) {shape=(B, G*R, S, D)}
    %s  = bmm(view(%q) {shape=(B*G*R, L, D)}, view(permute(%kr)) {shape=(B*G*R, D, S)})
      ->
    %s2 = bmm(view(%q) {shape=(B*G, R*L, D)}, view(permute(%k)) {shape=(B*G, D, S)})
    %s  = view(%s2) {shape=(B*G*R, L, S)}

and the same for the values' matmul (``bmm(P, view(%vr))``, no permute). Multi-query
attention (one key head; Falcon) broadcasts it to every query head with one ``expand``, a
view with a zero head stride that the matmul kernel reads as a copy: the same rewrite, G = 1.
Each output element is the same sum of the same products; only the copies go, and each
matmul is R times taller and R times fewer (HF Llama, 8 query heads on 4 key heads: 8
matmuls of 128 rows become 4 of 256). Where the queries are not laid out to stack as a
view, the executor copies them, which is no more than the copy of the repeated keys it
replaces (the queries are R heads of L rows, the repeated keys R heads of S rows).

A fused attention call (``kiln::attention``, which the attention pass made of the chain, or
ATen's CPU flash attention, as HF's sdpa path with a padding mask calls it) reads the shared
heads themselves: its keys and values become the G heads before ``repeat_kv``, and
its query head ``g*R + r`` reads head ``g`` (its kernel indexes them so, `kiln.kernels.attention`;
its definition repeats them, `kiln.ir.fused.attention`). HF Llama at 128 tokens copied its
repeated keys and values in 60 + 19 us a layer before the call. With fewer queries than a
vector has lanes (a decode step), kiln's call then takes the R query heads of a group as R
times the queries of one head (`few_queries_per_shared_head`): its kernel's lanes run over
queries.
"""

from __future__ import annotations

import math

import torch

from kiln.ir import fused
from kiln.ir.attrs import CallAttrs, Operand, PermuteAttrs, ShapeAttrs
from kiln.ir.graph import Graph, Node, Value, transform
from kiln.ir.ops import Op
from kiln.ir.semantics import lower_node, run_call
from kiln.ir.types import TensorType
from kiln.options import Options

__all__ = ["bmm_per_shared_head", "few_queries_per_shared_head", "per_shared_head"]

_TRANSPOSE_LAST = (0, 1, 3, 2)


def per_shared_head(graph: Graph, options: Options | None = None) -> Graph:
    """`attention_reads_shared_heads`, `few_queries_per_shared_head`, then
    `bmm_per_shared_head`: the pipeline's pass."""
    graph = few_queries_per_shared_head(attention_reads_shared_heads(graph))
    return bmm_per_shared_head(graph, options)


def attention_reads_shared_heads(graph: Graph, options: Options | None = None) -> Graph:
    """Every attention call (`_READS_SHARED_HEADS`) whose keys and values repeat their heads
    alike (`_repeated_heads`: R times each of G) reading the G heads instead."""
    del options

    def rewrite(node: Node, inputs: tuple[Value, ...]) -> list[Value] | None:
        if not (node.op is Op.CALL and isinstance(node.attrs, CallAttrs)
                and node.attrs.target in _READS_SHARED_HEADS and len(node.attrs.args) >= 3
                and all(isinstance(a, Operand) for a in node.attrs.args[:3])):
            return None
        at_k, at_v = node.attrs.args[1].index, node.attrs.args[2].index
        k, v = _repeated_heads(inputs[at_k]), _repeated_heads(inputs[at_v])
        if k is None or v is None or k[1] != v[1] \
                or k[0].type.shape[1] != v[0].type.shape[1]:
            return None
        operands = list(inputs)
        operands[at_k], operands[at_v] = k[0], v[0]
        return list(Node(Op.CALL, tuple(operands), node.attrs, node.types, node.name).outputs)
    return transform(graph, rewrite)


# below this many queries a head, a fused call takes a shared head's query heads as its
# queries: the generated kernel's lanes run over queries (blocks of 32 on AVX-512), so a
# decode step's one query a head left 31 of 32 lanes padding, and a group of R heads fills R
QUERIES_STACKED_BELOW = 16


def few_queries_per_shared_head(graph: Graph, options: Options | None = None) -> Graph:
    """Every ``kiln::attention`` call with fewer than `QUERIES_STACKED_BELOW` queries that
    reads G shared key/value heads for G*R query heads, and no mask or one that differs
    neither by head nor by query, as a call over the G heads whose R*L queries are the
    group's (a decode step)::

        %o = attention(%q: [B, G*R, L, E], %k: [B, G, S, E], %v, mask, scale)
          ->
        %o2 = attention(view(%q) {shape=(B, G, R*L, E)}, %k, %v, mask, scale)
        %o = view(%o2) {shape=(B, G*R, L, Ev)}

    Query head g*R + r read head g; each query's row of scores and its softmax are its own,
    so every output is the same sum as before."""
    del options

    def rewrite(node: Node, inputs: tuple[Value, ...]) -> list[Value] | None:
        if not (node.op is Op.CALL and isinstance(node.attrs, CallAttrs)
                and node.attrs.target is fused.attention._opoverload
                and len(node.attrs.args) == 5 and len(node.outputs) == 1):
            return None
        q_arg, k_arg, v_arg, mask_arg, _ = node.attrs.args
        if not all(isinstance(a, Operand) for a in (q_arg, k_arg, v_arg)):
            return None
        q, k = inputs[q_arg.index], inputs[k_arg.index]
        if len(q.type.shape) != 4 or len(k.type.shape) != 4:
            return None
        batch, heads, queries, depth = q.type.shape
        groups = k.type.shape[1]
        if groups >= heads or heads % groups or queries >= QUERIES_STACKED_BELOW:
            return None
        if isinstance(mask_arg, Operand):  # (the same row of the mask for every query)
            mask = inputs[mask_arg.index].type.shape
            full = (1,) * (4 - len(mask)) + tuple(mask)
            if len(full) != 4 or full[1] != 1 or full[2] != 1:
                return None
        elif mask_arg is not None:
            return None
        stacked = heads // groups * queries
        operands = list(inputs)
        operands[q_arg.index] = _view(q, (batch, groups, stacked, depth), f"{node.name}_q")
        ev = node.type.shape[3]
        out = Node(Op.CALL, tuple(operands), node.attrs,
                   (TensorType((batch, groups, stacked, ev), node.type.dtype),),
                   node.name).out()
        return [_view(out, node.type.shape, f"{node.name}_heads")]
    return transform(graph, rewrite)


# attention calls that take keys and values with fewer heads than the queries, each shared by
# a group of query heads: kiln's (`kiln.ir.fused.attention`) and ATen's CPU flash attention
# (the op HF's sdpa path is captured as), which does so without a flag
_READS_SHARED_HEADS = (fused.attention._opoverload,
                       torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)


def _repeated_heads(x: Value) -> tuple[Value, int] | None:
    """``(k, R)`` where ``x``, f32[B, G*R, S, D], is k: [B, G, S, D] with each head repeated
    R times (``expand(unsqueeze(k, 2))`` merged by views: HF's ``repeat_kv``), or one head
    broadcast to all (``expand(k)``, G = 1); else None. Between the expand and ``x``, any
    views, permutes and copies that together merge (G, R) as ``reshape`` does: checked by
    running them on the element indices (before the views are simplified, the attention
    pass leaves a transpose and its inverse there)."""
    chain: list[Node] = []
    e = x
    while e.node.op in (Op.VIEW, Op.PERMUTE, Op.CLONE):
        chain.append(e.node)
        e = e.node.inputs[0]
    if e.node.op is not Op.EXPAND or len(x.type.shape) != 4:
        return None
    batch, heads, s, d = x.type.shape
    if len(e.type.shape) == 5:
        u = e.node.inputs[0]
        if u.node.op is not Op.UNSQUEEZE or u.node.attrs.dim not in (2, -3):  # type: ignore
            return None
        k = u.node.inputs[0]
        _, groups, repeats, _, _ = e.type.shape
    elif len(e.type.shape) == 4:  # (multi-query: one head broadcast)
        k, groups, repeats = e.node.inputs[0], 1, heads
    else:
        return None
    if repeats < 2 or groups * repeats != heads or k.type.shape != (batch, groups, s, d) \
            or math.prod(e.type.shape) != math.prod(x.type.shape) \
            or any(len(n.inputs) != 1 for n in chain):
        return None
    index = torch.arange(math.prod(e.type.shape), dtype=torch.int32).reshape(e.type.shape)
    moved = index
    for node in reversed(chain):
        moved = run_call(lower_node(node), [moved], "cpu")[0]
    return (k, repeats) if torch.equal(moved, index.reshape(x.type.shape)) else None


def bmm_per_shared_head(graph: Graph, options: Options | None = None) -> Graph:
    """Every bmm whose right operand repeats heads (`_shared_heads`) as one per shared head."""
    del options  # (the pass has no settings)
    if not any(n.op is Op.BMM and _shared_heads(n.inputs[1]) for n in graph.nodes):
        return graph

    def rewrite(node: Node, inputs: tuple[Value, ...]) -> list[Value] | None:
        if node.op is not Op.BMM:
            return None
        found = _shared_heads(inputs[1])
        return None if found is None else _per_shared_head(node, inputs[0], *found)
    return transform(graph, rewrite)


def _shared_heads(b: Value) -> tuple[Value, int, bool] | None:
    """``(k, R, transposed)`` where ``b``, f32[B*G*R, P, N], is k: [B, G, S, D] with each
    head repeated R times: ``view(permute(view(expand(unsqueeze(k, 2)))))`` (HF's
    ``repeat_kv``; the permute swaps the last two dims where ``transposed``, and is optional
    with the middle view; a copy of the expanded heads may come before that view), or
    ``view(expand(k))`` with one head (G = 1) broadcast to all (multi-query attention:
    Falcon); else None."""
    if b.node.op is not Op.VIEW or len(b.type.shape) != 3:
        return None
    x = b.node.inputs[0]
    transposed, merged = False, None  # (walked down: the permute comes after the merge)
    # (a copy of the heads, as ``reshape`` captures it, is read through)
    while x.node.op in (Op.CLONE, Op.PERMUTE, Op.VIEW):
        if x.node.op is Op.PERMUTE:
            dims = tuple(x.node.attrs.dims)  # type: ignore[attr-defined]
            if transposed or merged is not None or dims != _TRANSPOSE_LAST:
                return None
            transposed = True
        elif x.node.op is Op.VIEW:
            if merged is not None or len(x.type.shape) != 4:
                return None
            merged = x.type.shape
        x = x.node.inputs[0]
    if x.node.op is not Op.EXPAND:
        return None
    if len(x.type.shape) == 4 and merged is None:  # one head, broadcast
        k = x.node.inputs[0]
        batch, repeats, s, d = x.type.shape
        groups = 1
        if k.type.shape != (batch, 1, s, d):
            return None
    elif len(x.type.shape) == 5 and (merged is not None or not transposed):
        u = x.node.inputs[0]
        if u.node.op is not Op.UNSQUEEZE or u.node.attrs.dim not in (2, -3):  # type: ignore
            return None
        k = u.node.inputs[0]
        batch, groups, repeats, s, d = x.type.shape
        if k.type.shape != (batch, groups, s, d):
            return None
        if merged is not None and merged != (batch, groups * repeats, s, d):
            return None
    else:
        return None
    want = (batch * groups * repeats, *((d, s) if transposed else (s, d)))
    return (k, repeats, transposed) if repeats > 1 and b.type.shape == want else None


def _per_shared_head(node: Node, a: Value, k: Value, repeats: int, transposed: bool
                     ) -> list[Value]:
    _, rows, inner = a.type.shape
    batch, groups, s, d = k.type.shape
    shared = batch * groups
    dtype = node.type.dtype
    if transposed:
        k = Node(Op.PERMUTE, (k,), PermuteAttrs(_TRANSPOSE_LAST),
                 (TensorType((batch, groups, d, s), dtype),), f"{node.name}_kt").out()
    n = node.type.shape[2]
    # one shared head (multi-query, batch 1): a matmul, which the GEMM kernels take
    lead = (shared,) if shared > 1 else ()
    stacked = _view(a, (*lead, repeats * rows, inner), f"{node.name}_stacked")
    shared_b = _view(k, (*lead, *k.type.shape[2:]), f"{node.name}_shared")
    out = Node(Op.BMM if lead else Op.MM, (stacked, shared_b), node.attrs,
               (TensorType((*lead, repeats * rows, n), dtype),), node.name).out()
    return [_view(out, node.type.shape, f"{node.name}_heads")]


def _view(value: Value, shape: tuple[int, ...], name: str) -> Value:
    return Node(Op.VIEW, (value,), ShapeAttrs(shape),
                (TensorType(shape, value.type.dtype),), name).out()
