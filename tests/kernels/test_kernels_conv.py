"""The generated dense direct convolution (channels-last, fp32): against eager torch at odd
sizes, both border strategies (padded copy, guards), every kind of epilogue, non-finite
inputs, on the portable path; its plan; what it refuses; and a first layer through
kiln.compile."""

from __future__ import annotations

import dataclasses
import platform

import pytest
import torch
from torch import nn

import kiln
from kiln.codegen.c import CRenderer
from kiln.codegen.isa import Isa, target_isa
from kiln.codegen.kernel import compile_kernel, prebuild
from kiln.ir import parse_graph, verify
from kiln.ir.fused import apply_activation
from kiln.ir.ops import Op
from kiln.kernels.contractions import build_contraction_kernels, contraction_groups
from kiln.kernels.conv import MAX_REDUCTION, NCHW_MAX_CI, conv_groups, refusal, source_strides
from kiln.kernels.conv_config import (
    PAD_COPY_BYTES,
    SMALL_COPY_BYTES,
    ConvConfig,
    ConvShape,
    broadcast_group,
    group_lanes,
    panel_within_group,
)
from kiln.kernels.conv_schedule import conv_plan, pack_conv_weight
from kiln.kernels.decide import Decisions
from kiln.kernels.outcome import Measured
from kiln.kernels.plan import Epilogue, Recipe, Serial
from kiln.options import Options
from kiln.passes.partition import gather
from kiln.runtime.executor import build_executor
from kiln.runtime.memory import plan_memory
from kiln.tir.nodes import Block, Tensorized
from kiln.tir.tensorize import fma_tile, group_masks
from kiln.tir.visit import iter_stmts
from kiln.tune.space_window import WindowSpace

CL = torch.channels_last

# (n, ci, h, w, co, kernel, stride, padding, dilation, bias, activation, act_args, pad_copy)
CASES = [
    (1, 3, 17, 19, 32, 3, 2, 1, 1, True, Op.CLAMP, (0.0, 6.0), True),  # a first layer
    (1, 3, 17, 19, 32, 3, 2, 1, 1, True, Op.RELU, (), False),  # the same with guards
    (2, 5, 9, 8, 20, 3, 1, 1, 1, False, Op.GELU, ("tanh",), True),  # N=2, CO a panel tail
    (1, 4, 11, 13, 40, 5, 1, 2, 1, True, Op.SIGMOID, (), False),  # 5x5, guards, 2 panels
    (1, 6, 7, 23, 17, 3, 1, 0, 2, True, None, (), True),  # no padding, dilation 2
    (1, 2, 3, 2, 7, 3, 1, 1, 1, True, Op.LEAKY_RELU, (0.1,), True),  # H, W < kernel: all border
    (1, 3, 15, 15, 64, 7, 2, 3, 1, True, Op.RELU, (), True),  # a ResNet-like 7x7 stem
    (1, 8, 6, 31, 33, 1, 1, 1, 1, True, Op.TANH, (), False),  # a padded 1x1, a pixel tail
    (1, 16, 12, 12, 32, 3, 2, 1, 1, True, Op.HARDSWISH, (), False),  # LeViT's stem
]
IDS = [f"{c[1]}x{c[2]}x{c[3]}to{c[4]}k{c[5]}s{c[6]}p{c[7]}{c[10].text if c[10] else ''}"
       f"{'copy' if c[12] else 'guard'}" for c in CASES]


def _case(case: tuple, lanes: int = 16) -> tuple:
    n, ci, h, w, co, k, s, p, d, bias, act, args, pad_copy = case
    shape = ConvShape(n, ci, h, w, co, (k, k), (s, s), (p, p), (d, d), bias)
    config = dataclasses.replace(ConvConfig.default(shape, lanes), pad_copy=pad_copy)
    epilogue = Epilogue(act, args) if act is not None else None
    name = f"conv_test_{'_'.join(map(str, case[:9]))}_{int(pad_copy)}_{lanes}"
    return shape, config, conv_plan(shape, config, name=name, epilogue=epilogue)


def _operands(shape: ConvShape, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape.n, shape.ci, shape.h, shape.w, generator=gen).contiguous(
        memory_format=CL)
    weight = torch.randn(shape.co, shape.ci, *shape.kernel, generator=gen)
    bias = torch.randn(shape.co, generator=gen)
    return x, weight, bias


def _eager(shape: ConvShape, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
           act: Op | None, args: tuple) -> torch.Tensor:
    y = torch.nn.functional.conv2d(x, weight.contiguous(memory_format=CL),
                                   bias if shape.bias else None, shape.stride, shape.padding,
                                   shape.dilation)
    apply_activation(y, act, args)
    return y


