"""Attention as one loop program: ``out = softmax(Q Kᵀ · c + M) V`` for every (batch,
head), the L x S scores never leaving a core's cache, recorded as a replayable Trace.

``attention_plan(shape, config)`` starts from the compute definition (`attention_func`, six
blocks: the scores, their row maximum, the exponentials, their sum, the product with V and
the division) and schedules it with primitives into::

    for b in range(B):
      for h in parallel(H):                      # a head's K and V stay in its core's L2
        (K_local, V_local: f32[S, E] local)      # copied, rows adjacent, where their rows
                                                 #   lie apart (`packs_head`)
        for qo in range(L / QB):                 # QB queries at a time (split; the loop
                                                 #   on the threads where H is too few)
          alloc Q_local: f32[E, QB] local        # cache_read + transform_layout: Qᵀ packed
          for jo in range(S / MR_KEYS):          # scoresᵀ[j, i] = K[j, :] . Q[i, :]
            fma_tile MR_KEYS x QB: a = K[j, d] (broadcast), b = Q_local[d, :] (vectors)
            max[i] = max(max[i], p[j, i]) for the tile's j  # p = scoresᵀ * c (+ Mᵀ)
          probs[j, i] = exp(p[j, i] - max[i]); sum[i] += probs[j, i]   # QB/16 vectors a j
          for io in range(QB / MR_ROWS):         # pv[i, :] = sum_j probs[j, i] V[j, :]
            fma_tile MR_ROWS x Ev: a = probs[j, i] (broadcast), b = V[j, :] (vectors)
          out[i, :] = pv[i, :] / sum[i]

The scores are kept transposed (keys by queries), so each micro-kernel reads its operands
where they lie: K's rows broadcast along the head dimension, V's rows as vectors, and the
probabilities as the second product's broadcasts; only the QB x E block of Q is packed.
Between the products, the softmax's reductions run over the keys with the queries in the
vector lanes: no horizontal reductions. A block of QB = 32 queries holds 32 x S floats of
scores and as many of probabilities (188 KiB each for Whisper's 1500 keys): L2-resident.

A constant additive mask M (a causal mask, T5's position bias; optional) is read as the
scores are, keys by queries: `transposed_mask` lays it out so once, at compile time, in
panels [S, QB] of the kernel's block of queries (``mask_panel``), which each block reads in
order (as rows of L, a block's QB columns of each: 8 x 1500 x 1500 x 64 with a causal-style
mask 34.0 ms against 26.8 in panels and 25.9 without a mask; 12 x 197 0.90 against 0.79). A mask
the model computes at run time (`RuntimeMask`: a padded batch's, float or bool) is read where
it lies and transposed by the kernel: where the heads share it (a padding mask), once a call,
before the heads run, into a panel [S, QB] per block of queries (block ``mask_once``: each
block then reads its panel in order; read as rows of L, Whisper-sized 8 x 1500 x 1500 took
40 ms against 26.5 unmasked, as panels 30.5, ATen's masked call 37); where each head has its
own, a block ``mask`` copies the block's QB rows into a local pack, zero-padded past L. The
maximum and the exponentials read either as they would the constant one. ATen's
``is_causal`` (``causal``) sets the scores of the keys after each query to -inf instead;
over as many keys as queries, a block of queries also stops at its last query's key (the
scores' key tiles, the exponentials and the product: `StopAtDiagonal`), about half the work
at long sequences (Zen 4, 2 threads, 12 heads x 64: 1024 tokens 19.0 -> 10.1 ms, ATen's
causal call 15.4; 32 heads x 2048: 295 -> 124, ATen 147).

Numerics are the decomposition's (``softmax(Q Kᵀ · c + M) @ V`` as capture writes it): the
maximum is taken over the scaled scores, so a NaN score makes its row NaN, an infinite one
gives inf - inf = NaN, as the decomposition does (ATen's fused kernel returns other values
there, which is why `kiln.ir.fused.attention` checks its inputs at run time). Only the order
of the sums (and the division after the product rather than before) differs.

Tails: a last block of queries shorter than QB and a last tile of keys shorter than MR_KEYS
run in versioned copies (`kiln.tir.tails`); the padded queries of the last block compute on
zeros (`plan.ZeroPadding` of Q's pack) and are never stored.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kiln.codegen.isa import Isa
from kiln.ir.types import DType
from kiln.kernels.plan import (
    Compact,
    DropDeadGuards,
    KernelPlan,
    PostPass,
    Recipe,
    ShrinkTails,
    SimplifyIndices,
    StopAtDiagonal,
    Tensorize,
    VersionTails,
    ZeroPadding,
)
from kiln.tir.nodes import BinOp, Buffer, CmpOp, Expr, PrimFunc, Scope, const
from kiln.tir.schedule import BlockRV, LoopRV, Schedule
from kiln.tir.te import Builder, cmp, select, softmax_exp

__all__ = ["AttentionConfig", "AttentionShape", "RuntimeMask", "attention_func", "attention_plan",
           "default_attention_config", "divided", "laid_mask", "operand_buffers", "packs_head",
           "schedule_attention", "stops_at_diagonal", "transposed_mask"]

F32 = DType.F32
# queries per block, in vectors: as many of 4, 3 or 2 as leave the fewest padded queries in
# the last block (its product tiles run partly empty), the wider on a tie. Zen 4, 2 threads,
# 16-lane vectors, 12 heads x 64 (keys-tile rows x block x product rows): 128 tokens 48 x 6
# x 6 0.376 ms, 64 x 6 x 4 0.290, 32 x 6 x 4 0.294; 197 tokens 48 0.91, 64 0.79, 32 0.75;
# Whisper-base's 8 x 1500 x 1500 x 64: 48 26.6-26.9 ms, 64 26.6-26.9, 32 25.3-25.5
QUERY_VECTORS = (4, 3, 2)
KEY_ROWS = 6  # rows of the scores' register tile (keys), where the registers allow


@dataclass(frozen=True)
class RuntimeMask:
    """A mask computed at run time, read where it lies: its own dims (up to 4, broadcasting
    to [B, H, L, S] as ATen's do: each 1 or the full extent) and element strides; float
    (additive) or bool (True where a query attends: 0, else -inf)."""

    dims: tuple[int, ...]
    strides: tuple[int, ...]
    boolean: bool = False

    def index(self, batch: Expr, head: Expr, query: Expr, key: Expr) -> tuple[Expr | int, ...]:
        """M's index for the scores' [batch, head, query, key] (0 where it broadcasts)."""
        full = (1,) * (4 - len(self.dims)) + self.dims
        at = tuple(i if n > 1 else 0 for i, n in zip((batch, head, query, key), full))
        return at[4 - len(self.dims):]

    def param(self, b: Builder) -> Buffer:
        """M as a parameter of ``b``, where and as it lies."""
        m = _param(b, "M", self.dims, self.strides)
        return dataclasses.replace(m, dtype=DType.BOOL) if self.boolean else m

    def added(self, m: Buffer, batch: Expr, head: Expr, query: Expr, key: Expr) -> Expr:
        """What the mask adds to the scaled score of [batch, head, query, key]: its value, or
        for a bool one 0 where the query attends the key and -inf where it does not."""
        x = m[self.index(batch, head, query, key)]
        return select(x, const(0.0, F32), -math.inf) if self.boolean else x


@dataclass(frozen=True)
class AttentionShape:
    """The operands: Q [B, H, L, E], K [B, H, S, E], V [B, H, S, Ev] read with the given
    element strides (views of projections), the output [B, H, L, Ev] contiguous (or
    [B, L, H, Ev]: ``heads_inner``)."""

    batch: int
    heads: int
    queries: int  # L
    keys: int  # S
    depth: int  # E
    v_depth: int  # Ev
    scale: float
    q_strides: tuple[int, ...] | None = None
    k_strides: tuple[int, ...] | None = None
    v_strides: tuple[int, ...] | None = None
    # an additive mask's batch and head extents (each 1, broadcast, or B and H), where there
    # is one: a constant's parameter M is laid out as the scores are, keys by queries
    # (`transposed_mask`, once per constant mask; see ``mask_panel``)
    mask: tuple[int, int] | None = None
    # the mask as the model computes it (not a constant): M is then read where it lies, as
    # `RuntimeMask` says, and transposed by the kernel (once a call where the heads share
    # it, else a block of queries at a time)
    runtime_mask: RuntimeMask | None = None
    # the keys after each query masked out (-inf), as ATen's ``is_causal``: key j > query i
    causal: bool = False
    # the output laid out [B, L, H, Ev] (contiguous): the heads' results side by side, as
    # the model's transpose(1, 2) before its reshape to [B, L, H * Ev] wants them
    heads_inner: bool = False
    # grouped-query attention (ATen's ``enable_gqa``): K and V have this many heads, query
    # head h reads key head h // (H / KV); 0: as many as Q
    kv_heads: int = 0
    # a constant mask laid out in panels of this many queries (the kernel's block):
    # [MB, MH, ceil(L / P), S, P], each block's part read in order; 0: [MB, MH, S, L]
    mask_panel: int = 0


@dataclass(frozen=True)
class AttentionConfig:
    """Tile sizes: QB queries a block, the scores' register tile MR_KEYS keys x QB queries,
    the product's MR_ROWS queries x Ev; ``lanes`` the vector width both are tensorized on."""

    qb: int = 32
    mr_keys: int = KEY_ROWS
    mr_rows: int = 4
    lanes: int = 16
    # the threads share each head's blocks of queries, not the heads (fewer heads than
    # threads, or heads that fall less evenly on them than the blocks)
    split_queries: bool = False


def default_attention_config(isa: Isa, v_depth: int, queries: int, heads: int = 0,
                             threads: int = 1, stops: bool = False) -> AttentionConfig | None:
    """The tiles for ``isa``'s registers and ``queries`` rows of Q, and whether ``threads``
    share the blocks of queries rather than the ``heads`` (where the blocks fall more evenly
    on them); None where the product's tile cannot hold one row of Ev in registers (or the
    ISA has no vectors). Where each block ``stops`` at its last query's key (causal), the
    narrowest block, whose tile across the diagonal computes least that is masked: Zen 4, 2
    threads, causal, 12 heads x 64, blocks of 32 / 48 / 64 queries: 128 tokens 0.21 / 0.25 /
    0.24 ms, 256 0.71 / 0.87 / 0.75, 512 2.60 / 2.83 / 2.66; 8 heads x 2048 26.9 / 29.3 /
    27.3 (without the mask the three within noise, as the table above QUERY_VECTORS)."""
    lanes = isa.f32_lanes
    if lanes < 4 or v_depth % lanes:
        return None
    vectors = min(QUERY_VECTORS) if stops else \
        min(QUERY_VECTORS, key=lambda n: -queries % (n * lanes))  # (first on a tie)
    free = isa.registers - 2  # (a broadcast and a spare)
    mr_keys = min(KEY_ROWS, (free - vectors) // vectors)
    ev_vectors = v_depth // lanes
    mr_rows = (free - ev_vectors) // ev_vectors
    if mr_keys < 1 or mr_rows < 1:
        return None
    qb = vectors * lanes
    mr_rows = max(r for r in range(1, mr_rows + 1) if qb % r == 0)  # (whole tiles in a block)
    split = heads > 0 and _evenness(-(-queries // qb), threads) > _evenness(heads, threads)
    return AttentionConfig(qb, mr_keys, mr_rows, lanes, split)


def _evenness(tasks: int, threads: int) -> float:
    """The share of the threads' time that ``tasks`` equal tasks keep busy."""
    return tasks / (-(-tasks // threads) * threads)


def operand_buffers(b: Builder, shape: AttentionShape) -> tuple[Buffer, Buffer, Buffer,
                                                               Callable[[Expr], Expr]]:
    """Q, K and V as parameters of ``b`` with the strides the run time gives them, and the
    key head a query head reads (grouped-query attention: head h reads h // (H / KV))."""
    h, kv = shape.heads, shape.kv_heads or shape.heads
    q = _param(b, "Q", (shape.batch, h, shape.queries, shape.depth), shape.q_strides)
    k = _param(b, "K", (shape.batch, kv, shape.keys, shape.depth), shape.k_strides)
    v = _param(b, "V", (shape.batch, kv, shape.keys, shape.v_depth), shape.v_strides)

    def kv_head(hi: Expr) -> Expr:
        return hi if kv == h else hi // (h // kv)
    return q, k, v, kv_head


def _param(b: Builder, base: str, dims: tuple[int, ...],
           strides: tuple[int, ...] | None) -> Buffer:
    buf = b.buffer(base, dims, F32)
    return buf if strides is None else dataclasses.replace(buf, strides=tuple(strides))


def divided(b: Builder, name: str, out: Buffer, pv: Buffer, row_sum: Buffer,
            heads_inner: bool) -> None:
    """The output block, named ``name``: the product with V divided by the row's sum, written
    [B, H, L, Ev] or, ``heads_inner``, [B, L, H, Ev]."""
    if heads_inner:  # out[b, i, h, :]
        b.compute(name, out, lambda w: pv[w[0], w[2], w[1], w[3]] / row_sum[w[0], w[2], w[1]])
    else:
        b.compute(name, out, lambda w: pv[w[0], w[1], w[2], w[3]] / row_sum[w[0], w[1], w[2]])


def attention_func(shape: AttentionShape, name: str = "attention") -> PrimFunc:
    """The compute definition: scoresᵀ, their maximum, exponentials, sum, the product with V
    and the division, one block each (scores and probabilities kept keys by queries)."""
    bt, h, n_q, n_k = shape.batch, shape.heads, shape.queries, shape.keys
    e, ev = shape.depth, shape.v_depth
    b = Builder()
    q, k, v, kv_head = operand_buffers(b, shape)
    m = None
    panel, runtime = shape.mask_panel, shape.runtime_mask
    if runtime is not None:  # (M as the model lays it out; the kernel transposes it below)
        assert shape.mask is not None
        m = runtime.param(b)
    elif shape.mask is not None:  # (laid out by `transposed_mask`)
        m = b.buffer("M", (*shape.mask, -(-n_q // panel), n_k, panel) if panel else
                     (*shape.mask, n_k, n_q), F32)
    out = b.buffer("out", (bt, n_q, h, ev) if shape.heads_inner else (bt, h, n_q, ev), F32)
    scores = b.temp("scores", (bt, h, n_k, n_q), F32)
    row_max = b.temp("row_max", (bt, h, n_q), F32)
    probs = b.temp("probs", (bt, h, n_k, n_q), F32)
    row_sum = b.temp("row_sum", (bt, h, n_q), F32)
    pv = b.temp("pv", (bt, h, n_q, ev), F32)
    c = const(shape.scale, F32)

    def mask_at(bi, hi, key, query):  # noqa: ANN001, ANN202 - the additive mask's value
        assert m is not None and shape.mask is not None
        mb, mh = shape.mask
        bi, hi = bi if mb > 1 else 0, hi if mh > 1 else 0
        if runtime is None:
            return m[bi, hi, query // panel, key, query % panel] if panel \
                else m[bi, hi, key, query]
        return runtime.added(m, bi, hi, query, key)

    shared = runtime is not None and shape.mask is not None and shape.mask[1] == 1 and h > 1
    if shared:  # Mᵀ once a call, where the heads share it (a padding mask)
        mask_t = b.temp("mask_t", (*shape.mask, n_k, n_q), F32)  # type: ignore[misc]
        b.compute("mask_once", mask_t, lambda w: mask_at(w[0], w[1], w[2], w[3]))
    elif runtime is not None:  # Mᵀ a block of queries at a time (one per head)
        mask_t = b.temp("mask_t", (bt, h, n_k, n_q), F32)
        b.compute("mask", mask_t, lambda w: mask_at(w[0], w[1], w[2], w[3]))

    def scaled(bi, hi, key, query):  # noqa: ANN001, ANN202 - the softmax's input, as the graph's
        x = scores[bi, hi, key, query] * c
        if shared:
            mb = shape.mask[0]  # type: ignore[index]
            x = x + mask_t[bi if mb > 1 else 0, 0, key, query]
        elif runtime is not None:
            x = x + mask_t[bi, hi, key, query]
        elif m is not None:
            x = x + mask_at(bi, hi, key, query)
        return select(cmp(CmpOp.LE, key, query), x, -math.inf) if shape.causal else x
    b.reduce("scores", scores, (e,), BinOp.ADD,
             lambda w, r: k[w[0], kv_head(w[1]), w[2], r[0]] * q[w[0], w[1], w[3], r[0]])
    b.reduce("max", row_max, (n_k,), BinOp.MAX, lambda w, r: scaled(w[0], w[1], r[0], w[2]))
    b.compute("exp", probs, lambda w: softmax_exp(
        scaled(w[0], w[1], w[2], w[3]) - row_max[w[0], w[1], w[3]]))
    b.reduce("sum", row_sum, (n_k,), BinOp.ADD, lambda w, r: probs[w[0], w[1], r[0], w[2]])
    b.reduce("pv", pv, (n_k,), BinOp.ADD,
             lambda w, r: probs[w[0], w[1], r[0], w[2]] * v[w[0], kv_head(w[1]), r[0], w[3]])
    divided(b, name, out, pv, row_sum, shape.heads_inner)
    return PrimFunc(name, (q, k, v) if m is None else (q, k, v, m), (out,), b.body())


def laid_mask(mask: torch.Tensor, batch: int, heads: int, queries: int,
              keys: int) -> torch.Tensor:
    """A constant mask (any shape that broadcasts to [B, H, L, S]; a bool one, True where a
    query attends) as the additive one it stands for, expanded to [MB, MH, L, S] (a view),
    MB and MH 1 where it broadcasts there."""
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape).masked_fill_(~mask, -math.inf)
    full = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    mb = batch if full.shape[0] > 1 else 1
    mh = heads if full.shape[1] > 1 else 1
    return full.expand(mb, mh, queries, keys)


def transposed_mask(mask: torch.Tensor, batch: int, heads: int, queries: int,
                    keys: int, panel: int = 0) -> torch.Tensor:
    """A constant additive mask (any shape that broadcasts to [B, H, L, S]; a bool one, True
    where a query attends, as 0 and -inf) as the kernel's M reads it: [MB, MH, S, L]
    contiguous, MB and MH 1 where the mask broadcasts there; with ``panel``, in panels of
    that many queries, [MB, MH, ceil(L / panel), S, panel] (zeros past L)."""
    laid = laid_mask(mask, batch, heads, queries, keys)
    mb, mh = laid.shape[:2]
    if not panel:
        return laid.transpose(-1, -2).contiguous()
    blocks = -(-queries // panel)
    padded = torch.zeros(mb, mh, blocks * panel, keys)
    padded[:, :, :queries] = laid
    return padded.view(mb, mh, blocks, panel, keys).transpose(-1, -2).contiguous()


def schedule_attention(func: PrimFunc, config: AttentionConfig, heads_inner: bool = False,
                       uneven_blocks: bool = False) -> tuple[Schedule, list[str]]:
    """The schedule of the module docstring, as primitives. Also returns the loops whose
    bodies `kiln.tir.tails.version_tails` versions (the query block, the key tiles, the
    product's row tiles), the two micro-kernels' reduction loops, for `plan.Tensorize`
    (the second, the product's, over the keys), and the exponentials' loop over the keys.
    With ``uneven_blocks`` (causal: a block of queries stops at its last key), threads that
    share the blocks take them one at a time, as each is free."""
    sch = Schedule(func)
    out_block = sch.blocks()[-1]  # (the division, named after the function)
    if heads_inner:  # (the output [B, L, H, Ev]: its loops put the heads outside again)
        _, queries, heads, _ = sch.get_loops(out_block)
        sch.reorder(heads, queries)
    else:
        _, heads, queries, _ = sch.get_loops(out_block)
    q_block, _ = sch.split(queries, [None, config.qb])
    for block in ("pv", "sum", "exp", "max", "scores"):  # consumers first
        sch.compute_at(block, q_block)
    if "mask" in sch.blocks():  # a run-time mask's block transposed, keys outermost: the
        sch.compute_at("mask", q_block)  # block's rows of M read side by side, the pack in order
    if "mask_once" in sch.blocks():  # M transposed before the heads run, into a panel
        # [S, QB] per block of queries (each block's reads in order, not a row's QB of L)
        batches, heads_m, keys_m, queries_m = sch.get_loops("mask_once")
        queries_o, _ = sch.split(queries_m, [None, config.qb])
        sch.reorder(queries_o, keys_m)
        sch.parallel(sch.fuse(batches, heads_m, queries_o))
        sch.transform_layout("mask_once", "mask_t", [(0, "", 0), (1, "", 0), (3, "//", config.qb),
                                                     (2, "", 0), (3, "%", config.qb)])
    # scoresᵀ: MR_KEYS keys x QB queries a register tile, Q's block packed as [E, QB]
    keys, queries_s, depth = sch.get_loops("scores")[-3:]
    key_tile, key_row, s_store, s_init = _register_tile(sch, "scores", keys, queries_s, depth,
                                                        config.mr_keys)
    q_pack = sch.cache_read("scores", "Q", Scope.LOCAL)
    sch.compute_at(q_pack, q_block)
    sch.transform_layout("scores", "Q_local", [(0, "", 0), (1, "", 0), (3, "", 0), (2, "", 0)])
    sch.unroll(key_row)
    sch.vectorize(queries_s)
    # the row maximum and sum: keys outermost, the queries in the vector lanes; the maximum
    # folds each tile of scores right after its write-back (in L1), the sum each row of
    # exponentials as it is made (one pass over the probabilities)
    for block in ("max", "sum"):
        rows, keys_r = sch.get_loops(block)[-2:]
        sch.reorder(keys_r, rows)
    sch.split(sch.get_loops("max")[-2], [None, config.mr_keys])
    s_loops = sch.get_loops("scores")
    m_loops = sch.get_loops("max")
    at = s_loops.index(key_tile)
    for a, b in zip(s_loops[at - 2:at + 1], m_loops[at - 2:at + 1]):
        key_tile = sch.fusion(a, b)
    exp_loops, sum_loops = sch.get_loops("exp")[-4:-1], sch.get_loops("sum")[-4:-1]
    fused = [sch.fusion(a, b) for a, b in zip(exp_loops, sum_loops)]
    for block, keys_r in (("max", key_tile), ("sum", fused[-1])):
        init = sch.decompose_reduction(block, keys_r)
        sch.vectorize(sch.get_loops(init)[-1])
        sch.vectorize(sch.get_loops(block)[-1])
    sch.vectorize(sch.get_loops("exp")[-1])
    # the product: MR_ROWS queries x Ev a register tile, the probabilities broadcast
    rows_p, cols_p, keys_p = sch.get_loops("pv")[-3:]
    row_tile, row_in, p_store, p_init = _register_tile(sch, "pv", rows_p, cols_p, keys_p,
                                                       config.mr_rows)
    sch.unroll(row_in)
    sch.vectorize(cols_p)
    for name, block in (("K", "scores"), ("V", "pv")):
        if packs_head(func, name, config):  # the head's keys or values copied, rows adjacent
            pack = sch.cache_read(block, name, Scope.LOCAL)
            sch.compute_at(pack, heads)
            sch.vectorize(sch.get_loops(pack)[-1])
    for block in (s_init, s_store, p_init, p_store):
        rows_t, cols_t = sch.get_loops(block)[-2:]
        sch.unroll(rows_t)
        sch.vectorize(cols_t)
    sch.vectorize(sch.get_loops(out_block)[-1])
    if config.split_queries:
        sch.parallel(q_block, dynamic=uneven_blocks)
    else:
        sch.parallel(heads)
    return sch, [q_block.name, key_tile.name, row_tile.name, depth.name, keys_p.name,
                 fused[-1].name]


def packs_head(func: PrimFunc, operand: str, config: AttentionConfig) -> bool:
    """Whether a head's K (or V) is copied once, its rows adjacent, before its blocks of
    queries read it: where its rows are not adjacent where they lie (a view of a projection,
    a token's heads side by side) and more than one block reads them. The key tile's rows
    (and the product's V rows) a token stride apart defeat the hardware prefetcher, which
    stops at 4 KiB pages, and at a stride of 4 KiB share an L1 set. An AVX-512 Xeon, 2
    threads, 8 heads x 1500 x 64 as Whisper's encoder lays them out (Q and V a merged
    projection's, rows 4 KiB apart; K 2 KiB), interleaved: 62.2 ms, V copied 35.8; V
    copied 34.2, K too 28.5 (ATen's fused call 29.3); 12 x 512 x 64 (rows 3 KiB apart): V
    copied 0.954 of the time, K too 0.976 of that; 12 x 197 x 64 (seven blocks) 0.93, 0.99."""
    params = {b.name: b for b in func.inputs}
    buf, queries = params[operand], params["Q"].shape[2]
    return buf.strides is not None and buf.strides[2] != buf.shape[3] and queries > config.qb


def _register_tile(sch: Schedule, block: str, rows: LoopRV, cols: LoopRV, k: LoopRV,
                   rows_per_tile: int) -> tuple[LoopRV, LoopRV, BlockRV, BlockRV]:
    """``block``'s rows in tiles of ``rows_per_tile``, each tile's accumulators local across
    the reduction ``k`` (outside the tile's rows and columns), started by an init block and
    stored once: the tile loop, the rows within it, the store and the init."""
    tile, inner = sch.split(rows, [None, rows_per_tile])
    sch.reorder(tile, k, inner, cols)
    store = sch.cache_write(block, Scope.LOCAL)
    sch.reverse_compute_at(store, tile)
    return tile, inner, store, sch.decompose_reduction(block, k)


def stops_at_diagonal(shape: AttentionShape) -> bool:
    """Whether each block of queries stops at its last query's key: causal, over as many keys
    as queries (ATen's is_causal lets query i see the keys up to i)."""
    return shape.causal and shape.queries == shape.keys


@functools.lru_cache(maxsize=64)  # (a plan is immutable: a model's layers share one)
def attention_plan(shape: AttentionShape, config: AttentionConfig,
                   name: str = "attention") -> KernelPlan:
    """The attention kernel as a plan: `attention_func`'s program, the Trace of
    `schedule_attention`, and the post-passes: compaction, indices in loop vars, Q's pack
    zero-padded, the query block and the tiles versioned (full ones without bounds checks),
    the tails' loops cut to their steps, guards that protect only padding dropped, and both
    micro-kernels tensorized; with a causal mask over as many keys as queries, each block of
    queries stops at its last key (`StopAtDiagonal`)."""
    program = attention_func(shape, name)
    stops = stops_at_diagonal(shape)
    sch, loops = schedule_attention(program, config, shape.heads_inner, stops)
    *tails, depth, keys, exp_keys = loops
    pads = ("Q_local", "mask_t") if "mask" in sch.blocks() else ("Q_local",)  # (per block)
    post: tuple[PostPass, ...] = (Compact(), SimplifyIndices(), *map(ZeroPadding, pads),
                                  VersionTails(tuple(tails)), ShrinkTails(),
                                  DropDeadGuards(), Tensorize((depth, keys), config.lanes))
    if stops:
        post += (StopAtDiagonal(tails[0], config.qb, shape.keys, (keys, exp_keys),
                                ((tails[1], config.mr_keys),)),)
    return KernelPlan(Recipe.ATTENTION, program, sch.trace, post,
                      notes=f"# kiln.kernels.attention_plan({shape}, {config})",
                      scheduled=sch.func)
