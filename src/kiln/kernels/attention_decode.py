"""Attention for a few queries (a decode step's one token, or a shared key head's stacked
query heads): ``out = softmax(Q Kᵀ · c) V`` with the keys, not the queries, along the work.

The kernel of `kiln.kernels.attention_schedule` puts a block of queries in the vector lanes
(keys by queries), which one query fills 1 lane of 16 of: each key then costs E
multiply-adds for one score. Here each (batch, head, query) is a row, as a row kernel's
(`kiln.kernels.rows_schedule`)::

    for b, h in parallel(B x H):                  # a head's K and V read once, in order
      for i in range(L):
        for j in range(S):                        # the score of key j: the head dimension
          part[0:16] = sum over E / 16 chunks of  #   in the lanes (E / 16 vector fmas),
              K[b, h, j, chunk] * Q[b, h, i, chunk]   # folded in halving vector steps
          scores[j] = fold(part)
        row_max = max(scores * c)                 # lane partials over the keys, folded
        probs = exp(scores * c - row_max); row_sum = sum(probs)
        pv[0:Ev] = sum_j probs[j] * V[b, h, j, :]  # Ev / 16 vector fmas a key
        out[b, h, i, :] = pv / row_sum

Zen 4, 2 threads, 12 heads x 64, one query: 128 keys 8 us (the query-block kernel 24,
ATen's fused call 24); 1024 keys 41 us (167 and 96). Numerics are the decomposition's, as
the other kernel's: the maximum over the scaled scores, the division after the product.

A mask is added to the scaled scores where it lies, read along the keys as the scores are
(no transposed copy, unlike the query-block kernel): one computed at run time (a padded
batch's, float or bool) as the model lays it out, a constant one laid out once as
[MB, MH, L, S] (`attention_schedule.laid_mask`). ``is_causal`` sets the keys after each
query to -inf, as ATen's does (key j > query i).
"""

from __future__ import annotations

import dataclasses
import math

from kiln.ir.types import DType
from kiln.kernels.attention_schedule import (
    AttentionShape,
    RuntimeMask,
    divided,
    operand_buffers,
)
from kiln.kernels.plan import BoolsAsBytes, Compact, KernelPlan, Recipe
from kiln.kernels.rows_schedule import LANES, tree_combine
from kiln.tir.nodes import BinOp, CmpOp, Expr, PrimFunc, const, contiguous_strides
from kiln.tir.schedule import Schedule
from kiln.tir.te import Builder, cmp, select, softmax_exp

__all__ = ["DECODE_QUERIES", "decode_attention_func", "decode_attention_plan", "decode_shape",
           "decodes"]

F32 = DType.F32
# fewer queries than this run this kernel: the query-block kernel's narrowest block is one
# vector of them (16 fp32 lanes on AVX-512)
DECODE_QUERIES = 16


def decodes(shape: AttentionShape) -> bool:
    """Whether the call runs this kernel: fewer than `DECODE_QUERIES` queries."""
    return shape.queries < DECODE_QUERIES


def decode_shape(shape: AttentionShape) -> AttentionShape:
    """``shape`` as this kernel reads it: a constant mask as a mask read where it lies,
    [MB, MH, L, S] contiguous, the layout `attention_schedule.laid_mask` gives it once (the
    query-block kernel's transposed panels would put the keys a row of queries apart)."""
    if shape.mask is None or shape.runtime_mask is not None:
        return shape
    dims = (*shape.mask, shape.queries, shape.keys)
    return dataclasses.replace(shape, runtime_mask=RuntimeMask(dims, contiguous_strides(dims)),
                               mask_panel=0)