def _run(kernel, shape: ConvShape, config: ConvConfig, x: torch.Tensor,  # noqa: ANN001
         weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    out = torch.full((shape.n, shape.co, *shape.out), float("nan")).contiguous(
        memory_format=CL)
    operands = [x, pack_conv_weight(weight, config.nr)] + ([bias] if shape.bias else [])
    kernel(*operands, out)
    return out


@pytest.fixture(scope="module")
def built(kernel_options: Options) -> dict:
    """Every case's kernel, compiled in parallel (the compiler dominates this file's time)."""
    plans = {case: _case(case) for case in CASES}
    prebuild([plan.build() for _, _, plan in plans.values()], kernel_options)
    return {case: (shape, config, plan, compile_kernel(plan.build(), kernel_options))
            for case, (shape, config, plan) in plans.items()}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_conv_matches_eager(built: dict, case: tuple) -> None:
    shape, config, plan, kernel = built[case]
    x, weight, bias = _operands(shape, seed=len(IDS[CASES.index(case)]))
    got = _run(kernel, shape, config, x, weight, bias)
    want = _eager(shape, x, weight, bias, case[10], case[11])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got.is_contiguous(memory_format=CL)
    assert plan.recipe is Recipe.CONV
    assert plan.replayed() == plan.build()  # the trace is the shipped kernel


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[3]], ids=[IDS[0], IDS[1], IDS[3]])
def test_conv_non_finite_inputs(built: dict, case: tuple) -> None:
    """NaN and +-inf inputs, in the interior and on the border, give NaN and inf where ATen's
    NHWC convolution gives them."""
    shape, config, _, kernel = built[case]
    x, weight, bias = _operands(shape, seed=3)
    x[0, 0, 0, 0] = float("nan")
    x[0, 1, shape.h // 2, shape.w // 2] = float("inf")
    x[0, 2 % shape.ci, -1, -1] = float("-inf")
    got = _run(kernel, shape, config, x, weight, bias)
    want = _eager(shape, x, weight, bias, case[10], case[11])
    assert not torch.isfinite(want).all()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_pack_conv_weight_panels() -> None:
    """Panels of NR output channels, [P, KH, KW, CI, NR], the tail panel zero-padded."""
    w = torch.randn(20, 3, 2, 5)
    packed = pack_conv_weight(w, 16)
    assert packed.shape == (2, 2, 5, 3, 16) and packed.is_contiguous()
    assert torch.equal(packed[1, 1, 4, 2, :4], w[16:, 2, 1, 4])
    assert not packed[1, :, :, :, 4:].any()


def test_conv_default_config() -> None:
    """Two vectors of output channels where CO fills more than one; a tile that divides the
    row where one does, else the fewest and most even tiles; the threads on the panels only
    where they balance; the padded copy only where there is padding and the copy is small,
    or the window is wide over few channels (a 7x7 stem); the threads share the work
    dynamically where it is compute-bound (many channels over many pixels), statically
    where it is not."""
    wide = ConvShape(1, 64, 56, 56, 64, (3, 3), (1, 1), (1, 1))
    # a panel a thread over 56 rows: the threads split the rows; an 861 KB copy
    assert ConvConfig.default(wide, 16) == ConvConfig(7, 32, False, False,
                                                      dynamic=True, lanes=16)
    wide_128 = ConvShape(1, 128, 56, 56, 128, (3, 3), (1, 1), (1, 1))
    assert ConvConfig.default(wide_128, 16).split_panels  # two panels a thread
    # 14 rows in tiles of two: 7 row tiles do not balance on 2 threads; the panels then
    assert ConvConfig.default(ConvShape(1, 64, 14, 14, 64, (3, 3), (1, 1), (1, 1)), 16,
                              full_rate=True).split_panels
    small = ConvShape(1, 512, 7, 7, 512, (3, 3), (1, 1), (1, 1))
    # (2.4 M weights for 25 K outputs: memory-bound, static)
    assert ConvConfig.default(small, 16) == ConvConfig(7, 32, True, False, dynamic=False, lanes=16)
    stem = ConvShape(1, 3, 224, 224, 32, (3, 3), (2, 2), (1, 1))
    # guards: 7 pixels
    assert ConvConfig.default(stem, 16) == ConvConfig(7, 32, False, False, lanes=16)
    narrow = ConvShape(1, 3, 9, 9, 16, (3, 3), (1, 1), (0, 0))
    assert ConvConfig.default(narrow, 16) == ConvConfig(7, 16, False, False, lanes=16)  # no padding
    unpadded = ConvShape(1, 3, 225, 225, 32, (3, 3), (2, 2), (0, 0))
    assert ConvConfig.default(unpadded, 16) == ConvConfig(14, 32, False, False, lanes=16)
    # no tile divides a row of 71 (or 17) pixels: the fewest tiles, as even as they go
    prime_row = ConvShape(1, 80, 73, 73, 192, (3, 3), (1, 1), (0, 0))
    assert ConvConfig.default(prime_row, 16) == ConvConfig(12, 32, True, False,
                                                           dynamic=True, lanes=16)  # 5x12 + 11
    reduction = ConvShape(1, 288, 35, 35, 384, (3, 3), (2, 2), (0, 0))
    assert ConvConfig.default(reduction, 16).tile == 9  # 9 + 8, not 14 + 3
    tiny = ConvShape(1, 8, 14, 14, 16, (3, 3), (1, 1), (1, 1))
    assert ConvConfig.default(tiny, 16) == ConvConfig(14, 16, False, True, lanes=16)  # an 8 KB copy
    assert 4 * 8 * 16 * 16 <= SMALL_COPY_BYTES < 4 * 3 * 226 * 226 <= PAD_COPY_BYTES
    resnet_stem = ConvShape(1, 3, 224, 224, 64, (7, 7), (2, 2), (3, 3))
    assert ConvConfig.default(resnet_stem, 16).pad_copy  # a 635 KB copy: 49 taps over 3
    huge = ConvShape(1, 3, 2400, 2400, 64, (7, 7), (2, 2), (3, 3))
    assert not ConvConfig.default(huge, 16).pad_copy  # past the workspace cap


def test_conv_default_config_where_512_bit_fmas_run_at_full_rate() -> None:
    """Stride 1 over two vectors of channels: two rows of up to 7 pixels over the padded
    copy (28 accumulators) where the copy is small enough or there is no padding; stride 2,
    one vector of channels, a first layer's few channels and large copies as before."""
    from kiln.kernels.conv_config import TWO_ROW_COPY_BYTES

    def default(shape: ConvShape) -> ConvConfig:
        return ConvConfig.default(shape, 16, full_rate=True)

    mid = ConvShape(1, 256, 14, 14, 256, (3, 3), (1, 1), (1, 1))
    assert (default(mid).rows, default(mid).tile, default(mid).pad_copy) == (2, 7, True)
    # a panel a thread: the rows, in fixed runs over the copy, as the copy's own rows are
    wide = default(ConvShape(1, 64, 56, 56, 64, (3, 3), (1, 1), (1, 1)))
    assert (wide.rows, wide.pad_copy, wide.split_panels, wide.dynamic) == (2, True, False, False)
    assert ConvConfig.default(mid, 16).rows == 1  # (not at half rate)
    odd = ConvShape(1, 128, 17, 17, 192, (3, 3), (1, 1), (1, 1))
    assert (default(odd).rows, default(odd).tile) == (2, 6)  # 6 + 6 + 5
    unpadded = ConvShape(1, 32, 149, 149, 32, (3, 3), (1, 1), (0, 0))
    assert (default(unpadded).rows, default(unpadded).pad_copy) == (2, False)
    big_copy = ConvShape(1, 32, 147, 147, 64, (3, 3), (1, 1), (1, 1))
    assert 4 * 32 * 149 * 149 > TWO_ROW_COPY_BYTES and default(big_copy).rows == 1
    strided = ConvShape(1, 128, 56, 56, 128, (3, 3), (2, 2), (1, 1))
    assert default(strided) == ConvConfig.default(strided, 16)  # (guards, no copy)
    one_vector = ConvShape(1, 16, 28, 28, 16, (3, 3), (1, 1), (1, 1))
    assert default(one_vector).rows == 1
    stem = ConvShape(1, 3, 224, 224, 64, (7, 7), (2, 2), (3, 3))  # (the copy anyway)
    assert (default(stem).rows, default(stem).tile, default(stem).pad_copy) == (2, 7, True)
    unpadded_strided = ConvShape(1, 3, 299, 299, 32, (3, 3), (2, 2), (0, 0))
    assert (default(unpadded_strided).rows, default(unpadded_strided).tile) == (2, 7)


@pytest.mark.parametrize(("size", "pad", "residual", "stem"), [
    (7, 1, False, False), (9, 0, True, False), (14, 1, True, False), (17, 1, False, False),
    (23, 3, False, True), (19, 0, False, True)])
def test_two_row_tiles_match(kernel_options: Options, size: int, pad: int,
                             residual: bool, stem: bool) -> None:
    """Tiles of two output rows (an odd count of rows leaves a last row alone; 17 columns in
    tiles of 6 and 5; a first layer's 7x7 stride-2 window over its padded copy, and a
    stride-2 layer without padding) match eager, NaN and inf included, with a residual too."""
    # (stem: a first layer's 3 channels, a 7x7 window when padded (over the copy), stride 2)
    window, stride = ((7, 7) if pad else (3, 3), (2, 2)) if stem else ((3, 3), (1, 1))
    shape = ConvShape(1, 3 if stem else 40, size, size, 64, window, stride, (pad, pad),
                      bias=True, residual=residual)
    config = ConvConfig.default(shape, 16, full_rate=True)
    assert config.rows == 2 and config.pad_copy == bool(pad)
    plan = conv_plan(shape, config, name=f"conv_test_two_rows_{size}_{pad}_{int(residual)}"
                     f"_{int(stem)}", epilogue=Epilogue(Op.RELU, ()))
    _assert_relu_conv_matches_eager(compile_kernel(plan.build(), kernel_options), shape,
                                    config, size, residual)


def test_conv_default_config_on_16_registers() -> None:
    """AVX2 (16 registers): rows wider than 7 in 6-pixel tiles, with 5-pixel ones at the end
    of a row that 6 does not divide (else a 7 and 6s, or 6s and the rest), with guards; a
    row of 7 takes one tile over the padded copy; a first layer over 3 channels (loops, not
    an FMA_TILE) at most 6."""
    def config(size: int, ci: int, stride: int = 1) -> ConvConfig:
        shape = ConvShape(1, ci, size, size, ci, (3, 3), (stride, stride), (1, 1))
        return ConvConfig.default(shape, 8, registers=16)

    def tiles(c: ConvConfig, ow: int) -> tuple[bool, int, int, int]:
        return c.pad_copy, c.tile, c.tail_tile, c.split_at(ow)

    assert tiles(config(28, 128), 28) == (False, 6, 5, 18)  # 6+6+6, 5+5; guards
    assert tiles(config(30, 128), 30) == (False, 6, 0, 0)
    assert tiles(config(7, 512), 7) == (True, 7, 0, 0)
    assert tiles(config(56, 64), 56) == (False, 6, 5, 36)  # 6 x 6, 4 x 5
    assert tiles(config(56, 128, 2), 28) == (False, 6, 5, 18)
    assert tiles(config(17, 128), 17) == (False, 6, 5, 12)
    assert tiles(config(13, 128), 13) == (False, 7, 6, 7)  # a 7, then 6s
    assert tiles(config(14, 128), 14) == (False, 6, 2, 12)  # 6s, then what is left
    assert tiles(config(20, 128), 20) == (False, 5, 0, 0)
    assert not ConvConfig.default(ConvShape(1, 256, 14, 14, 256, (3, 3), (1, 1), (1, 1)),
                                  16).pad_copy  # AVX-512 keeps its guards there
    stem = ConvShape(1, 3, 224, 224, 64, (7, 7), (2, 2), (3, 3))
    assert ConvConfig.default(stem, 8, registers=16).tile == 6  # loops over 3 channels
    assert ConvConfig.default(stem, 16).tile == 7


def test_conv_guarded_rows_take_no_short_tile() -> None:
    """AVX-512 with guards: a row that no width of 4 to 8 divides takes tiles of t, then of
    t - 1 (17 columns: 6 + 6 + 5, where 7 + 7 + 3 ran Inception's 1x7 layers 1.5x slower);
    rows that one divides keep it, and the padded copy's tiles are left as they were."""
    def config(size: int, kernel: tuple[int, int], ci: int = 192) -> ConvConfig:
        pad = (kernel[0] // 2, kernel[1] // 2)
        return ConvConfig.default(ConvShape(1, ci, size, size, 192, kernel, (1, 1), pad), 16)

    def tiles(c: ConvConfig, ow: int) -> tuple[bool, int, int, int]:
        return c.pad_copy, c.tile, c.tail_tile, c.split_at(ow)

    assert tiles(config(17, (1, 7)), 17) == (False, 6, 5, 12)
    assert tiles(config(17, (7, 1)), 17) == (False, 6, 5, 12)
    assert tiles(config(17, (3, 3)), 17) == (False, 6, 5, 12)
    assert tiles(config(71, (3, 3), 64), 71) == (False, 8, 7, 64)  # 8 x 8, then a 7
    assert tiles(config(13, (3, 3)), 13) == (False, 7, 6, 7)
    assert tiles(config(35, (1, 7)), 35) == (False, 7, 0, 0)
    assert tiles(config(10, (3, 3)), 10) == (True, 10, 0, 0)  # (the copy: one tile a row)


def test_a_tile_takes_no_more_pixels_than_an_l1_set_holds() -> None:
    """Pixels a multiple of 4 KiB apart in the input share one L1 set, of 8 lines: ResNet-50's
    512->1024 1x1 stride-2 shortcut (pixels 2 x 512 x 4 bytes apart) took 14-pixel tiles and
    ran 1.3x slower than with 7. 2 KiB apart (two sets) and an NCHW source keep 14."""
    def tile(ci: int, size: int, stride: int, x_strides=None) -> int:
        shape = ConvShape(1, ci, size, size, 2 * ci, (1, 1), (stride, stride), (0, 0),
                          x_strides=x_strides)
        return ConvConfig.default(shape, 16).tile

    assert tile(512, 28, 2) == 7
    assert tile(1024, 14, 1) == 7
    assert tile(256, 28, 2) == 14
    assert tile(512, 14, 1) == 14
    assert tile(512, 28, 2, x_strides=(512 * 28 * 28, 28 * 28, 28, 1)) == 14


def test_conv_1x7_tail_tiles_match(kernel_options: Options) -> None:
    """Inception's 1x7 layer over 17 columns (guards on both sides of the row, tiles 6 + 6
    + 5) matches eager, NaN and inf included."""
    shape = ConvShape(1, 96, 17, 17, 48, (1, 7), (1, 1), (0, 3), bias=True)  # (no copy)
    config = dataclasses.replace(ConvConfig.default(shape, 16), lanes=16)
    assert (config.pad_copy, config.tile, config.tail_tile) == (False, 6, 5)
    plan = conv_plan(shape, config, name="conv_test_1x7_tails", epilogue=Epilogue(Op.RELU, ()))
    kernel = compile_kernel(plan.build(), kernel_options)
    x, weight, bias = _operands(shape, seed=17)
    x[0, 3, 2, 16], x[0, 5, 9, 12] = float("nan"), float("inf")
    got = _run(kernel, shape, config, x, weight, bias)
    torch.testing.assert_close(got, _eager(shape, x, weight, bias, Op.RELU, ()),
                               rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISA flags")
@pytest.mark.parametrize("size", [10, 11, 14])
def test_conv_avx2_tiles_match(kernel_options: Options, size: int) -> None:
    """Compiled for AVX2, the tiles with guards (10: 5 + 5; 11: 6 + a 5 tail; 14: 6 + 6 + a
    2 tail) match eager, NaN included."""
    options = dataclasses.replace(kernel_options, c_flags=("-O3", "-march=x86-64-v3", "-fopenmp"))
    assert target_isa(options) is Isa.AVX2
    shape = ConvShape(1, 16, size, size, 24, (3, 3), (1, 1), (1, 1))
    config = ConvConfig.default(shape, 8, registers=16)
    assert (config.pad_copy, config.tile, config.tail_tile) == {
        10: (False, 5, 0), 11: (False, 6, 5), 14: (False, 6, 2)}[size]
    plan = conv_plan(shape, config, name=f"conv_test_avx2_{size}", epilogue=Epilogue(Op.RELU, ()))
    kernel = compile_kernel(plan.build(), options)
    x, weight, bias = _operands(shape, seed=size)
    x[0, 3, 0, size - 1] = float("nan")
    got = _run(kernel, shape, config, x, weight, bias)
    torch.testing.assert_close(got, _eager(shape, x, weight, bias, Op.RELU, ()),
                               rtol=1e-4, atol=1e-4, equal_nan=True)


def test_conv_split_at_covers_the_row_with_whole_tiles() -> None:
    """`ConvConfig.split_at`: the most full tiles that leave whole tail tiles; 0 where the
    tile divides the row, there is no tail, or no split makes the row."""
    mixed = ConvConfig(6, tail_tile=5)
    assert [mixed.split_at(ow) for ow in (28, 56, 17, 35, 11, 5, 30, 12, 14, 7, 9)] == \
        [18, 36, 12, 30, 6, 0, 0, 0, 0, 0, 0]
    assert ConvConfig(6).split_at(28) == 0


@pytest.mark.parametrize(("size", "stride", "pad_copy", "residual"), [
    (28, 1, True, False), (16, 1, False, True), (22, 2, False, False), (17, 1, True, True)])
def test_conv_tail_tiles_match(kernel_options: Options, size: int, stride: int,
                               pad_copy: bool, residual: bool) -> None:
    """A row in 6-pixel tiles and then 5-pixel ones (with the padded copy or guards, stride
    1 or 2, a residual) matches eager, NaN and inf included, at a tail pixel too."""
    shape = ConvShape(1, 16, size, size, 24, (3, 3), (stride, stride), (1, 1), bias=True,
                      residual=residual)
    config = ConvConfig(6, 16, True, pad_copy, lanes=8, tail_tile=5)
    ow = shape.out[1]
    assert 0 < config.split_at(ow) < ow
    plan = conv_plan(shape, config, name=f"conv_test_tail_{size}_{stride}_{int(pad_copy)}"
                     f"_{int(residual)}", epilogue=Epilogue(Op.RELU, ()))
    func = plan.build()
    blocks = {b.name for b in iter_stmts(func.body) if isinstance(b, Block)}
    assert {"conv", "conv_tail"} <= blocks
    _assert_relu_conv_matches_eager(compile_kernel(func, kernel_options), shape, config, size,
                                    residual)


def _assert_relu_conv_matches_eager(kernel: object, shape: ConvShape, config: ConvConfig,
                                    size: int, residual: bool) -> None:
    """``kernel`` (bias + relu, and a residual where given) against eager on random inputs
    with a NaN at the first row's last pixel and an inf at the last row's first."""
    x, weight, bias = _operands(shape, seed=size)
    x[0, 1, 0, size - 1] = float("nan")
    x[0, 2, size - 1, 0] = float("inf")
    want = torch.nn.functional.conv2d(x, weight, bias, shape.stride, shape.padding)
    operands = [x, pack_conv_weight(weight, config.nr), bias]
    if residual:
        shortcut = torch.randn(want.shape).contiguous(memory_format=CL)
        operands.append(shortcut)
        want = want + shortcut
    got = torch.full(want.shape, float("nan")).contiguous(memory_format=CL)
    kernel(*operands, got)  # type: ignore[operator]
    torch.testing.assert_close(got, want.relu(), rtol=1e-4, atol=1e-4, equal_nan=True)


def test_conv_plan_serial_by_work() -> None:
    """A layer with few outputs but a long reduction (7x7x512 -> 512) keeps its threads; a
    small one runs on one thread."""
    big = ConvShape(1, 512, 7, 7, 512, (3, 3), (1, 1), (1, 1))
    assert not any(isinstance(p, Serial) for p in conv_plan(big, ConvConfig()).post)
    small = ConvShape(1, 3, 8, 8, 8, (3, 3), (1, 1), (1, 1))
    assert any(isinstance(p, Serial) for p in conv_plan(small, ConvConfig(8, 16)).post)


def test_large_conv_weights_get_their_next_panel_prefetched(kernel_options: Options) -> None:
    """A packed weight from PREFETCH_MIN_BYTES on (here 3x3 over 100 channels to 70, three
    panels of 32, the last 6 of them padding) prefetches the next panel, clamped to the
    last, at each step of the input-channel loop (ResNet-50's 7x7x512 layer on weights cold
    from DRAM ran 1043 us without it, 808 with it); the values stay eager's, NaN included. A
    small weight gets no prefetch."""
    from kiln.kernels.plan import PrefetchPanels
    from kiln.tir.nodes import Prefetch

    shape = ConvShape(1, 100, 9, 11, 70, (3, 3), (1, 1), (1, 1), bias=True)
    config = ConvConfig.default(shape, 16)
    plan = conv_plan(shape, config, name="conv_test_prefetch", epilogue=Epilogue(Op.RELU, ()))
    (step,) = [p for p in plan.post if isinstance(p, PrefetchPanels)]
    assert step.buffer == "w" and "post.prefetch_panels(" in plan.as_python()
    func = plan.build()
    hints = [s for s in iter_stmts(func.body) if isinstance(s, Prefetch)]
    assert hints and all(h.buffer.name == "w" and len(h.indices) == 5 for h in hints)
    kernel = compile_kernel(func, kernel_options)
    _assert_relu_conv_matches_eager(kernel, shape, config, 9, residual=False)
    small = ConvShape(1, 16, 9, 9, 16, (3, 3), (1, 1), (1, 1))
    assert not any(isinstance(p, PrefetchPanels)
                   for p in conv_plan(small, ConvConfig.default(small, 16)).post)


def test_each_tile_prefetches_its_share_of_the_next_panel() -> None:
    """With one tile width a row, tile t of a panel (rows of tiles by tiles of a row)
    prefetches input channels (t CI + ci) // T of every tap of the next panel: together the
    tiles prefetch each of its rows, and no tile more than its share (every tile prefetched
    the whole panel before: 14 times over for ResNet-50's 14x14x256 layer)."""
    from kiln.kernels.plan import PrefetchPanels
    from kiln.tir.interp import compile_expr
    from kiln.tir.nodes import For, Prefetch
    from kiln.tir.visit import vars_of

    shape = ConvShape(1, 100, 9, 11, 70, (3, 3), (1, 1), (1, 1), bias=True)
    config = dataclasses.replace(ConvConfig.default(shape, 16), tail_tile=0)
    rows, pixels = -(-9 // config.rows), -(-11 // config.tile)
    plan = conv_plan(shape, config, name="conv_test_spread")
    (step,) = [p for p in plan.post if isinstance(p, PrefetchPanels)]
    assert (step.tiles, step.inner_tiles) == (rows * pixels, pixels) > (1, 0)
    func = plan.build()
    extents = {s.var.name: s.extent for s in iter_stmts(func.body) if isinstance(s, For)}
    hint = next(s for s in iter_stmts(func.body) if isinstance(s, Prefetch))
    index = [compile_expr(i) for i in hint.indices]
    names = sorted({v.name for i in hint.indices for v in vars_of(i)})
    tile_names, panel = (step.outer_loop, step.tile_loop), next(n for n in names if "co_0" in n)
    taps = [n for n in names if n not in (*tile_names, panel, step.k_loop)]
    reduction = [*taps, step.k_loop]  # (tap rows, tap columns, input channels)
    assert len(taps) == 2
    every = {(i, j, c) for i in range(3) for j in range(3) for c in range(100)}
    covered: set[tuple[int, ...]] = set()
    for row in range(rows):
        for tile in range(pixels):
            mine = set()
            for i in range(extents[reduction[0]]):
                for j in range(extents[reduction[1]]):
                    for c in range(extents[reduction[2]]):
                        env = dict(zip((panel, *tile_names, *reduction), (0, row, tile, i, j, c)))
                        got = tuple(int(f(env, {})) for f in index)
                        assert got[0] == 1  # (the next panel)
                        mine.add(got[1:4])
            assert len(mine) <= 9 * -(-100 // (rows * pixels))
            covered |= mine
    assert covered == every


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISA flags")
def test_conv_portable_path(kernel_options: Options) -> None:
    """Compiled for plain SSE2 (a machine without AVX-512), 4 channels a vector: the same."""
    options = dataclasses.replace(kernel_options, c_flags=("-O3", "-march=x86-64", "-fopenmp"))
    assert target_isa(options) is Isa.VEC128
    case = CASES[2]
    shape, config, plan = _case(case, lanes=Isa.VEC128.f32_lanes)
    kernel = compile_kernel(plan.build(), options)
    x, weight, bias = _operands(shape, seed=5)
    got = _run(kernel, shape, config, x, weight, bias)
    torch.testing.assert_close(got, _eager(shape, x, weight, bias, case[10], case[11]),
                               rtol=1e-4, atol=1e-4)


GRAPH = """\
graph(%x: f32[1, {ci}, 12, 11]) {{
  %w = constant {{name='w'}} : f32[16, {ci}, {k}, {k}]
  %b = constant {{name='b'}} : f32[16]
  %xl = to_layout(%x) {{channels_last=True}} : f32[1, {ci}, 12, 11]
  %x_in = {source} : f32[1, {ci}, 12, 11]
  %y = conv_act(%x_in, %w, %b{residual}) {{stride=(2, 2), padding=(1, 1), dilation=(1, 1), \
groups=1, has_bias=True, has_residual={has_residual}, activation=op('clamp'), \
act_args=(0.0, 6.0)}} : f32[1, 16, {oh}, 6]
  %z = clone(%y) : f32[1, 16, {oh}, 6]
  return %z
}}"""


def _graph(ci: int = 3, k: int = 3, source: str = "relu(%xl)", residual: bool = False,
           weight: torch.Tensor | None = None):  # noqa: ANN202
    torch.manual_seed(0)
    w = weight if weight is not None else torch.randn(16, ci, k, k)
    oh = (12 + 2 - k) // 2 + 1
    text = GRAPH.format(ci=ci, k=k, oh=oh, source=source, residual=", %r" if residual else "",
                        has_residual=residual)
    if residual:  # a second graph input
        text = text.replace(") {\n", f", %r: f32[1, 16, {oh}, 6]) {{\n", 1)
    graph = parse_graph(text, {"w": w, "b": torch.randn(16)})
    verify(graph)
    return graph


def test_conv_candidate_in_the_contraction_stage(kernel_options: Options) -> None:
    """Offered beside oneDNN, checked against ATen on channels-last operands, and run by the
    executor on an NHWC input, giving NHWC."""
    graph = _graph()
    assert [g.last.name for g in conv_groups(graph)] == ["y"]
    built = build_contraction_kernels(graph, contraction_groups(graph), kernel_options,
                                      Decisions(None, False))
    (kernel,) = built.kernels
    assert kernel.generated and kernel.plan.recipe is Recipe.CONV  # type: ignore[union-attr]
    assert kernel.weight(graph, kernel.inputs[1]).shape == (1, 3, 3, 3, 16)  # one panel
    moved = gather(graph, [kernel.group])
    run, _ = build_executor(moved, plan_memory(moved), [0], built.kernels)
    x = torch.randn(1, 3, 12, 11)
    w = next(graph.constant(n) for n in graph.nodes if n.name == "w")
    b = next(graph.constant(n) for n in graph.nodes if n.name == "b")
    want = torch.nn.functional.conv2d(x.relu(), w, b, 2, 1).clamp(0.0, 6.0)
    (got,) = run([x])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("why", ["nchw", "residual", "inf_weight", "long_reduction"])
def test_conv_refuses(why: str) -> None:
    """Cases the kernel does not take stay with the library: an input that is NCHW at run
    time, a residual input that is (a graph input), a non-finite weight, a reduction longer
    than MAX_REDUCTION."""
    if why == "nchw":
        graph = _graph(source="relu(%x)")
    elif why == "residual":
        graph = _graph(residual=True)
    elif why == "inf_weight":
        w = torch.randn(16, 3, 3, 3)
        w[3, 0, 1, 1] = float("inf")
        graph = _graph(weight=w)
    else:
        graph = _graph(ci=MAX_REDUCTION // 9 + 1)
    node = next(n for n in graph.nodes if n.name == "y")
    assert refusal(graph, node) is not None
    assert conv_groups(graph) == []


def test_first_layer_through_kiln_compile(kernel_options: Options,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A MobileNet-like first layer (3x3, stride 2, 3 channels, BN, ReLU6) and a depthwise
    layer, compiled at O2 with channels-last forced: the first runs generated, and matches
    eager."""
    monkeypatch.setattr("kiln.passes.layout._measured_faster", lambda *a, **k: True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16),
                          nn.ReLU6(), nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.ReLU6()).eval()
    bn = model[1]
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    x = torch.randn(1, 3, 21, 18)
    compiled = kiln.compile(model, (x,), kernel_options)
    assert any(k.kind == "generated" and "kiln_conv" in (k.source or "")
               for k in compiled.report.kernels)
    with torch.no_grad():
        want = model(x)
        got = compiled(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


class _SamePaddedStem(nn.Module):
    """HF's TensorFlow-style first layer: a zero pad of one row and column at the end of an
    NCHW image, then a 3x3 stride-2 convolution without padding, BN and ReLU6."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, 2, 0, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.act = nn.ReLU6()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(torch.nn.functional.pad(x, (0, 1, 0, 1)))))


def test_a_zero_pad_joins_the_first_layer_through_kiln_compile(
        kernel_options: Options, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pad, the channels-last copy and the convolution run as one generated kernel that
    reads the NCHW image in place, the pad's row and column its padding after; it matches
    eager, with an inf at the last column. The kernel runs on the image as it comes (its
    layout check once expected the padded image's strides, failed on every call and the
    library ops ran: HF MobileNetV2's stem, 514 us against 157)."""
    monkeypatch.setattr("kiln.passes.layout._measured_faster", lambda *a, **k: True)
    torch.manual_seed(0)
    model = _SamePaddedStem().eval()
    model.bn.running_mean.uniform_(-1, 1)
    model.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(1, 3, 22, 19)
    x[0, 1, 5, 18] = float("inf")
    compiled = kiln.compile(model, (x,), kernel_options)
    ops = [k.ops for k in compiled.report.kernels if k.kind == "generated"
           and "kiln_conv" in (k.source or "")]
    assert ops == [("pad", "to_layout", "conv_act")]
    with torch.no_grad():
        want, got = model(x), compiled(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
    assert compiled.report.graphs[0].details.fallbacks == {}


@pytest.mark.parametrize("pad_copy", [False, True])
def test_conv_with_padding_after_matches_a_pad_then_the_convolution(kernel_options: Options,
                                                                    pad_copy: bool) -> None:
    """`ConvShape.padding_after` (1 before and 2 after the rows, none before and 1 after the
    columns), with guards or the padded copy, over the 6- and 5-pixel tiles, against eager's
    pad then convolution."""
    shape = ConvShape(1, 8, 17, 23, 24, (3, 3), (2, 2), (1, 0), bias=True,
                      padding_after=(2, 1))
    config = dataclasses.replace(ConvConfig.default(shape, 8, 16), pad_copy=pad_copy)
    assert shape.out == (9, 11) and (config.tile, config.tail_tile) == (6, 5)
    plan = conv_plan(shape, config, name=f"conv_test_after_{int(pad_copy)}",
                     epilogue=Epilogue(Op.RELU, ()))
    kernel = compile_kernel(plan.build(), kernel_options)
    x, weight, bias = _operands(shape, seed=3)
    x[0, 2, 16, 22] = float("nan")
    got = _run(kernel, shape, config, x, weight, bias)
    padded = torch.nn.functional.pad(x, (0, 1, 1, 2))
    want = torch.nn.functional.conv2d(padded, weight, bias, shape.stride).relu()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)


IMAGE = """\
graph(%x: f32[1, {ci}, 12, 11]) {{
  %w = constant {{name='w'}} : f32[16, {ci}, 3, 3]
  %b = constant {{name='b'}} : f32[16]
  %xl = to_layout(%x) {{channels_last=True}} : f32[1, {ci}, 12, 11]
  %y = conv_act(%xl, %w, %b) {{stride=(2, 2), padding=(1, 1), dilation=(1, 1), groups=1, \
has_bias=True, has_residual=False, activation=op('clamp'), act_args=(0.0, 6.0)}} : f32[1, 16, 6, 6]
  %z = clone(%y) : f32[1, 16, 6, 6]
  return %z
}}"""


@pytest.mark.parametrize("ci", [3, NCHW_MAX_CI + 1])
def test_an_image_input_is_read_in_place(kernel_options: Options, ci: int) -> None:
    """A few-channel convolution of the copy that makes an NCHW input channels-last reads the
    input itself (the copy does not run); more channels keep the copy."""
    torch.manual_seed(0)
    w, b = torch.randn(16, ci, 3, 3), torch.randn(16)
    graph = parse_graph(IMAGE.format(ci=ci), {"w": w, "b": b})
    verify(graph)
    (group,) = conv_groups(graph)
    in_place = ci <= NCHW_MAX_CI
    assert [n.name for n in group.nodes] == (["xl", "y"] if in_place else ["y"])
    built = build_contraction_kernels(graph, contraction_groups(graph), kernel_options,
                                      Decisions(None, False))
    (kernel,) = built.kernels
    assert kernel.generated and (kernel.inputs[0].node is graph.inputs[0]) == in_place
    moved = gather(graph, [kernel.group])
    run, _ = build_executor(moved, plan_memory(moved), [0], built.kernels)
    x = torch.randn(1, ci, 12, 11)
    want = torch.nn.functional.conv2d(x, w, b, 2, 1).clamp(0.0, 6.0)
    (got,) = run([x])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_copy_read_elsewhere_still_runs() -> None:
    """The copy stays where another node reads it too (here the graph returns it)."""
    text = IMAGE.format(ci=3).replace("  return %z", "  return %z, %xl")
    graph = parse_graph(text, {"w": torch.randn(16, 3, 3, 3), "b": torch.randn(16)})
    (group,) = conv_groups(graph)
    assert [n.name for n in group.nodes] == ["y"]


@pytest.mark.parametrize("where", ["plan_conv", "fastest"])
def test_a_bug_in_one_group_costs_its_speed_only(kernel_options: Options, where: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception planning or measuring one convolution leaves that convolution its library
    call, with a warning; the rest of the graph is still compiled (not all of it run eagerly).
    Under strict, it raises."""
    from kiln.kernels import contractions

    real = getattr(contractions, where)

    def buggy(graph, first, *rest):  # noqa: ANN001, ANN202
        group = first if where == "plan_conv" else first[0].group  # (fastest: candidates)
        if group.last.op is Op.CONV_ACT and group.last.inputs[0].type.shape[1] == 16:
            raise IndexError("a bug")
        return real(graph, first, *rest)

    monkeypatch.setattr(contractions, where, buggy)
    monkeypatch.setattr("kiln.passes.layout._measured_faster", lambda *a, **k: True)
    # generated kernels time faster than the library, oneDNN's variant slower, whatever this
    # machine's phase (the first layer's own measurement decided this test once)
    monkeypatch.setattr("kiln.kernels.decide.measure", lambda graph, candidates, cold=False: (
        [Measured(1e-3, 2e-3) if c.recipe is Recipe.LIBRARY else Measured(2e-3, 1e-3)
         for c in candidates], False))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 16, 3, 1, 1),
                          nn.ReLU()).eval()
    x = torch.randn(1, 3, 21, 18)
    options = dataclasses.replace(kernel_options, measure_kernels=True)
    with pytest.warns(RuntimeWarning, match="a bug"):
        compiled = kiln.compile(model, (x,), options)
    assert not compiled.report.fallbacks
    (second,) = [k for k in compiled.report.kernels if str(k).endswith("convolution_1 (conv_act)")]
    assert second.kind == "library"  # (oneDNN's variant may still run it)
    assert any(k.kind == "generated" for k in compiled.report.kernels)  # the first layer
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(IndexError, match="a bug"):
        kiln.compile(model, (x,), dataclasses.replace(options, strict=True))


@pytest.mark.parametrize("bias", [True, False])
def test_a_residual_starts_the_accumulator(kernel_options: Options, bias: bool) -> None:
    """A channels-last residual of the output's shape is added before the activation, as
    ATen's convolution then add; NaN and inf in it stay where they are."""
    shape = ConvShape(1, 5, 9, 10, 20, (3, 3), (1, 1), (1, 1), (1, 1), bias, residual=True)
    config = ConvConfig.default(shape, 16)
    name = f"conv_test_residual_{int(bias)}"
    plan = conv_plan(shape, config, name=name, epilogue=Epilogue(Op.RELU, ()))
    kernel = compile_kernel(plan.build(), kernel_options)
    x, weight, b = _operands(shape, seed=5)
    residual = torch.randn(1, 20, *shape.out).contiguous(memory_format=CL)
    residual[0, 3, 2, 2], residual[0, 7, 0, 9] = float("nan"), float("-inf")
    out = torch.full((1, 20, *shape.out), float("nan")).contiguous(memory_format=CL)
    kernel(x, pack_conv_weight(weight, config.nr), *([b] if bias else []), residual, out)
    want = (torch.nn.functional.conv2d(x, weight, b if bias else None, 1, 1)
            + residual).relu()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4, equal_nan=True)
    assert plan.replayed() == plan.build()


class _BasicBlock(nn.Module):
    """ResNet's basic block: the shortcut is added after the second 3x3 convolution."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv2(torch.relu(self.conv1(x))) + x)


def test_a_basic_blocks_residual_convolution_runs_generated(
        kernel_options: Options, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stem and two basic blocks compiled (channels-last forced): every 3x3 convolution,
    those with the shortcut too, runs as a generated kernel; the result matches eager. (A
    shortcut straight from the NCHW graph input would keep the library's convolution.)"""
    monkeypatch.setattr("kiln.passes.layout._measured_faster", lambda *a, **k: True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), _BasicBlock(8), _BasicBlock(8)).eval()
    x = torch.randn(1, 3, 11, 9)
    compiled = kiln.compile(model, (x,), kernel_options)
    convs = [k for k in compiled.report.kernels
             if {"convolution", "conv_act"} & set(k.ops)]
    assert len(convs) == 5 and all(k.kind == "generated" for k in convs)
    assert sum("residual" in (k.source or "") for k in convs) == 2
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


BRANCHES = """\
graph(%x: f32[90, 8]) {{
  %w1 = constant {{name='w1'}} : f32[8, 24]
  %w = constant {{name='w'}} : f32[16, {ci}, 3, 3]
  %b = constant {{name='b'}} : f32[16]
  %m = mm(%x, %w1) : f32[90, 24]
  %g = view(%m) {{shape=(1, 9, 10, 24)}} : f32[1, 9, 10, 24]
  %p = permute(%g) {{dims=(0, 3, 1, 2)}} : f32[1, 24, 9, 10]
  %parts = split(%p) {{sizes=({ci}, {rest}), dim=1}} : (f32[1, {ci}, 9, 10], f32[1, {rest}, 9, 10])
  %al = to_layout(%parts#0) {{channels_last=True}} : f32[1, {ci}, 9, 10]
  %y = conv_act(%al, %w, %b) {{stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1, \
has_bias=True, has_residual=False, activation=op('relu'), act_args=()}} : f32[1, 16, 9, 10]
  %z = clone(%y) : f32[1, 16, 9, 10]
  %r = clone(%parts#1) : f32[1, {rest}, 9, 10]
  return %z, %r
}}"""


def test_a_channel_slice_of_channels_last_data_is_read_in_place(kernel_options: Options
                                                                ) -> None:
    """Inception's branches: a merged 1x1 convolution's output (channels-last pixels of a
    GEMM) split by channels; the convolution reads its slice in place, a longer step between
    pixels, where the copy to channels-last ran before it."""
    torch.manual_seed(0)
    w1, w, b = torch.randn(8, 24), torch.randn(16, 8, 3, 3), torch.randn(16)
    graph = parse_graph(BRANCHES.format(ci=8, rest=16), {"w1": w1, "w": w, "b": b})
    verify(graph)
    (group,) = conv_groups(graph)
    assert [n.name for n in group.nodes] == ["al", "y"]
    assert source_strides(graph, group.nodes[0].inputs[0]) == (9 * 10 * 24, 1, 10 * 24, 24)
    built = build_contraction_kernels(graph, contraction_groups(graph), kernel_options,
                                      Decisions(None, False))
    (kernel,) = [k for k in built.kernels if k.group is group or k.group.last is group.last]
    assert kernel.generated and kernel.inputs[0].node.op is Op.SPLIT
    moved = gather(graph, [kernel.group])
    run, _ = build_executor(moved, plan_memory(moved), [0], built.kernels)
    x = torch.randn(90, 8)
    x[3, 2] = float("nan")
    grid = (x @ w1).view(1, 9, 10, 24).permute(0, 3, 1, 2)
    want = torch.nn.functional.conv2d(grid[:, :8], w, b, 1, 1).relu()
    z, r = run([x])
    torch.testing.assert_close(z, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    torch.testing.assert_close(r, grid[:, 8:], equal_nan=True)


def test_a_slice_whose_channels_are_not_adjacent_keeps_its_copy() -> None:
    """A channel slice of NCHW data (each channel a plane) is copied channels-last first."""
    text = BRANCHES.format(ci=8, rest=16).replace(
        "%g = view(%m) {shape=(1, 9, 10, 24)} : f32[1, 9, 10, 24]",
        "%g = view(%m) {shape=(1, 24, 9, 10)} : f32[1, 24, 9, 10]").replace(
        "%p = permute(%g) {dims=(0, 3, 1, 2)} : f32[1, 24, 9, 10]",
        "%p = clone(%g) : f32[1, 24, 9, 10]")
    graph = parse_graph(text, {"w1": torch.randn(8, 24), "w": torch.randn(16, 8, 3, 3),
                               "b": torch.randn(16)})
    (group,) = conv_groups(graph)
    assert [n.name for n in group.nodes] == ["y"]


# grouped: (n, ci, h, w, co, groups, kernel, stride, padding, bias, lanes)
GROUPED = [
    (1, 64, 9, 11, 64, 4, 3, 1, 1, True, 8),  # 16 output channels a group: two vectors of 8
    (1, 96, 7, 10, 48, 6, 3, 2, 1, False, 8),  # 8 a group, strided, an odd row
    (1, 256, 5, 5, 256, 16, 3, 1, 1, True, 16),  # ResNeXt-like: 16 of 16 channels
    (1, 64, 9, 10, 64, 16, 3, 1, 1, True, 4),  # ResNeXt's first stage: 4 a group, 128 bits
    (1, 64, 9, 9, 128, 16, 3, 2, 1, True, 8),  # 8 a group, 256 bits (on any ISA)
    # 4 a group, four groups a 16-lane vector (each lane its group's channels, by shuffles)
    (1, 64, 9, 10, 64, 16, 3, 1, 1, True, 16),
    (1, 128, 9, 9, 128, 32, 3, 2, 1, False, 8),  # two a vector of 8, strided, no bias
]


def _grouped(case: tuple) -> tuple[ConvShape, ConvConfig]:
    n, ci, h, w, co, groups, k, s, p, bias, lanes = case
    shape = ConvShape(n, ci, h, w, co, (k, k), (s, s), (p, p), bias=bias, groups=groups)
    return shape, ConvConfig.default(shape, lanes)


@pytest.mark.parametrize("case", GROUPED, ids=lambda c: f"{c[1]}to{c[4]}g{c[5]}s{c[7]}l{c[10]}")
def test_a_grouped_convolution_reads_each_groups_channels_alone(kernel_options: Options,
                                                               case: tuple) -> None:
    """Against ATen's grouped convolution; an infinite input channel reaches its own group's
    outputs only (a panel within one group, or over narrow groups each lane its own group's
    channels: no zero weights meet it)."""
    _check_grouped(case, kernel_options)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISA flags")
def test_narrow_groups_on_avx2(kernel_options: Options) -> None:
    """Compiled for AVX2 (a machine without AVX-512): two groups of 4 a vector of 8."""
    options = dataclasses.replace(kernel_options,
                                  c_flags=("-O3", "-march=x86-64-v3", "-fopenmp"))
    assert target_isa(options) is Isa.AVX2
    _check_grouped((1, 64, 9, 10, 64, 16, 3, 1, 1, True, 8), options)


def _check_grouped(case: tuple, options: Options) -> None:
    shape, config = _grouped(case)
    assert panel_within_group(shape, config.nr)
    plan = conv_plan(shape, config, name=f"conv_test_grouped_{'_'.join(map(str, case))}",
                     epilogue=Epilogue(Op.RELU, ()))
    kernel = compile_kernel(plan.build(), options)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(shape.n, shape.ci, shape.h, shape.w, generator=gen).contiguous(
        memory_format=CL)
    x[0, 0, shape.h // 2, shape.w // 2] = float("inf")  # group 0's first channel
    weight = torch.randn(shape.co, shape.ci // shape.groups, *shape.kernel, generator=gen)
    bias = torch.randn(shape.co, generator=gen)
    out = torch.full((shape.n, shape.co, *shape.out), float("nan")).contiguous(
        memory_format=CL)
    kernel(x, pack_conv_weight(weight, config.nr), *([bias] if shape.bias else []), out)
    want = torch.nn.functional.conv2d(x, weight, bias if shape.bias else None, shape.stride,
                                      shape.padding, groups=shape.groups).relu()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4, equal_nan=True)
    per_group = shape.co // shape.groups
    assert torch.isfinite(out[:, per_group:]).all()  # the other groups never read it
    assert plan.replayed() == plan.build()


def test_a_panel_spans_narrow_groups_only_whole_and_as_many_in_as_out() -> None:
    narrow = ConvShape(1, 128, 8, 8, 128, (3, 3), (1, 1), (1, 1), groups=32)  # 4 a group
    assert broadcast_group(narrow) == 4
    assert panel_within_group(narrow, 8) and panel_within_group(narrow, 16)
    assert ConvConfig.default(narrow, 16).nr == 16  # four groups a vector
    wider_out = dataclasses.replace(narrow, co=256)  # 4 channels in, 8 out a group
    assert broadcast_group(wider_out) == 0 and not panel_within_group(wider_out, 16)
    with pytest.raises(ValueError, match="span two groups"):
        conv_plan(wider_out, ConvConfig(7, 16, lanes=16))
    partial = ConvShape(1, 24, 8, 8, 24, (3, 3), (1, 1), (1, 1), groups=6)  # 24 = 16 + 8
    assert not panel_within_group(partial, 16)  # (its last panel's lanes would read past CI)
    wide = dataclasses.replace(narrow, groups=8)  # 16 a group
    assert broadcast_group(wide) == 0
    assert panel_within_group(wide, 8) and panel_within_group(wide, 16)
    assert ConvConfig.default(wide, 8).nr == 8  # one vector: a row of one tile (8 pixels)
    assert wide.macs == 8 * 8 * 128 * 16 * 9  # each output reads its group's 16 channels


def test_narrow_groups_tensorize_as_one_shuffled_input_vector_a_step() -> None:
    """A 16-lane tile over four groups of 4: each tap loads the input pixel's vector once
    (the channel loop at 0) and shuffles it once per input channel, lane l taking element
    (l // 4) * 4 + c; the channel loop is unrolled into the tile."""
    shape = ConvShape(1, 64, 8, 8, 64, (3, 3), (1, 1), (1, 1), bias=True, groups=16)
    config = ConvConfig.default(shape, 16)
    func = conv_plan(shape, config, name="conv_test_broadcast_group").build()
    tiles = [s for s in iter_stmts(func.body) if isinstance(s, Tensorized)]
    assert tiles
    for stmt in tiles:
        tile = fma_tile(stmt.loop, stmt.lanes)
        assert tile is not None and tile.a_group == 4 and not tile.a_is_vector
        assert group_masks(tile, 16)[1] == (1, 1, 1, 1, 5, 5, 5, 5, 9, 9, 9, 9, 13, 13, 13, 13)
    source = CRenderer().render(func)
    assert "fma0_a[13], fma0_a[13], fma0_a[13], fma0_a[13]}" in source
    assert "for (int64_t conv_ci" not in source  # (unrolled into the tile)


def test_grouped_defaults_follow_the_row_width() -> None:
    """ResNeXt-50's layers on AVX2 (16 registers): two vectors with guards and no padded copy
    where a group's channels fill them and a row is wider than a tile; else one vector over
    the copy."""
    def grouped(size: int, channels: int, stride: int) -> ConvConfig:
        shape = ConvShape(1, channels, size, size, channels, (3, 3), (stride, stride), (1, 1),
                          bias=True, groups=32)
        return ConvConfig.default(shape, 8, registers=16)

    stage3 = grouped(14, 512, 1)  # 16 channels a group
    assert (stage3.nr, stage3.tile, stage3.pad_copy) == (16, 5, False)  # 14 = 5 + 5 + 4
    into_stage3 = grouped(28, 512, 2)
    assert (into_stage3.nr, into_stage3.tile, into_stage3.pad_copy) == (16, 5, False)
    stage2 = grouped(28, 256, 1)  # 8 channels a group: one vector
    assert (stage2.nr, stage2.tile, stage2.pad_copy) == (8, 7, True)
    stage4 = grouped(7, 1024, 1)  # one tile a row
    assert (stage4.nr, stage4.tile, stage4.pad_copy) == (8, 7, True)


def test_narrow_groups_narrow_the_vectors_to_fit() -> None:
    """On AVX-512, ResNeXt-50's 3x3 layers (4, 8, 16 and 32 channels a group) run on vectors
    of 16, 8, 16 and 16 lanes: 8 channels a group narrow the vectors, each panel within a
    group; 4 keep the whole vector, four groups to it (`broadcast_group`); dense layers
    keep 16."""
    for channels, lanes in ((128, 16), (256, 8), (512, 16), (1024, 16)):
        shape = ConvShape(1, channels, 14, 14, channels, (3, 3), (1, 1), (1, 1), groups=32)
        assert group_lanes(shape, 16) == lanes and group_lanes(shape, 8) == min(lanes, 8)
        space = WindowSpace("conv", shape, Isa.AVX512, 2)
        assert space.lanes == lanes and panel_within_group(shape, space.config(
            space.default()).nr)
    dense = ConvShape(1, 24, 14, 14, 40, (3, 3), (1, 1), (1, 1))
    assert group_lanes(dense, 16) == 16
    assert WindowSpace("conv", ConvShape(1, 6, 8, 8, 6, (3, 3), (1, 1), (1, 1), groups=3),
                       Isa.AVX512, 2).lanes == 4  # (2 a group: refused, see below)


def test_grouped_convolutions_the_kernel_refuses_keep_the_library() -> None:
    """Groups of fewer output channels than a vector (2 here, fewer than any ISA's 4 lanes),
    and depthwise convolutions (their own kernel), get no dense-kernel group."""
    for groups, cin, cout, why in ((32, 4, 64, "not whole vectors"), (16, 1, 16, "depthwise")):
        graph = parse_graph(f"""graph(%x: f32[1, {groups * cin}, 8, 8]) {{
  %w = constant {{name='w'}} : f32[{cout}, {cin}, 3, 3]
  %xc = to_layout(%x) {{channels_last=True}} : f32[1, {groups * cin}, 8, 8]
  %y = convolution(%xc, %w) {{stride=(1, 1), padding=(1, 1), dilation=(1, 1), \
transposed=False, output_padding=(0, 0), groups={groups}}} : f32[1, {cout}, 8, 8]
  return %y
}}""", {"w": torch.randn(cout, cin, 3, 3)})
        node = next(n for n in graph.nodes if n.name == "y")
        assert why in refusal(graph, node)
        assert conv_groups(graph) == []


@pytest.mark.parametrize("narrow", [False, True], ids=["whole-vectors", "4-a-group"])
def test_a_grouped_convolution_is_a_candidate_in_the_contraction_stage(
        kernel_options: Options, narrow: bool) -> None:
    """ResNeXt's second stage in small: 4 groups of 8 channels (whole vectors on AVX2 and
    narrower ISAs), offered and run by the executor like a dense layer; its first stage in
    small (``narrow``): groups of 4 channels, several a vector."""
    lanes = max(target_isa(kernel_options).f32_lanes, 4)
    groups, width = (2 * lanes, 4) if narrow else (4, max(lanes, 8))
    c = groups * width
    graph = parse_graph(f"""graph(%x: f32[1, {c}, 10, 9]) {{
  %w = constant {{name='w'}} : f32[{c}, {width}, 3, 3]
  %b = constant {{name='b'}} : f32[{c}]
  %xc = to_layout(%x) {{channels_last=True}} : f32[1, {c}, 10, 9]
  %y = conv_act(%xc, %w, %b) {{stride=(1, 1), padding=(1, 1), dilation=(1, 1), \
groups={groups}, has_bias=True, has_residual=False, activation=op('relu'), act_args=()}} \
: f32[1, {c}, 10, 9]
  %z = clone(%y) : f32[1, {c}, 10, 9]
  return %z
}}""", {"w": torch.randn(c, width, 3, 3), "b": torch.randn(c)})
    assert [g.last.name for g in conv_groups(graph)] == ["y"]
    built = build_contraction_kernels(graph, contraction_groups(graph), kernel_options,
                                      Decisions(None, False))
    (kernel,) = [k for k in built.kernels if k.generated]
    assert kernel.plan.recipe is Recipe.CONV  # type: ignore[union-attr]
    moved = gather(graph, [kernel.group])
    run, _ = build_executor(moved, plan_memory(moved), [0], built.kernels)
    x = torch.randn(1, c, 10, 9)
    w = next(graph.constant(n) for n in graph.nodes if n.name == "w")
    b = next(graph.constant(n) for n in graph.nodes if n.name == "b")
    (got,) = run([x])
    want = torch.nn.functional.conv2d(x, w, b, 1, 1, groups=groups).relu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
