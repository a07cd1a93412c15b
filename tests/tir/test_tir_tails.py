"""kiln.tir.tails: a tail copy's loops cut to the iterations that hold anything, the same
program in the interpreter and in C, and short tiles that spread their steps over several
sets of accumulators (`kiln.codegen.c_intrinsics`)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from kiln.codegen.c import render_c
from kiln.codegen.c_intrinsics import FMA_CHAINS
from kiln.codegen.kernel import CompiledKernel, compile_kernel
from kiln.kernels import rows_schedule
from kiln.kernels.conv_config import ConvConfig, ConvShape
from kiln.kernels.conv_schedule import conv_plan, pack_conv_weight
from kiln.kernels.gemm_schedule import GemmConfig, gemm_plan, pack_b
from kiln.kernels.plan import Compact, ShrinkTails, SimplifyIndices, VersionTails
from kiln.options import Options
from kiln.tir import interp
from kiln.tir.nodes import (
    Allocate,
    BufferStore,
    For,
    ForKind,
    IfThenElse,
    PrimFunc,
    Select,
    SeqStmt,
    Stmt,
    Tensorized,
)
from kiln.tir.tails import shrink_tail_tiles
from kiln.tir.tensorize import fma_tile, loop_points
from kiln.tir.visit import iter_exprs, iter_stmts

AVX2 = GemmConfig(mr=6, nr=16, kc=64, mc=30, nc=32, lanes=8)


def _tile_rows(func: PrimFunc) -> list[int]:
    """The rows of each tensorized register tile."""
    rows = []
    for s in iter_stmts(func.body):
        if isinstance(s, Tensorized):
            tile = fma_tile(s.loop, s.lanes)  # type: ignore[attr-defined]
            assert tile is not None
            rows.append(len(loop_points(tile.rows)))
    return rows


def _selects(stmt: Stmt) -> int:
    """The selects in the values ``stmt`` stores."""
    return sum(isinstance(e, Select) for s in iter_stmts(stmt) if isinstance(s, BufferStore)
               for e in iter_exprs(s.value))


def _without_shrink(plan):  # noqa: ANN001, ANN202
    return dataclasses.replace(plan, post=tuple(p for p in plan.post
                                                if not isinstance(p, ShrinkTails)))


@pytest.mark.parametrize("m,tail", [(49, 1), (128, 2), (197, 5), (48, 0), (3, 3)])
def test_the_last_tile_of_rows_computes_only_the_rows_it_holds(m: int, tail: int) -> None:
    plan = gemm_plan(m, 32, 64, AVX2, bias=True, b_prepacked=True)
    rows = _tile_rows(plan.build())
    assert set(rows) == ({6, tail} if tail else {6})  # (M = 3: the full copy never runs)
    assert set(_tile_rows(_without_shrink(plan).build())) == {6}  # (padding computed)


def test_without_the_tails_condition_no_loop_is_cut() -> None:
    """Unversioned, the tile of rows ``i0_1`` may be any tile, the first ones full: the
    conditions of the path are what make the last tile short."""
    plan = gemm_plan(49, 32, 64, AVX2, bias=True, b_prepacked=True)
    program = plan.trace.apply(plan.program).func
    for step in (Compact(), SimplifyIndices()):
        program = step.apply(program)
    assert shrink_tail_tiles(program) == program
    versioned = VersionTails(tuple(p.loops for p in plan.post if isinstance(p, VersionTails))[0]
                             ).apply(program)
    shrunk = shrink_tail_tiles(versioned)
    extents = sorted({s.extent for s in iter_stmts(shrunk.body)
                      if isinstance(s, For) and s.var.name == "i0_2"})
    assert extents == [1, 6]


def test_the_last_k_block_loses_its_step_test_and_runs_its_own_steps() -> None:
    """K = 70 in blocks of 32: `version_tails` leaves the last block one test a K step (an
    ``if`` as the K loop's whole body); `shrink_tail_tiles` cuts that loop to 70 - 64 = 6
    steps and drops the test. Without the shrink the test stays and the loop keeps 32."""
    cfg = dataclasses.replace(AVX2, kc=32)
    plan = gemm_plan(49, 40, 70, cfg, bias=True, b_prepacked=True)

    def k_loops(func: PrimFunc) -> list[For]:
        return [s for s in iter_stmts(func.body) if isinstance(s, For) and s.var.name == "k0_1"]

    def step_tests(func: PrimFunc) -> int:
        return sum(isinstance(loop.body, IfThenElse) for loop in k_loops(func))

    shrunk, kept = plan.build(), _without_shrink(plan).build()
    assert {loop.extent for loop in k_loops(shrunk)} == {32, 6} and step_tests(shrunk) == 0
    assert {loop.extent for loop in k_loops(kept)} == {32} and step_tests(kept) > 0


@pytest.mark.parametrize("m,n,k", [(1, 16, 13), (7, 16, 64), (49, 40, 70), (13, 33, 5)])
def test_shrunk_tiles_compute_what_the_padded_ones_did(options: Options, m: int, n: int,
                                                       k: int) -> None:
    """The interpreter and the C kernel give the sums in the loops' order with NaN, inf and
    zeros of either sign; a short tile's extra accumulator sets start at -0.0, so a row whose
    products are all -0.0 over a -0.0 bias stays -0.0 as the loops have it."""
    torch.manual_seed(m + n + k)
    a, w, bias = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    a[0, 1 % k] = float("nan")
    a[-1, :] = 0.0  # products 0 * w: -0.0 where w < 0
    w[-1, :] = -1.0
    bias[-1] = -0.0
    if m > 2:
        a[1, :] = float("inf")
    plan = gemm_plan(m, n, k, dataclasses.replace(AVX2, kc=max(k, 1)), bias=True,
                     b_prepacked=True)
    func = plan.build()
    packed = pack_b(w.t(), AVX2.nr)
    want = interp.run_torch(_without_shrink(plan).build(), [a, packed, bias])[0]
    torch.testing.assert_close(interp.run_torch(func, [a, packed, bias])[0], want,
                               rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(want, F.linear(a, w, bias), rtol=1e-5, atol=1e-5,
                               equal_nan=True)
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)
    out = torch.full((m, n), 7.0)
    kernel(a, packed, bias, out)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert torch.signbit(out[-1, -1]) and out[-1, -1] == 0


@pytest.mark.parametrize("nc", [48, 32])  # A read in place (one N block), A packed
def test_a_column_tail_tile_under_full_rows_is_a_register_tile(options: Options,
                                                                nc: int) -> None:
    """M = 49 and N = 40 leave a tail of rows and of columns. The column tail's tiles under
    the full row tiles pad to whole vectors too: the ``if`` that makes them full rows keeps A's
    rows (and the packed B's panel index) inside their buffers, where the loops' ranges alone
    reach past them. Before, those tiles stayed guarded scalar loops (Inception's merged 1x1
    GEMM 1225x176x288 took 3.6 ms, ATen 0.63)."""
    cfg = dataclasses.replace(AVX2, nc=nc)
    plan = gemm_plan(49, 40, 64, cfg, bias=True, b_prepacked=True)
    func = plan.build()
    source = render_c(func)
    assert "/* block C */" not in source  # every update is inside a tensorized tile
    assert sorted(_tile_rows(func)) == [1, 1, 6, 6]
    torch.manual_seed(0)
    a, w, bias = torch.randn(49, 64), torch.randn(40, 64), torch.randn(40)
    a[3, 5], a[47, 0] = float("nan"), float("inf")
    packed = pack_b(w.t(), cfg.nr)
    want = F.linear(a, w, bias)
    torch.testing.assert_close(interp.run_torch(func, [a, packed, bias])[0], want,
                               rtol=1e-5, atol=1e-5, equal_nan=True)
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)
    out = torch.full((49, 40), 7.0)
    kernel(a, packed, bias, out)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_a_short_tile_spreads_its_steps_over_accumulator_sets() -> None:
    """1 x 16 on 8 lanes is 2 FMA chains: 4 sets make 8, added after the loop; 13 steps run
    3 rounds of 4 and one last step into the first set. A 6-row tile has 12 chains: one."""
    source = render_c(gemm_plan(1, 16, 13, dataclasses.replace(AVX2, kc=13), bias=True,
                                b_prepacked=True).build())
    tile = source[source.index("/* fma_tile: 1 x 16"):]
    tile = tile[:tile.index('__asm__ volatile("" ::: "memory");')]
    assert FMA_CHAINS == 8
    assert tile.count("= {-0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f};") == 6
    assert "k0 + 4 <= 13; k0 += 4)" in tile and "for (; k0 < 13; ++k0)" in tile
    assert "fma0_acc0_0 += fma0_acc0_0_1 + fma0_acc0_0_2 + fma0_acc0_0_3;" in tile.replace(
        "fma1", "fma0")
    full = render_c(gemm_plan(12, 16, 13, dataclasses.replace(AVX2, kc=13), bias=True,
                              b_prepacked=True).build())
    assert "-0.0f" not in full


def test_a_convolutions_last_pixels_take_a_short_tile(options: Options) -> None:
    """A row of 10 output pixels in tiles of 4 (no tail tile of the schedule's own): the last
    tile computes its 2 pixels, where it computed 4, and matches torch, NaN included."""
    shape = ConvShape(n=1, ci=8, h=10, w=10, co=16, kernel=(3, 3), stride=(1, 1),
                      padding=(1, 1), dilation=(1, 1), bias=True)
    plan = conv_plan(shape, ConvConfig(tile=4, nr=16, pad_copy=True, lanes=8))
    func = plan.build()
    assert set(_tile_rows(func)) == {2, 4}
    assert set(_tile_rows(_without_shrink(plan).build())) == {4}
    torch.manual_seed(0)
    x = torch.randn(1, 8, 10, 10).contiguous(memory_format=torch.channels_last)
    x[0, 3, 0, 9] = float("nan")
    w, b = torch.randn(16, 8, 3, 3), torch.randn(16)
    want = F.conv2d(x, w, b, padding=1)
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)
    out = torch.full(want.shape, 7.0).contiguous(memory_format=torch.channels_last)
    kernel(x, pack_conv_weight(w, 16), b, out)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.parametrize("kind,n", [("softmax", 37), ("layernorm", 37), ("softmax", 197)])
def test_a_rows_full_chunks_run_without_the_tails_bounds_checks(options: Options, kind: str,
                                                                n: int) -> None:
    """`rfactor` pads a row's last chunk of lanes with the identity by a select in every
    chunk: versioned on the chunk loop, the full chunks lose it (and the exp pass's block
    predicate), the last one keeps both; the kernel computes the same values (to the
    rounding of a multiply-add the compiler may now contract: layer norm's squares)."""
    build = rows_schedule.softmax_rows if kind == "softmax" else rows_schedule.layernorm_rows
    func = build(6, n).func
    serial = tuple(s.var.name for s in iter_stmts(func.body)
                   if isinstance(s, For) and s.kind is ForKind.SERIAL)
    versioned = VersionTails(serial).apply(func)
    branches = [s for s in iter_stmts(versioned.body) if isinstance(s, IfThenElse)]
    assert branches and all(s.else_body is not None for s in branches)
    assert all(_selects(s.then_body) == 0 and _selects(s.else_body) > 0 for s in branches)
    assert _selects(func.body) > 0
    x = torch.randn(6, n) * 3
    x[1, 3], x[2, n - 1], x[3, 0], x[4, 5] = math.nan, math.inf, -math.inf, -0.0
    args = (x,) if kind == "softmax" else (x, torch.randn(n), torch.randn(n))
    outs = []
    for f in (func, versioned):
        kernel = compile_kernel(f, options)
        assert isinstance(kernel, CompiledKernel)
        out = torch.full((6, n), math.nan)
        kernel(*args, out)
        outs.append(out)
    torch.testing.assert_close(outs[1], outs[0], equal_nan=True, rtol=1e-6, atol=1e-7)


def _loops_around_stores(stmt: Stmt, buffer: str, loops: tuple = ()) -> list[tuple]:
    """For each store into ``buffer`` outside any block, the extents of the loops around it."""
    if isinstance(stmt, BufferStore):
        return [tuple(f.extent for f in loops)] if stmt.buffer.name == buffer else []
    if isinstance(stmt, For):
        return _loops_around_stores(stmt.body, buffer, (*loops, stmt))
    if isinstance(stmt, IfThenElse):
        return [*_loops_around_stores(stmt.then_body, buffer, loops),
                *(_loops_around_stores(stmt.else_body, buffer, loops)
                  if stmt.else_body is not None else [])]
    if isinstance(stmt, SeqStmt):
        return [x for s in stmt.stmts for x in _loops_around_stores(s, buffer, loops)]
    if isinstance(stmt, Allocate):
        return _loops_around_stores(stmt.body, buffer, loops)
    return []


def test_a_zero_padded_pack_keeps_the_iterations_that_write_its_zeros() -> None:
    """LeViT's subsampling attention, 49 queries in a block of 64: the pack of Q writes Q
    where the query exists and 0.0 in the other 15 lanes (`plan.ZeroPadding`). Cutting its
    loop to the 49 iterations the pack block runs left those lanes as the stack held them,
    and subnormal garbage made the scores' multiply-adds microcode assists (0.80 against
    0.11 ms a call): the zero stores keep their loop whole."""
    from kiln.kernels.attention_schedule import AttentionConfig, AttentionShape, attention_plan

    shape = AttentionShape(1, 8, 49, 196, 16, 64, 0.25)
    plan = attention_plan(shape, AttentionConfig(qb=64, mr_keys=6, mr_rows=4, lanes=16))
    shrunk = _loops_around_stores(plan.build().body, "Q_local")
    whole = _loops_around_stores(_without_shrink(plan).build().body, "Q_local")
    assert shrunk and shrunk == whole
    assert all(64 in extents for extents in shrunk)  # (every query lane of the block)
