"""kiln.tir.tensorize: which loop nests become the FMA_TILE intrinsic, and that the intrinsic
computes what its loops compute (TIR interpreter, generated C on every vector width)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from kiln.codegen.c import render_c
from kiln.codegen.kernel import CompiledKernel, compile_kernel
from kiln.ir.ops import Op
from kiln.ir.types import DType
from kiln.kernels.conv_config import ConvConfig, ConvShape
from kiln.kernels.conv_schedule import conv_plan
from kiln.kernels.depthwise_schedule import DepthwiseConfig, DepthwiseShape, depthwise_plan
from kiln.kernels.gemm_schedule import GemmConfig, gemm_func, gemm_plan, pack_b
from kiln.kernels.plan import Epilogue, Tensorize
from kiln.options import Options
from kiln.tir import interp
from kiln.tir.nodes import (
    Binary,
    BinOp,
    Buffer,
    BufferStore,
    Expr,
    For,
    ForKind,
    Intrinsic,
    PrimFunc,
    Scope,
    Tensorized,
    Var,
    const,
)
from kiln.tir.printer import print_func
from kiln.tir.tensorize import (
    acc_init,
    fma_tile,
    group_masks,
    loop_points,
    tensorize_fma_tiles,
    write_back,
)
from kiln.tir.visit import iter_stmts

F32 = DType.F32


def _tiles(func: PrimFunc) -> list[Tensorized]:
    return [s for s in iter_stmts(func.body) if isinstance(s, Tensorized)]


def _tile_loop(b_index: str = "j", acc_row: str = "i") -> For:
    """for p: for i in unrolled(2): for j in vectorized(8): acc[?, j] += a[p, i] * b[p, ?]"""
    acc = Buffer("acc", (2, 8), F32, scope=Scope.LOCAL)
    a, b = Buffer("a", (5, 2), F32), Buffer("b", (5, 8), F32)
    p, i, j = Var("p"), Var("i"), Var("j")
    col = {"j": j, "i": i * 4}[b_index]
    row = {"i": i, "0": const(0, DType.I64)}[acc_row]
    store = BufferStore(acc, (row, j), acc[row, j] + a[p, i] * b[p, col])
    return For(p, 5, For(i, 2, For(j, 8, store, ForKind.VECTORIZED), ForKind.UNROLLED))


def test_a_register_tile_matches_and_other_nests_do_not() -> None:
    loop = _tile_loop()
    tile = fma_tile(loop, lanes=8)
    assert tile is not None and tile.a.buffer.name == "a" and tile.b.buffer.name == "b"
    assert fma_tile(loop, lanes=16) is None  # 8 columns are not a whole 16-lane vector
    assert fma_tile(_tile_loop("i"), lanes=8) is None  # b does not move with the columns
    # both rows add into row 0 of acc: one accumulator each would lose one row's sums
    assert fma_tile(_tile_loop(acc_row="0"), lanes=8) is None
    assert fma_tile(For(loop.var, 5, loop.body, ForKind.PARALLEL), lanes=8) is None
    unvectorized = For(loop.body.var, 2, dataclasses.replace(loop.body.body,
                                                             kind=ForKind.SERIAL))
    assert fma_tile(For(loop.var, 5, unvectorized), lanes=8) is None


def test_an_index_that_is_not_affine_only_in_loops_outside_the_tile_still_matches() -> None:
    """a[g // 2, p, i] (grouped-query attention's key head) is fixed within the tile: it
    matches; a[p // 2, i] or a[p, i // 2], the tile's own loops in the division, do not (how
    they move is unknown)."""
    acc = Buffer("acc", (2, 8), F32, scope=Scope.LOCAL)
    p, i, j, g = Var("p"), Var("i"), Var("j"), Var("g")
    two = const(2, DType.I64)

    def loop(a: Buffer, a_index: tuple[Expr, ...]) -> For:
        b = Buffer("b", (5, 8), F32)
        store = BufferStore(acc, (i, j), acc[i, j] + a[a_index] * b[p, j])
        return For(p, 5, For(i, 2, For(j, 8, store, ForKind.VECTORIZED), ForKind.UNROLLED))

    grouped = Buffer("a", (3, 5, 2), F32)
    tile = fma_tile(loop(grouped, (Binary(BinOp.FLOORDIV, g, two), p, i)), lanes=8)
    assert tile is not None and tile.a.buffer is grouped
    flat = Buffer("a", (5, 2), F32)
    assert fma_tile(loop(flat, (Binary(BinOp.FLOORDIV, p, two), i)), lanes=8) is None
    assert fma_tile(loop(flat, (p, Binary(BinOp.FLOORDIV, i, two))), lanes=8) is None


def test_a_lane_that_reads_its_group_matches_as_a_group_broadcast() -> None:
    """a[(j // 4) * 4 + c] with c the innermost step (4 of them): each lane reads its group's
    element c, one vector load shuffled per step. Steps that leave the group (8 of them),
    a group term in a strided dim, or any other use of j do not match."""
    acc = Buffer("acc", (2, 8), F32, scope=Scope.LOCAL)
    p, c, i, j = Var("p"), Var("c"), Var("i"), Var("j")
    four = const(4, DType.I64)

    def loop(a: Buffer, index: Callable[[], tuple[Expr, ...]], steps: int = 4) -> For:
        b = Buffer("b", (3, steps, 8), F32)
        store = BufferStore(acc, (i, j), acc[i, j] + a[index()] * b[p, c, j])
        rows = For(i, 2, For(j, 8, store, ForKind.VECTORIZED), ForKind.UNROLLED)
        return For(p, 3, For(c, steps, rows))

    a = Buffer("a", (2, 8), F32)
    grouped = loop(a, lambda: (i, Binary(BinOp.FLOORDIV, j, four) * four + c))
    tile = fma_tile(grouped, lanes=8)
    assert tile is not None and tile.a_group == 4 and tile.a.buffer is a
    assert group_masks(tile, 8) == tuple(tuple((lane // 4) * 4 + k for lane in range(8))
                                         for k in range(4))
    assert fma_tile(loop(a, lambda: (i, Binary(BinOp.FLOORDIV, j, four) * four + c), 8),
                    lanes=8) is None  # (step 4 reads the next group)
    strided = Buffer("a", (8, 2), F32)  # the group's elements 2 apart
    assert fma_tile(loop(strided, lambda: (Binary(BinOp.FLOORDIV, j, four) * four + c, i)),
                    lanes=8) is None
    assert fma_tile(loop(a, lambda: (i, Binary(BinOp.FLOORDIV, j, four) * four + c
                                     + Binary(BinOp.FLOORMOD, j, four) * 0)), lanes=8) is None


def test_the_gemm_plan_tensorizes_its_full_k_loops_and_prints_them() -> None:
    cfg = GemmConfig(mr=4, nr=16, kc=384, mc=8, nc=512, lanes=8)
    plan = gemm_plan(128, 3072, 768, cfg, bias=True, b_prepacked=True)
    assert plan.post[-1] == Tensorize(("k0_1",), 8)
    assert "post.tensorize(['k0_1'], 'fma_tile', lanes=8)" in plan.as_python()
    func = plan.build()
    (tile,) = _tiles(func)
    assert tile.intrinsic is Intrinsic.FMA_TILE and tile.loop.var.name == "k0_1"
    assert "tensorized fma_tile(lanes=8):\n" in print_func(func)
    # a config without a vector width keeps the loop nest for the C compiler
    untouched = gemm_plan(128, 3072, 768, dataclasses.replace(cfg, lanes=0), bias=True,
                          b_prepacked=True)
    assert not _tiles(untouched.build())


def test_a_k_tail_block_runs_its_own_steps_as_a_tile(options: Options) -> None:
    """K = 29 in blocks of 8: the last block's K loop, which `version_tails` left with one
    test a step, is cut to its 5 steps without the test (`shrink_tail_tiles`), so it is a
    tile like the full blocks' (it was a loop nest, 2x slower: 128x512x1376 in blocks of 464
    ran 1451 us, 657 now); the results stay torch's, NaN and inf included."""
    cfg = GemmConfig(mr=4, nr=8, kc=8, mc=8, nc=16, lanes=8)
    func = gemm_func(13, 37, 29, cfg)
    k_loops = [s for s in iter_stmts(func.body) if isinstance(s, For) and s.var.name == "k0_1"]
    assert len(k_loops) == len(_tiles(func)) >= 2
    assert {loop.extent for loop in k_loops} == {8, 5}
    a, b = torch.randn(13, 29), torch.randn(29, 37)
    a[2, 28], a[5, 0] = float("nan"), float("inf")  # (in the tail block, and in the first)
    (got,) = interp.run_torch(func, [a, b])
    torch.testing.assert_close(got, a @ b, rtol=1e-4, atol=1e-4, equal_nan=True)
    kernel = compile_kernel(func, options)
    out = torch.full((13, 37), 1e30)
    kernel(a, b, out)
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_the_intrinsic_keeps_the_accumulators_in_vector_variables() -> None:
    cfg = GemmConfig(mr=4, nr=16, kc=64, mc=8, nc=64, lanes=8)
    source = render_c(gemm_func(64, 64, 64, cfg))
    tile = source[source.index("/* fma_tile: 4 x 16 register tile on 8-lane vectors */"):]
    tile = tile[:tile.index('__asm__ volatile("" ::: "memory");')]
    assert "typedef float kiln_f32x8 __attribute__((vector_size(32)));" in tile
    assert tile.count("kiln_f32x8 fma0_acc") == 8  # 4 rows x 2 vectors of accumulators
    k_loop = tile[tile.index("for ("):tile.index("*(kiln_f32x8u*)&C_local[0] = fma0_acc0_0;")]
    assert "C_local[" not in k_loop
    # the K loop stays a loop: each `for` right after a pragma that stops gcc unrolling it
    lines = tile.splitlines()
    loops = [i for i, line in enumerate(lines) if line.strip().startswith("for (")]
    assert loops and all(lines[i - 1].strip() == "#pragma GCC unroll 1" for i in loops)


def test_a_short_tile_keeps_its_b_vectors_in_registers() -> None:
    """A tile of at most 4 rows whose accumulators, b vectors and broadcast fit the registers
    pins each b vector (gcc folded them into the FMAs' memory operands); a taller tile, or
    one that would not fit, leaves them to the compiler."""
    def pins(mr: int, nr: int, lanes: int) -> int:
        cfg = GemmConfig(mr=mr, nr=nr, kc=32, mc=2 * mr, nc=nr, lanes=lanes)
        return render_c(gemm_func(24, nr, 32, cfg)).count(f"KILN_IN_REGISTER_{4 * lanes}(fma")
    assert pins(4, 24, 8) == 3  # 12 accumulators + 3 b + 1 broadcast: the 16 ymm
    assert pins(6, 16, 8) == 0  # six uses of each b: gcc keeps them
    assert pins(4, 32, 8) == 0  # 16 accumulators + 4 b: no room
    assert pins(4, 48, 16) == 3  # AVX-512: 32 zmm


def test_tensorizing_twice_changes_nothing_and_the_interpreter_runs_the_loop() -> None:
    cfg = GemmConfig(mr=3, nr=8, kc=7, mc=6, nc=16, lanes=4)
    func = gemm_func(10, 20, 14, cfg, bias=True)
    assert _tiles(func) and tensorize_fma_tiles(func, ("k0_1",), 4) == func
    a, b, bias = torch.randn(10, 14), torch.randn(14, 20), torch.randn(20)
    torch.testing.assert_close(interp.run_torch(func, [a, b, bias])[0],
                               torch.addmm(bias, a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lanes", [1, 4, 8, 16])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 15, 129), (15, 33, 7), (129, 48, 16)])
def test_tensorized_gemms_match_torch_on_every_vector_width(options: Options, lanes: int,
                                                            m: int, n: int, k: int) -> None:
    """Vector widths this machine lacks compile too (gcc splits or scalarizes them), so the
    AVX-512, AVX2, 128-bit and scalar tiles are all checked here; with NaN and inf rows."""
    nr = 2 * lanes if lanes > 1 else 4
    cfg = GemmConfig(mr=3, nr=nr, kc=64, mc=6, nc=4 * nr, lanes=lanes)
    torch.manual_seed(m + n + k + lanes)
    a, w, bias = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    a[0, 0] = float("nan")
    if m > 2:
        a[2, :] = float("inf")
        a[2, 0] = -float("inf")
    func = gemm_func(m, n, k, cfg, bias=True, b_prepacked=True)
    assert _tiles(func)
    kernel = compile_kernel(func, options)
    assert isinstance(kernel, CompiledKernel)
    out = torch.full((m, n), 7.0)
    kernel(a, pack_b(w.t(), nr), bias, out)
    torch.testing.assert_close(out, F.linear(a, w, bias), rtol=1e-4, atol=1e-4,
                               equal_nan=True)


@pytest.mark.parametrize("activation,args,reference", [
    (Op.RELU, (), torch.relu), (Op.GELU, ("tanh",), lambda x: F.gelu(x, approximate="tanh")),
])
def test_a_tensorized_tile_keeps_its_epilogue(options: Options, activation: Op, args: tuple,
                                              reference) -> None:  # noqa: ANN001
    cfg = GemmConfig(mr=6, nr=16, kc=100, mc=12, nc=64, lanes=8)
    func = gemm_func(37, 70, 100, cfg, bias=True, b_prepacked=True,
                     epilogue=Epilogue(activation, args))
    assert _tiles(func)
    a, w, bias = torch.randn(37, 100), torch.randn(70, 100), torch.randn(70)
    kernel = compile_kernel(func, options)
    out = torch.empty(37, 70)
    kernel(a, pack_b(w.t(), 16), bias, out)
    torch.testing.assert_close(out, reference(F.linear(a, w, bias)), rtol=1e-4, atol=1e-4)


def test_a_convolution_tensorizes_its_taps_inside_and_its_channels_at_the_border() -> None:
    """Interior tiles: the whole reduction (tap rows, tap columns, channels) is one FMA_TILE,
    so the accumulators are loaded and stored once per tile; border tiles, whose taps keep
    their guards, tensorize the loops inside the guards (a tap row's columns and channels,
    or one tap's channels)."""
    shape = ConvShape(1, 16, 20, 20, 32, (3, 3), (1, 1), (1, 1), bias=True)
    # (5-pixel tiles, guards: the configuration this layout of border tiles was written for;
    # AVX2's default is now 7 pixels over a padded copy)
    config = dataclasses.replace(ConvConfig.default(shape, 8, 16), pad_copy=False, tile=5)
    plan = conv_plan(shape, config)
    assert plan.post[-1] == Tensorize(("conv_i", "conv_j", "conv_ci"), 8)
    tiles = [fma_tile(t.loop, t.lanes) for t in _tiles(plan.build())]
    depths = {len(tile.k) for tile in tiles if tile is not None}
    assert depths == {1, 2, 3} and None not in tiles


def test_a_depthwise_tile_reads_its_input_as_vectors() -> None:
    """acc[pixel, c] += x[pixel + tap, c] * w[tap, c]: the input moves with the channels, so
    the row operand is a vector load, not a broadcast; the weights' vector is the shared b."""
    shape = DepthwiseShape(1, 32, 9, 9, (3, 3), (1, 1), (1, 1))
    plan = depthwise_plan(shape, DepthwiseConfig.default(shape, 8))
    tiles = [fma_tile(t.loop, t.lanes) for t in _tiles(plan.build())]
    assert tiles and all(t is not None and t.a_is_vector for t in tiles)
    assert {t.a.buffer.name for t in tiles} == {"x"} and {t.b.buffer.name for t in tiles} == {"w"}
    source = render_c(plan.build())
    assert "fma0_acc0_0 += *(const kiln_f32x8u*)&x[" in source


def test_strided_depthwise_keeps_its_loops_and_first_layers_tensorize() -> None:
    """A depthwise convolution of stride 2 keeps its loops, where FMA_TILE measured slower
    (Zen 3, AVX2); a convolution over 3 input channels is tensorized (its reduction kept a
    loop, FMA_TILE measured faster), in both its row tiles (6s, then 5s)."""
    stem = ConvShape(1, 3, 32, 32, 32, (3, 3), (2, 2), (1, 1), bias=True)
    config = ConvConfig.default(stem, 8, 16)
    assert (config.tile, config.tail_tile) == (6, 5)
    widths = set()
    for t in _tiles(conv_plan(stem, config).build()):
        parts = fma_tile(t.loop, 8)
        assert parts is not None
        widths.add(math.prod(r.extent for r in parts.rows))
    assert widths == {6, 5}
    strided = DepthwiseShape(1, 32, 16, 16, (3, 3), (2, 2), (1, 1))
    assert not _tiles(depthwise_plan(strided, DepthwiseConfig.default(strided, 8)).build())


@pytest.mark.parametrize(("activation", "args"), [(Op.CLAMP, (0.0, 6.0)), (Op.RELU, ()),
                                                  (None, ())])
def test_a_tile_stores_its_activation_from_the_registers(options: Options,
                                                         activation: Op | None,
                                                         args: tuple) -> None:
    """The nest after a GEMM tile that stores its accumulators (through relu, a clamp, or
    as they are) becomes the tile's write-back: the fast copy has no store loop left, the
    interpreter and the compiled kernel both match eager, NaN and inf included."""
    m, k, n = 50, 16, 40
    cfg = GemmConfig(mr=6, nr=16, kc=k, mc=12, nc=48, lanes=8)
    epilogue = Epilogue(activation, args) if activation is not None else None
    plan = gemm_plan(m, n, k, cfg, bias=True, b_prepacked=True,
                     name=f"wb_{activation.value if activation else 'none'}", epilogue=epilogue)
    func = plan.build()
    backs = [t for t in _tiles(func) if t.write_back is not None]
    assert backs and all(write_back(fma_tile(t.loop, 8), t.write_back, 8) for t in backs)
    x, w, bias = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    x[3, 2], x[7, 0] = float("nan"), float("inf")
    want = F.linear(x, w, bias)
    if activation is Op.CLAMP:
        want = want.clamp(0.0, 6.0)
    elif activation is Op.RELU:
        want = want.relu()
    packed = pack_b(w.t(), cfg.nr)
    (got,) = interp.run_torch(func, [x, packed, bias])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
    source = render_c(func)
    assert "fma0_out" in source and "kiln_i32x8" in source
    kernel = compile_kernel(func, options)
    out = torch.full((m, n), 1e30)
    kernel(x, packed, bias, out)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_a_nest_that_is_no_write_back_keeps_its_loop() -> None:
    """A bound that is NaN, or a store that is not an activation of the accumulator against
    constants, leaves the nest after the tile as it is."""
    tile_loop = _tile_loop()
    tile = fma_tile(tile_loop, 4)
    assert tile is not None
    acc, out = tile.acc.buffer, Buffer("out", (2, 8), F32)
    i, j = Var("wi"), Var("wj")

    def nest(value: Expr) -> For:
        return For(i, 2, For(j, 8, BufferStore(out, (i, j), value), ForKind.VECTORIZED),
                   ForKind.UNROLLED)

    element = acc[i, j]
    assert write_back(tile, nest(Binary(BinOp.MAX, const(0.0, F32), element)), 4) is not None
    assert write_back(tile, nest(element), 4) is not None
    assert write_back(tile, nest(Binary(BinOp.MAX, const(float("nan"), F32), element)),
                      4) is None
    assert write_back(tile, nest(element * element), 4) is None
    assert write_back(tile, nest(Binary(BinOp.MAX, out[i, j], element)), 4) is None
    half = For(i, 1, For(j, 8, BufferStore(out, (i, j), element), ForKind.VECTORIZED),
               ForKind.UNROLLED)
    assert write_back(tile, half, 4) is None  # (one of the two rows)


@pytest.mark.parametrize("init", ["bias", "residual", "residual_and_row", "k_blocks"])
def test_a_tile_starts_from_its_init_in_the_registers(options: Options, init: str) -> None:
    """The nest before a GEMM tile that sets its accumulators (a bias row, a residual, a
    residual plus a row, C from the last K block) becomes the tile's init: the accumulators
    load from it, not from the stack copy, and the interpreter and the compiled kernel match
    eager, NaN, inf and -0.0 included."""
    # (K blocks: whole tiles only, since a tail tile's load of C keeps its bounds checks)
    m, k, n = (48, 16, 48) if init == "k_blocks" else (50, 16, 40)
    cfg = GemmConfig(mr=6, nr=16, kc=8 if init == "k_blocks" else k, mc=12, nc=48, lanes=8)
    flags = {"bias": {}, "residual": {"bias_matrix": True}, "k_blocks": {},
             "residual_and_row": {"bias_matrix": True, "bias_row": True}}[init]
    func = gemm_plan(m, n, k, cfg, bias=True, b_prepacked=True, name=f"init_{init}",
                     **flags).build()
    inits = [t for t in _tiles(func) if t.init is not None]
    assert inits and all(acc_init(fma_tile(t.loop, 8), t.init, 8) for t in inits)
    x, w = torch.randn(m, k), torch.randn(n, k)
    x[3, 2], x[7, 0] = float("nan"), float("inf")
    x[11] = 0.0
    bias = torch.randn(m, n) if flags else torch.randn(n)
    bias.view(-1)[:5] = -0.0
    operands = [x, pack_b(w.t(), cfg.nr), bias]
    want = x @ w.t() + bias
    if init == "residual_and_row":
        row = torch.randn(n)
        row[0] = -0.0
        operands.append(row)
        want = x @ w.t() + (bias + row)
    (got,) = interp.run_torch(func, operands)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
    # the tiles of whole columns start in the registers; the tail of N = 40 (a tile of full
    # rows, one of the last 2 rows) reads its bias under a bounds check, so starts from the
    # stack copy, as does no other
    plain = [t for t in _tiles(func) if t.init is None]
    assert [len(loop_points(fma_tile(t.loop, 8).rows)) for t in plain] == ([] if init == "k_blocks"
                                                                 else [6, 2])
    source = render_c(func)
    assert source.count("= *(const kiln_f32x8u*)&C_local[") == 2 * (6 + 2) * (init != "k_blocks")
    kernel = compile_kernel(func, options)
    out = torch.full((m, n), 1e30)
    kernel(*operands, out)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4, equal_nan=True)
    assert torch.equal(torch.signbit(out[11]), torch.signbit(want[11]))  # (-0.0 kept)


def test_a_nest_that_is_no_init_keeps_its_loop() -> None:
    """A product, a load of the accumulators themselves, a load that moves along the lanes by
    more than 1, or a nest over part of the tile leaves the nest before it as it is."""
    tile = fma_tile(_tile_loop(), 4)
    assert tile is not None
    acc, bias = tile.acc.buffer, Buffer("bias", (2, 16), F32)
    i, j = Var("wi"), Var("wj")

    def nest(value: Expr, rows: int = 2) -> For:
        return For(i, rows, For(j, 8, BufferStore(acc, (i, j), value), ForKind.VECTORIZED),
                   ForKind.UNROLLED)

    assert acc_init(tile, nest(bias[i, j]), 4) is not None
    assert acc_init(tile, nest(bias[0, j] + bias[i, 0] + const(1.0, F32)), 4) is not None
    assert acc_init(tile, nest(bias[i, j] * bias[i, j]), 4) is None
    assert acc_init(tile, nest(acc[i, j] + bias[i, j]), 4) is None
    assert acc_init(tile, nest(bias[i, j * 2]), 4) is None
    assert acc_init(tile, nest(bias[i, j], rows=1), 4) is None  # (one of the two rows)
