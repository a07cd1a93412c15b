"""fp32 GEMM: the matmul lowering, scheduled by primitives into packed panels and a
register-tiled micro-kernel, recorded as a replayable Trace.

``gemm_plan(M, N, K)`` starts from ``C[M, N] = A[M, K] @ B[K, N]`` as `matmul_func` lowers
it (one reduction block; ``A @ B.T`` with ``b_transposed``, B then [N, K], a Linear weight;
``bias`` as the init) and applies `schedule_gemm` (the BLIS loop nest; GemmConfig holds the
tile sizes), then the lowering post-passes. The program it gives::

    C[...] = 0 (or bias)                            # decompose_reduction: C's init, parallel
    for jc in range(N / NC):                        # columns of C, NC at a time
      for pc in range(K / KC):                      # K, KC at a time
        alloc B_global: f32[NC/NR, KC, NR]          # cache_read + compute_at pc: packed B,
          parallel panel / range p / vectorized j   #   transform_layout (k, n) -> (n//NR, k, n%NR)
        parallel ic in range(M / MC):
          alloc A_local: f32[MC/MR, KC, MR] local   # cache_read + compute_at ic: packed A,
            range tile / range p / range i          #   transform_layout (m, k) -> (m//MR, k, m%MR)
          for jr, ir:                               # the register tiles
            alloc C_local: f32[MR, NR] local        # cache_inplace of C, load/write-back at ir
              unrolled i / vectorized j:  C_local[i, j] = C[...]
              range p / unrolled i / vectorized j:
                C_local[i, j] += A_local[ir, p, i] * B_global[jr, p, j]
              unrolled i / vectorized j:  C[...] = C_local[i, j]

With one K block (KC >= K: always with an epilogue, by default for K <= 768, 1536 on AVX2)
there is no ``pc`` loop and no init nest: ``cache_write`` + ``decompose_reduction`` at the K
step start each register tile from the bias (a row, or an [M, N] residual) and store it once,
where the nest above passes over C three times (init, load, store). Where each row of A is read once
(one K block, one N block) and short (K <= `PACK_A_FROM_K`), A is read in place.

Tails: the splits guard every block with bounds checks. `kiln.tir.tails.version_tails` runs
full K blocks and full tiles without them (tiles wholly past the end are skipped; the last K
block's loop is cut to its steps, `kiln.tir.tails.shrink_tail_tiles`), and
`kiln.tir.tails.drop_dead_guards` lets the tail tiles' micro-kernel run over the whole
register tile (the tile and the packed panels are allocated in full, and the values computed
in the padding are never stored); only the load and write-back of a tail tile keep their
checks. So any M, N, K (also 0 and 1) works.
Compared with the hand-built nest this replaced, C's init is a separate pass and each tile
loads C before accumulating (the hand-built zeroed its accumulator and stored C + acc), which
costs a few percent where C is large against the work (K small).

The tile sizes come from ``default_gemm_config``: MR×NR = 14×32 for AVX-512 fp32 (28 zmm
accumulators), a small MC (one or two MR tiles of A) swept over all of a KC×NC packed B block
(1 MiB, about the L2 of a Zen 4 core), the M tiles balanced over the threads. Measured on Zen 4
with 2 threads: MC=14..28 ≈ 180-200 GFLOP/s at 1024³ where MC=112 gave 135; at 2048³ KC=256
gave 100-120 (C is re-read and re-written K/KC times) where KC=512 gives 185-200. AVX2:
6×16 (12 ymm accumulators). See benchmarks/ops.py for GFLOP/s against torch.mm and numpy.

The micro-kernel's K loop is then tensorized (`plan.Tensorize`, `kiln.tir.tensorize`): the C
renderer emits it as the FMA_TILE intrinsic, its accumulators vector variables of the ISA's
width (``GemmConfig.lanes``), so the tile stays in registers whatever the C compiler would
have made of the loop nest (gcc 12 kept some AVX2 tiles in the stack array: 4x16 ran 2.1x
slower as loops).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

import torch

from kiln.codegen.isa import Isa
from kiln.ir.types import DType
from kiln.kernels.plan import (
    Compact,
    DropDeadGuards,
    Epilogue,
    KernelPlan,
    PostPass,
    PrefetchPanels,
    Recipe,
    ShrinkTails,
    SimplifyIndices,
    Tensorize,
    VersionTails,
    ZeroPadding,
    shares_dynamically,
)
from kiln.tir.nodes import BinOp, Expr, PrimFunc, Scope, Var
from kiln.tir.primitives.common import find_block
from kiln.tir.schedule import Schedule
from kiln.tir.te import Builder

__all__ = ["SERIAL_MACS", "GemmConfig", "default_gemm_config", "gemm_func", "gemm_plan",
           "gemm_shares_dynamically", "matmul_func", "schedule_gemm"]

F32 = DType.F32
SERIAL_MACS = 64**3  # smaller GEMMs run on one thread (see kernels.build.GRAIN)
# A is read in place, not packed, where the tile reads each row of A once (one K block, one
# N block) and its rows are not long: packing would copy all of A for a single use. Zen 4,
# 2 threads, B prepacked, in place against packed: 784x32x192 0.77, 3136x64x256 0.87,
# 784x128x512 0.94, 196x512x512 0.99 of the time
PACK_A_FROM_K = 512
# a register tile keeps at least this many vector accumulators where it can: fewer cannot
# cover the FMA latency on both pipes (Zen 3, AVX2, 2 threads, 128x768 @ 768x3072 with B
# prepacked: 4x16, 8 accumulators, 113 GFLOP/s; 6x16, 12 of them, 169, though its last
# tile of rows holds 2 of 6)
MIN_ACCUMULATORS = 10
# but a batched GEMM takes a tile down to this many rows where it divides M (`_exact_mr`):
# Zen 3, AVX2, 2 threads, each batch on one thread, 4 x 16 tiles against 6 x 16 (M = 128,
# the 6-row tiles' last holding 2 rows), at compile time: BERT's 12x128x128x64 189 -> 167
# us, 12x128x64x128 173 -> 148; Llama's 8x128x64x128 114 -> 100, 8x128x128x64 149 -> 135
BATCHED_MIN_MR = 4
# with B prepacked, the threads split N where the M tiles fall this much less evenly on them
# (Zen 3, 2 threads: 64x2048x2048, 11 tiles of 6 rows, 6 on one thread: 165 -> 180 GFLOP/s
# split by N, 64x784x2048 171 -> 185; 72 rows, 6 tiles each, within 1%)
SPLIT_N_IMBALANCE = 1.05
# ... and wherever N > SPLIT_N_OVER_M * M with B from SPLIT_N_MIN_BYTES on: each thread
# then streams half of the weights from memory, not all of them, but packs all of A (read
# and written) where the M split packs half; so N must outweigh twice M (an AVX-512 Xeon,
# 2 threads, B cold, M split against N split: ResNet-50's 196x1024 @ 1024x256 274-289
# against 314-359 us; 196x256 @ 256x1024 276-294 against 287-403, within noise). A
# thread's N block is its whole share, up to SPLIT_N_MAX_NC columns, and it packs A in
# blocks of at most SPLIT_N_MC_TILES register tiles, of even size (Zen 3, 2 threads,
# weights cold, against the M split with 464-512-column blocks: 128x512x1376 1189 -> 1008
# us, 128x768x2304 2956 -> 2545, 197x768x2304 4295 -> 3753, 128x768x3072 3511 -> 3387,
# 128x768x32000 40.0 -> 34.9 ms (16000 columns a block: 37.2), 128x768x768 883 -> 858,
# 196x256x512 362 -> 303, 196x96x1280 313 -> 302; 512x768x3072 within 1%; MobileNetV2's
# 49-row GEMMs, split by N before, -4% to +14%). A smaller B stays in the caches, and the
# split only adds A's packing: 196x128x512 (256 KiB) 158 -> 182 us, 196x64x384 63 -> 99
SPLIT_N_MIN_BYTES = 384 * 1024
SPLIT_N_OVER_M = 2
SPLIT_N_MAX_NC = 2048
SPLIT_N_MC_TILES = 8
# MR: the tallest tile whose busiest thread has at most this much more rows (padding
# included) than the fewest any candidate gives; more where 512-bit FMAs run at full rate,
# whose taller tiles load B fewer times for twice the FMAs a cycle (an AVX-512 Xeon, 2
# threads, B prepacked: 128x3072x768 MR = 10 (130 rows) 1872 us, 12 (132) 1799, 14 (140)
# 1786; 197x3072x768 MR = 12 (204) 2990, 14 (210) 3052; 49x512x2048 MR = 10 (50) 380, 14
# (56) 419; 32x768x768 MR = 8 139, 12 149. Zen 4: 128x3072x768 MR = 8 10% faster than 14)
MR_PADDING_SLACK = 1.02
MR_PADDING_SLACK_FULL_RATE = 1.04
# a K block may be this much longer than GemmConfig.kc where that splits K exactly
# (`_k_block`)
K_BLOCK_STRETCH = 1.5
# the one-vector register tile for short K over many rows (see default_gemm_config)
NARROW_TILE_MAX_K = 128
NARROW_TILE_MIN_M = 512
# packed weights (a GEMM's B, a convolution's filters) from this size on get the next
# panel prefetched (`plan.PrefetchPanels`):
# a model call finds them in DRAM; smaller ones may still sit in L2 from the last call
PREFETCH_MIN_BYTES = 256 * 1024
SPREAD_PREFETCH = True  # each tile its share of the next panel (`plan.PrefetchPanels`)


@dataclass(frozen=True)
class GemmConfig:
    """Tile sizes of the GEMM loop nest (all in elements)."""

    mr: int = 14  # rows of the register tile
    nr: int = 32  # columns of the register tile (2 AVX-512 vectors)
    kc: int = 512  # depth of a packed panel; C is read and written K/KC times
    mc: int = 28  # rows of A packed at a time (MC*KC floats in L1/L2); the threads split these
    nc: int = 512  # columns of B packed at once (KC*NC floats = 1 MiB, about L2)
    # threads split the N blocks (jc) instead of the M blocks (ic): for skinny M (a batch-1
    # transformer's 128 tokens) the M tiles are too few to balance, and with B prepacked each
    # thread streams only its own panels
    split_n: bool = False
    # the threads take the blocks one at a time as they come free, not a fixed contiguous
    # run each (`plan.shares_dynamically`: for compute-bound shapes)
    dynamic: bool = False
    # the vector width (fp32 lanes) the tile was sized for: its micro-kernel is tensorized
    # on vectors this wide (`plan.Tensorize`); 0 leaves it a loop nest for the C compiler
    lanes: int = 0


    @staticmethod
    def for_isa(isa: Isa) -> GemmConfig:
        """The register tile that fits the ISA's registers: MR x NR accumulators (NR = 2
        vectors), two B vectors and one broadcast of A. AVX-512: 14 x 32 (28 of 32 zmm);
        AVX2: 6 x 16 (12 of 16 ymm); 128-bit: 6 x 8; scalar: 4 x 4."""
        if isa is Isa.SCALAR:
            return GemmConfig(mr=4, nr=4, lanes=1)
        mr = (isa.registers - 3) // 2 if isa is Isa.AVX512 else 6
        # AVX2 (measured on Zen 3, 2 threads, B prepacked): deeper K blocks than AVX-512's
        # 512 pass over C fewer times; KC = 1024 against 512 took 197x768x2304 from 166 to
        # 182 GFLOP/s, 128x768x768 175 -> 184, 3136x576x64 159 -> 171, GPT-2's 128x768x50257
        # LM head 152 -> 169, and was within 2% elsewhere (K = 1152..4096)
        kc = 1024 if isa is Isa.AVX2 else 512
        return GemmConfig(mr=mr, nr=2 * isa.f32_lanes, kc=kc, mc=2 * mr, lanes=isa.f32_lanes)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _balanced(total: int, limit: int, multiple: int, parts_multiple: int = 1) -> int:
    """A block size <= ~limit, a multiple of ``multiple``, splitting ``total`` evenly into a
    number of blocks that is a multiple of ``parts_multiple`` when that costs little."""
    if total <= 0:
        return multiple
    parts = max(_ceil_div(total, limit), 1)
    if parts_multiple > 1 and total > multiple * parts_multiple:
        parts = _ceil_div(parts, parts_multiple) * parts_multiple
    return _ceil_div(_ceil_div(total, parts), multiple) * multiple


def default_gemm_config(m: int, n: int, k: int, threads: int | None = None,
                        base: GemmConfig | None = None, b_prepacked: bool = False,
                        one_k_block: bool = False, batched: bool = False,
                        full_rate_512: bool = False) -> GemmConfig:
    """Tiles for fp32 on a few cores: balanced blocks, threads split the M blocks; with B
    prepacked, where N > 2M (`SPLIT_N_OVER_M`; B of `SPLIT_N_MIN_BYTES` or more) or the M
    tiles are too few to balance, the threads split N.
    ``one_k_block``: KC = K (a fused epilogue needs each output written back once).
    ``batched``: one batch of a bmm (on one thread): MR divides M where a tile of at least
    `BATCHED_MIN_MR` rows does (`_exact_mr`).
    ``full_rate_512``: this machine's 512-bit FMAs run at full rate
    (`kiln.cost.machine.full_rate_512`): short dot products over many rows keep the
    two-vector tile (`NARROW_TILE_MAX_K`), and MR may pad a few more rows
    (`MR_PADDING_SLACK_FULL_RATE`).

    MR is ``base.mr`` or a shorter tile where that wastes fewer padded rows on the busiest
    thread (measured on Zen 4, 128x3072x768 on 2 threads: MR=14, whose last tile holds 2
    of 14 rows, 181 GFLOP/s; MR=8, no padding, 200)."""
    threads = threads or os.cpu_count() or 1
    base = base or GemmConfig()
    if 0 < n <= base.nr // 2 and base.nr % 2 == 0:  # one vector of columns, twice the rows
        # (the accumulators fill the same registers; a 2-vector tile would compute half
        # padding: MobileNetV2's 16-channel 1x1 projection ran 2.3x slower than the library)
        base = GemmConfig(2 * base.mr, base.nr // 2, base.kc, 2 * base.mc, base.nc,
                          lanes=base.lanes)
    elif base.lanes == 8 and base.nr == 16 and 16 < n <= 24:  # AVX2: three vectors of
        # columns, all of N in one panel (4 x 24, 12 accumulators; 6 x 16 computes a third
        # padding: Zen 3, 2 threads, MobileNetV2's 3136x96x24 146 -> 113 us, 3136x144x24
        # 219 -> 164)
        base = GemmConfig(4, 24, base.kc, 8, base.nc, lanes=base.lanes)
    elif not full_rate_512 and k <= NARROW_TILE_MAX_K and m >= NARROW_TILE_MIN_M and base.nr == 32:
        # short dot products over many rows (CNN 1x1 convolutions): a 16 x 16 tile, one
        # vector wide, beats 14 x 32 by 8-24% where the write-back weighs against the few
        # K steps (Zen 4, 2 threads, B prepacked: 12544x96x16 266 -> 203 us, 3136x64x64
        # 136 -> 117, 784x192x32 53 -> 46; at K = 128-512 within 5%, at M <= 197 worse).
        # Not where 512-bit FMAs run at full rate: there one B vector per A broadcast
        # leaves the loads, not the FMAs, the limit (an AVX-512 Xeon, 2 threads, 14 x 32
        # against 16 x 16: 12544x96x16 255 against 316 us, 3136x256x64 383 / 436,
        # 784x512x128 327 / 442; in the model, MobileNetV2 3.96 -> 3.81 ms, ResNet-50
        # 36.7 -> 35.5)
        base = GemmConfig(16, 16, base.kc, 32 if k <= 32 else 16, base.nc, lanes=base.lanes)
    kc = max(k, 1) if one_k_block else _k_block(k, base.kc)
    vectors = base.nr // base.lanes if base.lanes else max(base.nr // 16, 1)
    split_n = (b_prepacked and threads > 1 and n >= threads * base.nr
               and ((n > SPLIT_N_OVER_M * m and 4 * k * n >= SPLIT_N_MIN_BYTES)
                    or _ceil_div(m, base.mr) < 4 * threads
                    or _imbalance(m, _mr_for(m, base.mr, threads, vectors, full_rate_512),
                                  threads)
                    > SPLIT_N_IMBALANCE * _imbalance(n, base.nr, threads)))
    mr = _mr_for(m, base.mr, 1 if split_n else threads, vectors, full_rate_512)
    if batched:
        mr = _exact_mr(m, mr)
    base = GemmConfig(mr, base.nr, base.kc, max(base.mc // base.mr, 1) * mr, base.nc,
                      lanes=base.lanes)
    if split_n:  # (each thread its own panels, all the rows: A packed in even blocks)
        nc = _balanced(n, SPLIT_N_MAX_NC, base.nr, threads)
        tiles = max(_ceil_div(m, mr), 1)  # (M = 0: a token-routed layer's empty share)
        mc = _ceil_div(tiles, _ceil_div(tiles, SPLIT_N_MC_TILES)) * mr
    else:
        nc = _balanced(n, base.nc, base.nr, 1)
        mc = _mc_for_threads(m, base, threads)
    return GemmConfig(mr, base.nr, kc, mc, nc, split_n, gemm_shares_dynamically(m, n, k),
                      base.lanes)


def _k_block(k: int, limit: int) -> int:
    """KC: all of K where it is at most `K_BLOCK_STRETCH` x ``limit`` (Zen 4, 2 threads, B
    prepacked, K = 768 in one block against two of 384: GPT-2's LM head 128x768x50257 48.9
    -> 45.3 ms, 512x768x3072 11.7 -> 11.1, 197x768x3072 4.35 -> 4.23, 289x768x192 413 ->
    401 us, 128x768x768 702 -> 689; 128x768x2304 equal; K = 576: 196x576x96 106 -> 105,
    49x576x160 56 -> 58). Else K in balanced blocks of about ``limit``; where those leave a
    shorter last block, the fewest equal blocks of up to `K_BLOCK_STRETCH` x ``limit`` that
    K divides into, if a few more blocks find one: a shorter last block pays a tile's
    set-up for fewer steps (an AVX-512 Xeon, 2 threads, B prepacked: 128x512x1376 in
    blocks of 459, the last 458, 605 us, of 688 581, ATen 589; 1x1000x1280 in blocks of 427
    117 us, of 640 107, ATen 108. Before `kiln.tir.tails.shrink_tail_tiles` cut the last
    block's K loop to its steps, that block was no register tile: 723 and 112 us)."""
    if k <= K_BLOCK_STRETCH * limit:  # one block: C is read and written once
        return max(k, 1)
    kc = _balanced(k, limit, 1)
    if k % kc == 0:
        return kc
    fewest = _ceil_div(k, int(K_BLOCK_STRETCH * limit))
    return next((k // parts for parts in range(fewest, _ceil_div(k, limit) + 3)
                 if k % parts == 0), kc)


def _exact_mr(m: int, mr: int) -> int:
    """``mr``, or the tallest shorter tile of at least `BATCHED_MIN_MR` rows that divides
    ``m``: a bmm whose last tile of rows is short packs A and keeps that tile's bounds checks
    in every batch, which costs more than the accumulators a shorter tile gives up."""
    if m % mr == 0:
        return mr
    return next((r for r in range(mr - 1, BATCHED_MIN_MR - 1, -1) if m % r == 0), mr)


def _imbalance(extent: int, tile: int, threads: int) -> float:
    """The busiest thread's share of ``extent``'s tiles against an even share."""
    tiles = max(_ceil_div(extent, tile), 1)
    return _ceil_div(tiles, threads) * threads / tiles


def gemm_shares_dynamically(m: int, n: int, k: int) -> bool:
    """`plan.shares_dynamically` for an fp32 GEMM: 2MNK FLOPs over A, B and C once (a
    batched GEMM's intensity is each batch's)."""
    return shares_dynamically(2.0 * m * n * k, 4.0 * (m * k + k * n + m * n))


def _mr_for(m: int, largest: int, threads: int, vectors: int = 2,
            full_rate_512: bool = False) -> int:
    """The tallest tile (``largest`` down to about half of it, but with at least
    `MIN_ACCUMULATORS` of ``vectors`` a row; or M itself when shorter) whose busiest thread
    has at most 2% more rows, padding included, than the best choice (taller tiles pass
    over B fewer times); 4% where 512-bit FMAs run at full rate (`MR_PADDING_SLACK`)."""
    def busiest(mr: int) -> int:
        return _ceil_div(_ceil_div(max(m, 1), mr), threads) * mr
    shortest = max(largest // 2, _ceil_div(MIN_ACCUMULATORS, max(vectors, 1)), 1)
    candidates = [*range(largest, min(shortest, largest) - 1, -2 if largest > 4 else -1)]
    if 0 < m < largest:
        candidates.append(m)
    least = min(busiest(mr) for mr in candidates)
    slack = MR_PADDING_SLACK_FULL_RATE if full_rate_512 else MR_PADDING_SLACK
    return max(mr for mr in candidates if busiest(mr) <= least * slack)


def _mc_for_threads(m: int, base: GemmConfig, threads: int) -> int:
    """MC (a multiple of MR) that spreads the MR-row tiles of M most evenly over the threads
    under OpenMP's static schedule; among equals, the one closest to base.mc."""
    tiles = max(_ceil_div(m, base.mr), 1)
    limit = max(8 * base.mc // base.mr, 1)  # Ap = MC x KC floats must stay well inside L2
    target = max(base.mc // base.mr, 1)

    def cost(per_block: int) -> tuple[int, int]:
        blocks = _ceil_div(tiles, per_block)
        per_thread = _ceil_div(blocks, threads)  # contiguous chunks of blocks per thread
        busiest = min(per_thread * per_block, tiles)
        return busiest, abs(per_block - target)

    best = min(range(1, min(limit, tiles) + 1), key=cost)
    return best * base.mr


def matmul_func(m: int, n: int, k: int, b_transposed: bool = False, bias: bool = False,
                name: str = "gemm", b_panels: int = 0, bias_matrix: bool = False,
                batch: int = 0, a_strides: tuple[int, ...] | None = None,
                b_strides: tuple[int, ...] | None = None, bias_row: bool = False) -> PrimFunc:
    """``C = A @ B`` (``A @ B.T`` with ``b_transposed``; ``+ bias`` as the init) as the loop
    lowering of mm/addmm gives it (`kiln.tir.lower_contract`): one reduction block ``C``
    over loops ``i0, i1, k0``. With ``b_panels`` (NR) B comes prepacked by the caller
    (`pack_b`): ``B[n // NR, k, n % NR]``, f32[ceil(N / NR), K, NR], the tail zero-padded.
    With ``bias_matrix`` the bias is [M, N], an addmm's full input (a residual); with
    ``bias_row`` too, one more input ``bias_row`` [N] is added to it in the init, so
    ``addmm(residual + b, ...)`` reads the residual once and writes no sum.

    With ``batch`` it is bmm's: A [batch, M, K], B [batch, K, N] and C [batch, M, N], one
    more (outermost) loop; A and B read with the element strides given (a head's slice of a
    projection, a transposed key: attention's operands are views), C contiguous."""
    b = Builder()
    lead = (batch,) if batch else ()
    a_buf = b.buffer("A", (*lead, m, k), F32)
    if b_panels:
        b_buf = b.buffer("B", (_ceil_div(n, b_panels), k, b_panels), F32)
    else:
        b_buf = b.buffer("B", (*lead, *((n, k) if b_transposed else (k, n))), F32)
    if a_strides is not None:
        a_buf = dataclasses.replace(a_buf, strides=tuple(a_strides))
    if b_strides is not None:
        b_buf = dataclasses.replace(b_buf, strides=tuple(b_strides))
    bias_buf = b.buffer("bias", (m, n) if bias_matrix else (n,), F32) if bias else None
    if bias_row and not (bias and bias_matrix):
        raise ValueError("bias_row adds a row to an [M, N] bias: it needs bias_matrix")
    row_buf = b.buffer("bias_row", (n,), F32) if bias_row else None
    c_buf = b.buffer("C", (*lead, m, n), F32)

    def product(v: tuple[Var, ...], r: tuple[Var, ...]) -> Expr:
        bt, v = v[:len(lead)], v[len(lead):]
        if b_panels:
            rhs = b_buf[v[1] // b_panels, r[0], v[1] % b_panels]
        else:
            rhs = b_buf[(*bt, v[1], r[0])] if b_transposed else b_buf[(*bt, r[0], v[1])]
        return a_buf[(*bt, v[0], r[0])] * rhs

    finit = None if bias_buf is None else \
        (lambda v: bias_buf[v[0], v[1]] + row_buf[v[1]]) if row_buf is not None else \
        (lambda v: bias_buf[v[0], v[1]]) if bias_matrix else (lambda v: bias_buf[v[1]])
    b.reduce("C", c_buf, (k,), BinOp.ADD, product, finit)
    inputs = (a_buf, b_buf) if bias_buf is None else (a_buf, b_buf, bias_buf)
    inputs += (row_buf,) if row_buf is not None else ()
    return PrimFunc(name, inputs, (c_buf,), b.body())


def pack_b(b: torch.Tensor, nr: int) -> torch.Tensor:
    """B [K, N] (a Linear weight's ``.t()`` too) in the prepacked layout `matmul_func` reads
    with ``b_panels=nr``: f32[ceil(N / nr), K, nr], panel p holding columns p*nr.., the last
    panel zero-padded. Done once, at compile time, for a constant B."""
    k, n = b.shape
    full = n // nr
    packed = torch.empty(_ceil_div(n, nr), k, nr, dtype=b.dtype)
    # one copy of B (zeros and a copy, then a permuted copy, took 0.2 s of a warm compile
    # of HF GPT-2)
    packed[:full].copy_(b[:, :full * nr].reshape(k, full, nr).permute(1, 0, 2))
    if full * nr < n:
        packed[full].zero_()
        packed[full, :, :n - full * nr] = b[:, full * nr:]
    return packed


def schedule_gemm(func: PrimFunc, config: GemmConfig,
                  b_transposed: bool = False) -> tuple[Schedule, list[str]]:
    """The BLIS schedule of `matmul_func`'s program, as primitives (see the module
    docstring for the nest it gives): tiles (jc, pc, ic, jr, ir, p, i, j); C's init in its
    own nest; the MR x NR tile of C in a local accumulator across p (cache_inplace); A and B
    packed per ic and per (jc, pc) into panels (cache_read + compute_at + transform_layout).
    Also returns the loops whose bodies `kiln.tir.tails.version_tails` should version: the K
    block, A's packing by tiles, the register tile's column and row loops (full blocks and
    tiles run without bounds checks) and the K step."""
    sch = Schedule(func)
    mr, nr, kc, mc, nc = config.mr, config.nr, config.kc, config.mc, config.nc
    *lead, m, n = func.outputs[0].shape
    batched = bool(lead)  # bmm: the batch loop outermost, its iterations on the threads
    if 0 in (*lead, m, n):
        return sch, []  # nothing to compute
    if not find_block(func, "C").stmt.is_reduction:  # type: ignore[union-attr]
        *bt, i, j = sch.get_loops(sch.get_block("C"))  # K = 0: C = bias, or zeros
        sch.parallel(bt[0] if batched else i)
        sch.vectorize(j)
        return sch, []
    c = sch.get_block("C")
    *bt, i, j, k = sch.get_loops(c)
    ic, ir, ii = sch.split(i, [None, mc // mr, mr])
    jc, jr, jj = sch.split(j, [None, nc // nr, nr])
    k_values = func.inputs[0].shape[-1]
    # one K block: the tile starts from the bias, C is written once (always batched: a bmm's
    # K is a head's width or a sequence, and its C tiles per batch are small)
    if kc >= k_values or batched:
        p = k
        sch.reorder(*bt, jc, ic, jr, ir, p, ii, jj)
        store = sch.cache_write(c, Scope.LOCAL)
        sch.reverse_compute_at(store, ir)
        init = sch.decompose_reduction(c, p)
        tile_blocks = (init, store)
        k_blocks: list[str] = []
    else:  # C accumulates over the K blocks: initialized once, loaded by each tile
        pc, p = sch.split(k, [None, kc])
        sch.reorder(*bt, jc, pc, ic, jr, ir, p, ii, jj)
        init = sch.decompose_reduction(c, jc)
        load, store = sch.cache_inplace(c, "C")
        sch.reverse_compute_at(store, ir)
        sch.compute_at(load, ir)
        tile_blocks = (load, store)
        k_blocks = [pc.name]
    # (a last tile of rows reads an unpacked A in place too, keeping its bounds checks: the
    # other tiles run without them, and packing all of A for that one tile cost more than the
    # tile: Zen 3, 2 threads, 12544x32x16 141-168 -> 98-101 us, 784x144x32 53-57 -> 42-43,
    # 125x256x16 10.5 -> 7.7; a bmm still packs, its tail tile's guards in each batch; a
    # last tile of columns runs over B's padded panel, its checks dropped: A packed for it
    # took 3136x24x144 from 143 us, as at N = 32, to 181)
    a_strides = func.inputs[0].strides
    packs_a = (bool(k_blocks) or n > nc or k_values > PACK_A_FROM_K
               or (m % mr and batched)
               or (a_strides is not None and a_strides[-1] != 1))  # (rows not contiguous)
    if packs_a:
        a_pack = sch.cache_read(c, "A")
        sch.compute_at(a_pack, ic)
        a_rows, a_k = sch.get_loops(a_pack)[-2:]  # pack A tile by tile, writing contiguously
        a_tile, a_row = sch.split(a_rows, [None, mr])
        sch.reorder(a_tile, a_k, a_row)
        a_local = f"A_{Scope.LOCAL.value}"
        d = len(bt)  # (a batched A's tile keeps its batch dim, of extent 1)
        sch.transform_layout(c, a_local, [*((0, "", 0),) * d, (d, "//", mr), (d + 1, "", 0),
                                          (d, "%", mr)])
    # the micro-kernel: unrolled rows, vector columns; threads share the M or the N blocks
    # (or the batch)
    sch.unroll(ii)
    sch.vectorize(jj)
    sch.parallel(bt[0] if batched else jc if config.split_n else ic, config.dynamic)
    for block in tile_blocks:
        rows, cols = sch.get_loops(block)[-2:]
        sch.unroll(rows)
        sch.vectorize(cols)
    if k_blocks:  # C's own init nest
        init_loops = sch.get_loops(init)
        if not batched:  # (batched: inside the thread's batch iteration)
            # (jc or ic, split as the tiles are, where that is static)
            sch.parallel(init_loops[0 if config.split_n else 1], config.dynamic)
        sch.vectorize(init_loops[-1])
    tails = [*k_blocks, *([a_tile.name] if packs_a else []), jr.name, ir.name, p.name]
    if func.inputs[1].rank == 3 and not batched:  # B prepacked by the caller (`pack_b`)
        return sch, tails
    b_pack = sch.cache_read(c, "B", Scope.GLOBAL)
    sch.compute_at(b_pack, pc if k_blocks else jc)
    b_local = f"B_{Scope.GLOBAL.value}"
    d = len(bt)
    n_dim = d + (0 if b_transposed else 1)
    k_dim = d + (1 if b_transposed else 0)
    sch.transform_layout(c, b_local, [*((0, "", 0),) * d, (n_dim, "//", nr), (k_dim, "", 0),
                                      (n_dim, "%", nr)])
    # packing B: panel by panel (parallel), NR lanes at a time; a B with K contiguous (a
    # Linear weight, transposed; attention's keys, a view with those strides) in 16 x NR
    # blocks, reading along K (measured 6% faster than vector gathers at 512x768x3072; on
    # ViT's 12x197x197x64 scores, 0.397 -> 0.389 ms, within the noise)
    b_rows, b_cols = sch.get_loops(b_pack)[-2:]
    n_loop, k_loop = (b_rows, b_cols) if b_transposed else (b_cols, b_rows)
    panel, lane = sch.split(n_loop, [None, nr])
    b_strides = func.inputs[1].strides
    k_contiguous = b_transposed or (b_strides is not None and b_strides[-2] == 1
                                    and b_strides[-1] != 1)
    if k_contiguous:
        k_block, k_in = sch.split(k_loop, [None, 16])
        sch.reorder(panel, k_block, lane, k_in)
    else:
        sch.reorder(panel, k_loop, lane)
        sch.vectorize(lane)
    if not (config.split_n or batched):  # (else B's packing already runs inside a thread's
        # jc block or batch iteration)
        sch.parallel(panel, config.dynamic)
    return sch, tails


@functools.lru_cache(maxsize=256)  # (a plan is immutable: repeated layers share one)
def gemm_plan(m: int, n: int, k: int, config: GemmConfig | None = None,
              b_transposed: bool = False, bias: bool = False, name: str = "gemm",
              b_prepacked: bool = False, epilogue: Epilogue | None = None,
              bias_matrix: bool = False, batch: int = 0,
              a_strides: tuple[int, ...] | None = None,
              b_strides: tuple[int, ...] | None = None, bias_row: bool = False) -> KernelPlan:
    """The GEMM as a plan (see the module docstring): `matmul_func`'s program, the Trace of
    `schedule_gemm`, and the lowering post-passes: compaction (packed panels, register tile),
    indices in loop vars, full K blocks and tiles versioned without bounds checks (tiles
    wholly in the padding skipped, the K tail's check one test per K step), then the tail
    tiles' micro-kernel padded (its checks dropped where only unused values depend on them)."""
    cfg = config or default_gemm_config(m, n, k)
    program = matmul_func(m, n, k, b_transposed, bias, name, cfg.nr if b_prepacked else 0,
                          bias_matrix, batch, a_strides, b_strides, bias_row)
    sch, tails = schedule_gemm(program, cfg, b_transposed)
    post: tuple[PostPass, ...] = (Compact(), SimplifyIndices())
    if not b_prepacked or batch:  # (B packed in the kernel: its padding lanes zeroed)
        post += (ZeroPadding(f"B_{Scope.GLOBAL.value}"),)
    post += (VersionTails(tuple(tails)), ShrinkTails(), DropDeadGuards())
    if tails and b_prepacked and not batch and n * k * 4 >= PREFETCH_MIN_BYTES:
        tiles = cfg.mc // cfg.mr if SPREAD_PREFETCH else 1  # (the K loop of the micro-kernel,
        # the tile loop over a panel)
        post += (PrefetchPanels(tails[-1], "B", tails[-2] if tiles > 1 else "", tiles),)
    if epilogue is not None:
        if cfg.kc < k or k == 0:
            raise ValueError(f"an epilogue needs one K block (KC={cfg.kc}, K={k})")
        post += (epilogue,)
    if tails and cfg.lanes and cfg.nr % cfg.lanes == 0:  # (no tails: nothing to compute)
        post += (Tensorize((tails[-1],), cfg.lanes),)
    batched = f", batch={batch}, a_strides={a_strides}, b_strides={b_strides}" if batch else ""
    call = (f"gemm_plan({m}, {n}, {k}, {cfg}, b_transposed={b_transposed}, bias={bias}, "
            f"b_prepacked={b_prepacked}{', bias_matrix=True' if bias_matrix else ''}"
            f"{', bias_row=True' if bias_row else ''}{batched})")
    return KernelPlan(Recipe.GEMM, program, sch.trace, post, notes=f"# kiln.kernels.{call}",
                      scheduled=sch.func)


def gemm_func(m: int, n: int, k: int, config: GemmConfig | None = None,
              b_transposed: bool = False, bias: bool = False, name: str = "gemm",
              b_prepacked: bool = False, epilogue: Epilogue | None = None,
              bias_matrix: bool = False, bias_row: bool = False) -> PrimFunc:
    """`gemm_plan`'s program: ``C = A @ B`` (``+ bias``) with inputs A, B (, bias, row)."""
    return gemm_plan(m, n, k, config, b_transposed, bias, name, b_prepacked, epilogue,
                     bias_matrix, bias_row=bias_row).build()
