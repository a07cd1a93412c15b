"""fp32 GEMM as a scheduled loop program: packed panels and a register-tiled micro-kernel.

``gemm_func(M, N, K)`` builds ``C[M, N] = A[M, K] @ B[K, N]`` (or ``A @ B.T`` with
``b_transposed``; B is then [N, K], a Linear weight) already in the shape the schedule
primitives give it (the BLIS loop nest; GemmConfig holds the tile sizes)::

    for jc in range(N / NC):                        # columns of C, NC at a time
      for pc in range(K / KC):                      # K, KC at a time
        alloc Bp: f32[NC/NR, KC, NR]                # cache_read of B, packed by panel
          parallel jr / range p / vectorized j:  Bp[jr, p, j] = B[pc*KC+p, jc*NC+jr*NR+j]
          parallel ic in range(M / MC):
            alloc Ap: f32[MC/MR, KC, MR] local      # cache_read of A, compute_at ic
              range ir / range p / range i:  Ap[ir, p, i] = A[ic*MC+ir*MR+i, pc*KC+p]
              range jr, range ir:
                alloc acc: f32[MR, NR] local        # cache_write of C: the register tile
                  unrolled i / vectorized j:  acc[i, j] = 0
                  range p / unrolled i / vectorized j:  acc[i, j] += Ap[ir, p, i] * Bp[jr, p, j]
                  range i / vectorized j:  C[...] = acc[i, j] (+ C[...] after the first pc)

Tails are handled by zero padding inside the packed panels (out-of-range loads are guarded
by a Select) and by predicates on the final store, so any M, N, K (also 0 and 1) works.
The tile sizes come from ``default_gemm_config``: MR×NR = 14×32 for AVX-512 fp32 (28 zmm
accumulators), a small MC (one or two MR tiles of A) swept over all of a KC×NC packed B block
(1 MiB, about the L2 of a Zen 4 core), the M tiles balanced over the threads. Measured on
Zen 4 with 2 threads: MC=14..28 ≈ 180-200 GFLOP/s at 1024³ where MC=112 gave 135; at 2048³
KC=256 gave 100-120 (C is re-read and re-written K/KC times) where KC=512 gives 185-200.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from kiln.ir.types import DType
from kiln.tir.compact import compact_buffers
from kiln.tir.nodes import (
    Allocate,
    Binary,
    BinOp,
    Block,
    Buffer,
    BufferStore,
    CmpOp,
    Compare,
    Expr,
    For,
    ForKind,
    IfThenElse,
    IterKind,
    IterVar,
    Load,
    PrimFunc,
    Scope,
    Select,
    Stmt,
    Var,
    const,
    seq,
)
from kiln.tir.primitives.common import find_block
from kiln.tir.schedule import Schedule
from kiln.tir.indices import simplify_indices
from kiln.tir.tails import drop_dead_guards, version_tails
from kiln.tir.te import Builder
from kiln.tir.trace import Trace

__all__ = ["GemmConfig", "default_gemm_config", "derived_gemm_func", "gemm_func", "matmul_func",
           "schedule_gemm"]

F32 = DType.F32


@dataclass(frozen=True)
class GemmConfig:
    """Tile sizes of the GEMM loop nest (all in elements)."""

    mr: int = 14  # rows of the register tile
    nr: int = 32  # columns of the register tile (2 AVX-512 vectors)
    kc: int = 512  # depth of a packed panel; C is read and written K/KC times
    mc: int = 28  # rows of A packed at a time (MC*KC floats in L1/L2); the threads split these
    nc: int = 512  # columns of B packed at once (KC*NC floats = 1 MiB, about L2)


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
                        base: GemmConfig | None = None) -> GemmConfig:
    """Tiles for AVX-512 fp32 on a few cores: balanced blocks, threads split the M blocks."""
    threads = threads or os.cpu_count() or 1
    base = base or GemmConfig()
    kc = _balanced(k, base.kc, 1)
    nc = _balanced(n, base.nc, base.nr)
    return GemmConfig(base.mr, base.nr, kc, _mc_for_threads(m, base, threads), nc)


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


def _iv(name: str, extent: int, kind: IterKind = IterKind.SPATIAL) -> IterVar:
    return IterVar(Var(name), extent, kind)


def _and(*conds: Expr) -> Expr:
    out = conds[0]
    for c in conds[1:]:
        out = Binary(BinOp.AND, out, c)
    return out


def _lt(a: Expr, bound: int) -> Expr:
    return Compare(CmpOp.LT, a, const(bound, DType.I64))


def gemm_func(m: int, n: int, k: int, config: GemmConfig | None = None,
              b_transposed: bool = False, bias: bool = False,
              activation: Callable[[Expr], Expr] | None = None,
              name: str = "gemm") -> PrimFunc:
    """The scheduled GEMM program; see the module docstring for its loop nest.

    With ``bias`` the program takes a third input ``bias: f32[N]`` added to every row (a
    Linear layer is ``gemm_func(M, N, K, b_transposed=True, bias=True)``); ``activation``
    maps the finished value of C (e.g. relu), applied in the last K block's store.
    """
    cfg = config or default_gemm_config(m, n, k)
    mr, nr, kc, mc, nc = cfg.mr, cfg.nr, cfg.kc, cfg.mc, cfg.nc
    a = Buffer("A", (m, k), F32)
    b = Buffer("B", (n, k) if b_transposed else (k, n), F32)
    c = Buffer("C", (m, n), F32)
    bias_buf = Buffer("bias", (n,), F32) if bias else None
    inputs = (a, b) if bias_buf is None else (a, b, bias_buf)
    n_jc, n_pc, n_ic = _ceil_div(n, nc), _ceil_div(k, kc), _ceil_div(m, mc)
    zero = const(0.0, F32)
    jc, pc, ic = Var("jc"), Var("pc"), Var("ic")

    # pack B: Bp[jr, p, j] = B[pc*kc + p, jc*nc + jr*nr + j], zero outside B
    bp = Buffer("Bp", (nc // nr, kc, nr), F32)
    jr0, p0, j0 = Var("jr0"), Var("p0"), Var("j0")
    v_jr, v_p, v_j = _iv("v_jr0", nc // nr), _iv("v_p0", kc), _iv("v_j0", nr)
    row = pc * kc + v_p.var
    col = jc * nc + v_jr.var * nr + v_j.var
    b_load = Load(b, (col, row) if b_transposed else (row, col))
    pack_b = Block("pack_B", (v_jr, v_p, v_j), (jr0, p0, j0),
                   BufferStore(bp, (v_jr.var, v_p.var, v_j.var),
                               Select(_and(_lt(row, k), _lt(col, n)), b_load, zero)))
    pack_b_nest = For(jr0, nc // nr,
                      IfThenElse(_lt(jc * nc + jr0 * nr, n),
                                 For(p0, kc, For(j0, nr, pack_b, ForKind.VECTORIZED))),
                      ForKind.PARALLEL)

    # pack A: Ap[ir, p, i] = A[ic*mc + ir*mr + i, pc*kc + p], zero outside A
    ap = Buffer("Ap", (mc // mr, kc, mr), F32, scope=Scope.LOCAL)
    ir1, p1, i1 = Var("ir1"), Var("p1"), Var("i1")
    v_ir, v_p1, v_i1 = _iv("v_ir1", mc // mr), _iv("v_p1", kc), _iv("v_i1", mr)
    arow = ic * mc + v_ir.var * mr + v_i1.var
    acol = pc * kc + v_p1.var
    pack_a = Block("pack_A", (v_ir, v_p1, v_i1), (ir1, p1, i1),
                   BufferStore(ap, (v_ir.var, v_p1.var, v_i1.var),
                               Select(_and(_lt(arow, m), _lt(acol, k)),
                                      Load(a, (arow, acol)), zero)))
    pack_a_nest = For(ir1, mc // mr, IfThenElse(_lt(ic * mc + ir1 * mr, m),
                                                For(p1, kc, For(i1, mr, pack_a))))

    # the micro-kernel on one MR x NR tile
    acc = Buffer("acc", (mr, nr), F32, scope=Scope.LOCAL)
    jr, ir = Var("jr"), Var("ir")
    i2, j2 = Var("i2"), Var("j2")
    v_i2, v_j2 = _iv("v_i2", mr), _iv("v_j2", nr)
    init = Block("acc_init", (v_i2, v_j2), (i2, j2),
                 BufferStore(acc, (v_i2.var, v_j2.var), zero))
    p3, i3, j3 = Var("p3"), Var("i3"), Var("j3")
    v_i3, v_j3, v_p3 = _iv("v_i3", mr), _iv("v_j3", nr), _iv("v_p3", kc, IterKind.REDUCE)
    update = Block("acc_update", (v_i3, v_j3, v_p3), (i3, j3, p3),
                   BufferStore(acc, (v_i3.var, v_j3.var),
                               Load(acc, (v_i3.var, v_j3.var))
                               + Load(ap, (ir, v_p3.var, v_i3.var))
                               * Load(bp, (jr, v_p3.var, v_j3.var))))
    i4, j4 = Var("i4"), Var("j4")
    v_i4, v_j4 = _iv("v_i4", mr), _iv("v_j4", nr)
    crow = ic * mc + ir * mr + v_i4.var
    ccol = jc * nc + jr * nr + v_j4.var
    tile = Load(acc, (v_i4.var, v_j4.var))
    first = Compare(CmpOp.EQ, pc, const(0, DType.I64))
    start = tile if bias_buf is None else tile + Load(bias_buf, (ccol,))
    value: Expr = Select(first, start, Load(c, (crow, ccol)) + tile)
    if activation is not None:
        last = Compare(CmpOp.EQ, pc, const(n_pc - 1, DType.I64))
        value = activation(value) if n_pc == 1 else Select(last, activation(value), value)
    store = Block("C", (v_i4, v_j4), (i4, j4), BufferStore(c, (crow, ccol), value),
                  predicate=_and(_lt(ic * mc + ir * mr + i4, m), _lt(jc * nc + jr * nr + j4, n)))
    micro: Stmt = Allocate(acc, seq(
        For(i2, mr, For(j2, nr, init, ForKind.VECTORIZED), ForKind.UNROLLED),
        For(p3, kc, For(i3, mr, For(j3, nr, update, ForKind.VECTORIZED), ForKind.UNROLLED)),
        For(i4, mr, For(j4, nr, store, ForKind.VECTORIZED), ForKind.UNROLLED),
    ))
    # tiles wholly in the padding are skipped
    tiles = For(jr, nc // nr, IfThenElse(_lt(jc * nc + jr * nr, n),
                                         For(ir, mc // mr, IfThenElse(_lt(ic * mc + ir * mr, m),
                                                                      micro))))
    per_thread = For(ic, n_ic, Allocate(ap, seq(pack_a_nest, tiles)), ForKind.PARALLEL)
    body = For(jc, n_jc, For(pc, n_pc, Allocate(bp, seq(pack_b_nest, per_thread))))
    if m == 0 or n == 0:
        body = For(Var("empty"), 0, body)  # nothing to compute
    elif k == 0:
        body = _fill(c, bias_buf, activation)
    return PrimFunc(name, inputs, (c,), body)


def _fill(c: Buffer, bias: Buffer | None, activation: Callable[[Expr], Expr] | None) -> Stmt:
    """C for K = 0: activation(bias), or zeros."""
    i, j = Var("zi"), Var("zj")
    vi, vj = _iv("v_zi", c.shape[0]), _iv("v_zj", c.shape[1])
    value: Expr = const(0.0, F32) if bias is None else Load(bias, (vj.var,))
    if activation is not None:
        value = activation(value)
    block = Block("C", (vi, vj), (i, j), BufferStore(c, (vi.var, vj.var), value))
    return For(i, c.shape[0], For(j, c.shape[1], block, ForKind.VECTORIZED), ForKind.PARALLEL)


# ---------------------------------------------------------------------------------------------
# The same GEMM derived from the matmul lowering by schedule primitives, recorded in a Trace


def matmul_func(m: int, n: int, k: int, b_transposed: bool = False, bias: bool = False,
                name: str = "gemm") -> PrimFunc:
    """``C = A @ B`` (``A @ B.T`` with ``b_transposed``; ``+ bias`` as the init) as the loop
    lowering of mm/addmm gives it (`kiln.tir.lower_contract`): one reduction block ``C``
    over loops ``i0, i1, k0``."""
    b = Builder()
    a_buf = b.buffer("A", (m, k), F32)
    b_buf = b.buffer("B", (n, k) if b_transposed else (k, n), F32)
    bias_buf = b.buffer("bias", (n,), F32) if bias else None
    c_buf = b.buffer("C", (m, n), F32)

    def product(v: tuple[Var, ...], r: tuple[Var, ...]) -> Expr:
        rhs = b_buf[v[1], r[0]] if b_transposed else b_buf[r[0], v[1]]
        return a_buf[v[0], r[0]] * rhs

    finit = None if bias_buf is None else (lambda v: bias_buf[v[1]])
    b.reduce("C", c_buf, (k,), BinOp.ADD, product, finit)
    inputs = (a_buf, b_buf) if bias_buf is None else (a_buf, b_buf, bias_buf)
    return PrimFunc(name, inputs, (c_buf,), b.body())


def schedule_gemm(func: PrimFunc, config: GemmConfig,
                  b_transposed: bool = False) -> tuple[Schedule, list[str]]:
    """The BLIS schedule of `matmul_func`'s program, as primitives (see the module
    docstring for the nest it gives): tiles (jc, pc, ic, jr, ir, p, i, j); C's init in its
    own nest; the MR x NR tile of C in a local accumulator across p (cache_inplace); A and B
    packed per ic and per (jc, pc) into panels (cache_read + compute_at + transform_layout).
    Also returns the loops whose bodies `kiln.tir.tails.version_tails` should version: the
    register tile (full tiles run without bounds checks) and the K step."""
    sch = Schedule(func)
    mr, nr, kc, mc, nc = config.mr, config.nr, config.kc, config.mc, config.nc
    m, n = func.outputs[0].shape
    if 0 in (m, n) or not find_block(func, "C").stmt.is_reduction:  # type: ignore[union-attr]
        c = sch.get_block("C")
        i, j = sch.get_loops(c)
        if m * n:
            sch.parallel(i)
            sch.vectorize(j)
        return sch, []
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    ic, ir, ii = sch.split(i, [None, mc // mr, mr])
    jc, jr, jj = sch.split(j, [None, nc // nr, nr])
    pc, p = sch.split(k, [None, kc])
    sch.reorder(jc, pc, ic, jr, ir, p, ii, jj)
    init = sch.decompose_reduction(c, jc)
    load, store = sch.cache_inplace(c, "C")
    sch.reverse_compute_at(store, ir)
    sch.compute_at(load, ir)
    a_pack = sch.cache_read(c, "A")
    sch.compute_at(a_pack, ic)
    b_pack = sch.cache_read(c, "B", Scope.GLOBAL)
    sch.compute_at(b_pack, pc)
    a_local, b_local = f"A_{Scope.LOCAL.value}", f"B_{Scope.GLOBAL.value}"
    sch.transform_layout(c, a_local, [(0, "//", mr), (1, "", 0), (0, "%", mr)])
    n_dim = 0 if b_transposed else 1
    sch.transform_layout(c, b_local, [(n_dim, "//", nr), (1 - n_dim, "", 0),
                                      (n_dim, "%", nr)])
    # the micro-kernel: unrolled rows, vector columns; threads share the M blocks
    sch.unroll(ii)
    sch.vectorize(jj)
    sch.parallel(ic)
    for block in (load, store):
        rows, cols = sch.get_loops(block)[-2:]
        sch.unroll(rows)
        sch.vectorize(cols)
    # packing B: panel by panel (parallel), NR lanes at a time
    b_rows, b_cols = sch.get_loops(b_pack)[-2:]
    n_loop, k_loop = (b_rows, b_cols) if b_transposed else (b_cols, b_rows)
    panel, lane = sch.split(n_loop, [None, nr])
    sch.reorder(panel, k_loop, lane) if b_transposed else sch.reorder(panel, k_loop, lane)
    sch.parallel(panel)
    sch.vectorize(lane)
    init_loops = sch.get_loops(init)
    sch.parallel(init_loops[1])  # ic
    sch.vectorize(init_loops[-1])
    return sch, [jr.name, ir.name, p.name]


def derived_gemm_func(m: int, n: int, k: int, config: GemmConfig | None = None,
                      b_transposed: bool = False, bias: bool = False,
                      name: str = "gemm") -> tuple[PrimFunc, Trace]:
    """`gemm_func`'s program derived from `matmul_func` by `schedule_gemm`; returns the
    compacted program and the Trace that replays onto ``matmul_func(...)``."""
    cfg = config or default_gemm_config(m, n, k)
    sch, tails = schedule_gemm(matmul_func(m, n, k, b_transposed, bias, name), cfg,
                               b_transposed)
    return lower_gemm(sch.func, tails), sch.trace


def lower_gemm(func: PrimFunc, tails: list[str]) -> PrimFunc:
    """The lowering steps after the schedule: compaction (packed panels, register tile),
    indices in loop vars, register tiles padded (their bounds checks dropped where only
    unused values depend on them), the K tail's check hoisted out of the micro-kernel."""
    func = simplify_indices(compact_buffers(func))
    return version_tails(drop_dead_guards(func), tails)