def decode_attention_func(shape: AttentionShape, name: str = "attention") -> PrimFunc:
    """The compute definition: per (batch, head, query) row, its scores over the keys, their
    maximum, exponentials and sum, the product with V and the division. A mask is read
    where it lies (``shape.runtime_mask``; `decode_shape` makes a constant one so)."""
    bt, h, n_q, n_k = shape.batch, shape.heads, shape.queries, shape.keys
    e, ev = shape.depth, shape.v_depth
    if shape.mask is not None and shape.runtime_mask is None:
        raise ValueError("the decode kernel reads its mask where it lies: give the shape a "
                         "runtime_mask (decode_shape does, for a constant mask)")
    b = Builder()
    q, k, v, kv_head = operand_buffers(b, shape)
    mask = shape.runtime_mask
    m = mask.param(b) if mask is not None else None
    out = b.buffer("out", (bt, n_q, h, ev) if shape.heads_inner else (bt, h, n_q, ev), F32)
    scores = b.temp("scores", (bt, h, n_q, n_k), F32)
    row_max = b.temp("row_max", (bt, h, n_q), F32)
    probs = b.temp("probs", (bt, h, n_q, n_k), F32)
    row_sum = b.temp("row_sum", (bt, h, n_q), F32)
    pv = b.temp("pv", (bt, h, n_q, ev), F32)
    c = const(shape.scale, F32)

    def scaled(bi: Expr, hi: Expr, qi: Expr, kj: Expr) -> Expr:  # the softmax's input
        x = scores[bi, hi, qi, kj] * c
        if mask is not None and m is not None:
            x = x + mask.added(m, bi, hi, qi, kj)
        return select(cmp(CmpOp.LE, kj, qi), x, -math.inf) if shape.causal else x
    b.reduce("scores", scores, (e,), BinOp.ADD,
             lambda w, r: k[w[0], kv_head(w[1]), w[3], r[0]] * q[w[0], w[1], w[2], r[0]])
    b.reduce("max", row_max, (n_k,), BinOp.MAX,
             lambda w, r: scaled(w[0], w[1], w[2], r[0]))
    b.compute("exp", probs, lambda w: softmax_exp(
        scaled(w[0], w[1], w[2], w[3]) - row_max[w[0], w[1], w[2]]))
    b.reduce("sum", row_sum, (n_k,), BinOp.ADD, lambda w, r: probs[w[0], w[1], w[2], r[0]])
    b.reduce("pv", pv, (n_k,), BinOp.ADD,
             lambda w, r: probs[w[0], w[1], w[2], r[0]] * v[w[0], kv_head(w[1]), r[0], w[3]])
    divided(b, name, out, pv, row_sum, shape.heads_inner)
    return PrimFunc(name, (q, k, v) if m is None else (q, k, v, m), (out,), b.body())


def schedule_decode(func: PrimFunc, heads_inner: bool = False) -> Schedule:
    """The schedule of the module docstring, as primitives."""
    sch = Schedule(func)
    out_block = sch.blocks()[-1]  # (the division, named after the function)
    partials = {}
    for block in ("scores", "max", "sum"):  # lane partials of the reductions
        _, lane = sch.split(sch.get_loops(block)[-1], [None, LANES])
        partials[block] = sch.rfactor(block, lane)
    if heads_inner:  # (the output [B, L, H, Ev]: its loops put the heads outside again)
        batches, queries, heads, _ = sch.get_loops(out_block)
        sch.reorder(heads, queries)
    else:
        batches, heads, queries, _ = sch.get_loops(out_block)
    for block in reversed([n for n in sch.blocks() if n != out_block]):  # consumers first
        sch.compute_at(block, queries)
    # a key's lane partials and their fold in one loop over the keys: 16 floats in flight
    at = sch.get_loops(partials["scores"]).index(queries) + 1
    for level in range(4):  # (the unit loops compute_at made, then the keys)
        sch.fusion(sch.get_loops(partials["scores"])[at + level],
                   sch.get_loops("scores")[at + level])
    for block, rf in partials.items():
        init = sch.decompose_reduction(rf, sch.get_loops(rf)[-2])
        sch.vectorize(sch.get_loops(init)[-1])
        sch.vectorize(sch.get_loops(rf)[-1])
        tree_combine(sch, block)
    sch.vectorize(sch.get_loops("exp")[-1])
    # the product: the keys outside, a row of V in the lanes
    depth, keys = sch.get_loops("pv")[-2:]
    sch.reorder(keys, depth)
    init = sch.decompose_reduction("pv", keys)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.vectorize(depth)
    sch.vectorize(sch.get_loops(out_block)[-1])
    sch.parallel(sch.fuse(batches, heads) if func.params[0].shape[0] > 1 else heads)
    return sch


def decode_attention_plan(shape: AttentionShape, name: str = "attention") -> KernelPlan:
    """The kernel as a plan: `decode_attention_func`'s program, the Trace of
    `schedule_decode`, and buffer compaction (the temporaries shrink to a row's)."""
    program = decode_attention_func(shape, name)
    sch = schedule_decode(program, shape.heads_inner)
    bools = shape.runtime_mask is not None and shape.runtime_mask.boolean
    return KernelPlan(Recipe.ATTENTION, program, sch.trace,
                      (Compact(), BoolsAsBytes()) if bools else (Compact(),),
                      notes=f"# kiln.kernels.decode_attention_plan({shape})",
                      scheduled=sch.func)
