"""fp32 depthwise convolution in channels-last memory: the loop program, scheduled by
primitives into a register tile of ``T`` output pixels by one vector of channels, recorded as
a replayable Trace.

A depthwise convolution (groups = in channels = out channels) is, per channel, a small 2-d
stencil; in NHWC memory the channels are contiguous, so a vector of channels of one input
pixel meets the same vector of the weights (packed once, at compile time, into
``w[kh, kw, C]``, `pack_depthwise_weight`)::

    out[n, oh, ow, c:c+L] = bias[c:c+L] + sum_{i, j} x[n, oh*s + i*d - p, ow*s + j*d - p, c:c+L]
                                                   * w[i, j, c:c+L]

`depthwise_func` gives the program as a lowering would: the tensors are logically NCHW (as
the graph has them) with channels-last strides, and the sum runs in a LOCAL accumulator
``acc[n, oh, ow, c]`` (channels last), set to the bias by one block and stored by another.
The padding is a bounds guard on the update block (a padded term is skipped, as ATen's
channels-last convolution skips it; the kernel takes only finite weights, so a skipped
``0 * w`` is the 0 it would have added). `schedule_depthwise` then makes::

    for n: parallel oh:                            # rows of the output
      for ow_0 in range(OW / T):                   # T output pixels ...
        for c_0 in range(C / L):                   # ... by L channels: the register tile
          unrolled ow_1 / vectorized c_1:  acc[ow_1, c_1] = bias[c]
          for i, j in KH x KW:
            unrolled ow_1 / vectorized c_1:
              acc[ow_1, c_1] += x[n, c, oh*s + i*d - p, ow*s + j*d - p] * w[i, j, c]
                                                     (where the input position is inside)
          unrolled ow_1 / vectorized c_1:  out[n, c, oh, ow] = act(acc[ow_1, c_1])

Then the post-passes: compaction (the accumulator shrinks to one T x L tile), indices in
loop variables, and `kiln.tir.tails.version_tails` on the row, pixel-tile and channel-block
loops: interior rows and tiles, full channel blocks, run without a single guard; the border
rows and tiles and the channel tail keep theirs. The activation (relu, clamp / relu6, ...)
runs in the write-back (`kiln.kernels.plan.Epilogue`), so conv + bias + relu6 is one pass
over the output.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kiln.ir.types import DType
from kiln.kernels.plan import (
    GRAIN,
    Compact,
    Epilogue,
    KernelPlan,
    PostPass,
    Recipe,
    Serial,
    SimplifyIndices,
    Tensorize,
    VersionTails,
)
from kiln.tir.nodes import (
    Allocate,
    Block,
    BufferStore,
    CmpOp,
    Compare,
    Expr,
    For,
    IterKind,
    IterVar,
    PrimFunc,
    Scope,
    Stmt,
    Var,
    channels_last_strides,
    const,
    seq,
)
from kiln.tir.nodes import Buffer as TBuffer
from kiln.tir.schedule import Schedule
from kiln.tir.visit import conjoin

__all__ = ["DepthwiseConfig", "DepthwiseShape", "depthwise_func", "depthwise_plan",
           "loop_nest", "output_size", "pack_depthwise_weight", "padding_after",
           "schedule_depthwise", "tap_inside", "tap_position"]

F32 = DType.F32


@dataclass(frozen=True)
class DepthwiseShape:
    """A depthwise convolution's sizes: input [N, C, H, W], kernel KH x KW, stride, padding,
    dilation (per spatial dim), and whether it adds a bias. ``padding`` comes before each
    spatial dim; ``padding_after`` after it, where it differs (a zero ``pad`` node folded in:
    TensorFlow's "same" padding of a strided convolution, one row and column at the end)."""

    n: int
    c: int
    h: int
    w: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int] = (1, 1)
    bias: bool = False
    padding_after: tuple[int, int] | None = None  # None: ``padding`` again

    @property
    def out(self) -> tuple[int, int]:
        """OH, OW, as ATen's convolution computes them."""
        return output_size(self)

    @property
    def macs(self) -> int:
        oh, ow = self.out
        return self.n * self.c * oh * ow * self.kernel[0] * self.kernel[1]


@dataclass(frozen=True)
class DepthwiseConfig:
    """The register tile: ``tile`` output pixels of a row by ``lanes`` channels."""

    tile: int = 7
    lanes: int = 16

    @staticmethod
    def default(shape: DepthwiseShape, lanes: int) -> DepthwiseConfig:
        """``lanes``: the vector width in fp32 (at least 4: a scalar build still runs 4-wide
        loops, which its compiler may vectorize). The tile: 7 or 8 pixels, or 6..4, the
        first that divides the row (no tail tile), else 7 (the tail tile keeps its guards);
        a row narrower than 8 is one tile. Measured on Zen 4 (2 threads, MobileNetV2's
        rows of 112..14): 7 and 8 about equal, up to 25% ahead of 4, and 14 no better."""
        ow = shape.out[1]
        lanes = max(lanes, 4)
        if 0 < ow <= 8:
            return DepthwiseConfig(ow, lanes)
        tile = next((t for t in (7, 8, 6, 5, 4) if ow % t == 0), 7)
        return DepthwiseConfig(tile, lanes)


def pack_depthwise_weight(weight: torch.Tensor) -> torch.Tensor:
    """A depthwise weight [C, 1, KH, KW] (any strides) as the kernel reads it: [KH, KW, C],
    contiguous, so one vector of channels of a tap is one load."""
    c, _, kh, kw = weight.shape
    return weight.detach().reshape(c, kh * kw).t().contiguous().reshape(kh, kw, c)


def _lt(a: Expr, b: Expr) -> Expr:
    return Compare(CmpOp.LT, a, b)


def output_size(shape: Any) -> tuple[int, int]:
    """OH, OW of a convolution shape (h, w, kernel, stride, padding, dilation, and
    ``padding_after`` where it has one), as ATen's convolution computes them."""
    return tuple(  # type: ignore[return-value]
        (size + p + q - d * (k - 1) - 1) // s + 1
        for size, k, s, p, q, d in zip((shape.h, shape.w), shape.kernel, shape.stride,
                                       shape.padding, padding_after(shape), shape.dilation))


def padding_after(shape: Any) -> tuple[int, int]:
    """The padding after each spatial dim: ``padding_after`` where the shape has one."""
    return getattr(shape, "padding_after", None) or shape.padding


def loop_nest(block: str, spatial: Sequence[tuple[str, int]], body: Callable[..., Stmt],
              reduce: Sequence[tuple[str, int]] = (),
              guard: Callable[..., Expr | None] | None = None) -> Stmt:
    """One block in its own loop nest, as a lowering writes it: a loop and an iter var per
    dim (``spatial``, then the ``reduce`` dims), ``body`` of the iter vars, and ``guard`` (a
    predicate) of the loop vars, as `split` writes its own, so `version_tails` sees how it
    changes with each loop."""
    dims = (*spatial, *reduce)
    loops = [Var(f"{block}_{d}") for d, _ in dims]
    ivs = tuple(IterVar(Var(f"v{block}_{d}"), e,
                        IterKind.REDUCE if (d, e) in reduce else IterKind.SPATIAL)
                for d, e in dims)
    predicate = None if guard is None else guard(*loops)
    stmt: Stmt = Block(block, ivs, tuple(loops), body(*(iv.var for iv in ivs)),
                       predicate=predicate)
    for loop, (_, extent) in reversed(list(zip(loops, dims))):
        stmt = For(loop, extent, stmt)
    return stmt


def tap_position(shape: DepthwiseShape | Any, o: Expr, k: Expr, d: int) -> Expr:
    """The input position (row ``d`` = 0, column 1) that output position ``o`` reads at
    tap ``k``: ``o * stride + k * dilation - padding``."""
    s, dil, p = shape.stride[d], shape.dilation[d], shape.padding[d]
    pos = (o if s == 1 else o * s) + (k if dil == 1 else k * dil)
    return pos - p if p else pos


def tap_inside(shape: Any, oh: Expr, ow: Expr, i: Expr, j: Expr) -> Expr | None:
    """The guard of a window kernel's update: tap (i, j) of output pixel (oh, ow) reads
    inside the input, not the padding (None without padding: every tap is inside): a test
    against the start where there is padding before, against the end where there is some
    after."""
    conds = []
    after = padding_after(shape)
    for d, (o, k, size) in enumerate(((oh, i, shape.h), (ow, j, shape.w))):
        pos = tap_position(shape, o, k, d)
        if shape.padding[d] > 0:
            conds.append(_lt(const(-1, pos.dtype), pos))
        if after[d] > 0:
            conds.append(_lt(pos, const(size, pos.dtype)))
    return conjoin(*conds)


def depthwise_func(shape: DepthwiseShape, name: str = "depthwise") -> PrimFunc:
    """The unscheduled program (see the module docstring): blocks ``init`` (the accumulator
    set to the bias, or 0), ``conv`` (the guarded update over the KH x KW taps) and
    ``store`` (the accumulator written to ``out``), each in its own loop nest."""
    n, c, h, w = shape.n, shape.c, shape.h, shape.w
    kh, kw = shape.kernel
    oh, ow = shape.out
    x = TBuffer("x", (n, c, h, w), F32, channels_last_strides((n, c, h, w)))
    wt = TBuffer("w", (kh, kw, c), F32)
    bias = TBuffer("bias", (c,), F32) if shape.bias else None
    out = TBuffer("out", (n, c, oh, ow), F32, channels_last_strides((n, c, oh, ow)))
    acc = TBuffer("acc", (n, oh, ow, c), F32, scope=Scope.LOCAL)
    spatial = (("n", n), ("oh", oh), ("ow", ow), ("c", c))

    def nest(block: str, body, reduce: tuple[tuple[str, int], ...] = (),  # noqa: ANN001
             guard=None) -> Stmt:  # noqa: ANN001
        return loop_nest(block, spatial, body, reduce, guard)

    def init(vn: Var, voh: Var, vow: Var, vc: Var) -> Stmt:
        start = bias[vc] if bias is not None else const(0.0, F32)
        return BufferStore(acc, (vn, voh, vow, vc), start)

    def position(o: Var, k: Var, d: int) -> Expr:
        return tap_position(shape, o, k, d)

    def update(vn: Var, voh: Var, vow: Var, vc: Var, vi: Var, vj: Var) -> Stmt:
        tap = x[vn, vc, position(voh, vi, 0), position(vow, vj, 1)] * wt[vi, vj, vc]
        return BufferStore(acc, (vn, voh, vow, vc), acc[vn, voh, vow, vc] + tap)

    def inside(vn: Var, voh: Var, vow: Var, vc: Var, vi: Var, vj: Var) -> Expr | None:
        return tap_inside(shape, voh, vow, vi, vj)

    def store(vn: Var, voh: Var, vow: Var, vc: Var) -> Stmt:
        return BufferStore(out, (vn, vc, voh, vow), acc[vn, voh, vow, vc])

    body = seq(nest("init", init), nest("conv", update, (("i", kh), ("j", kw)), inside),
               nest("store", store))
    inputs = (x, wt) if bias is None else (x, wt, bias)
    return PrimFunc(name, inputs, (out,), Allocate(acc, body))


def schedule_depthwise(func: PrimFunc, config: DepthwiseConfig,
                       update: str = "conv") -> tuple[Schedule, list[str], tuple[str, ...]]:
    """The register-tiled schedule of `depthwise_func`'s program (or another with its
    ``init`` / ``update`` / ``store`` nests: `kiln.kernels.pool_schedule`'s); returns the
    schedule, the loops whose bodies `version_tails` versions (rows, pixel tiles, channel
    blocks) and the tap loops around the register tile, outermost first."""
    sch = Schedule(func)
    conv = sch.get_block(update)
    n, oh, ow, c, i, j = sch.get_loops(conv)
    ow_0, ow_1 = sch.split(ow, [None, config.tile])
    c_0, c_1 = sch.split(c, [None, config.lanes])
    sch.reorder(n, oh, ow_0, c_0, i, j, ow_1, c_1)
    init, store = sch.get_block("init"), sch.get_block("store")
    sch.reverse_compute_at(store, c_0)  # (first: then no reader of acc is left outside)
    sch.compute_at(init, c_0)
    sch.unroll(ow_1)
    sch.vectorize(c_1)
    for block in (init, store):
        pixels, lanes = sch.get_loops(block)[-2:]
        sch.unroll(pixels)
        sch.vectorize(lanes)
    sch.parallel(oh)  # (n stays serial: fused with oh, the row guards would not be affine)
    return sch, [oh.name, ow_0.name, c_0.name], (i.name, j.name)


@functools.lru_cache(maxsize=256)  # (a plan is immutable: repeated layers share one)
def depthwise_plan(shape: DepthwiseShape, config: DepthwiseConfig | None = None,
                   name: str = "depthwise", epilogue: Epilogue | None = None) -> KernelPlan:
    """The depthwise convolution as a plan: `depthwise_func`'s program, the Trace of
    `schedule_depthwise`, then compaction, indices in loop vars, the guards versioned away
    from interior rows, tiles and channel blocks, the activation in the write-back, and one
    thread below `GRAIN` output elements."""
    cfg = config or DepthwiseConfig.default(shape, 16)
    program = depthwise_func(shape, name)
    sch, tails, taps = schedule_depthwise(program, cfg)
    post: tuple[PostPass, ...] = (Compact(), SimplifyIndices(), VersionTails(tuple(tails)))
    if epilogue is not None:
        post += (epilogue,)
    # the tile's accumulators in registers over all the taps (gcc kept them in the stack
    # array from one tap row to the next: a store per 3 FMAs on AVX2); at stride 1 only:
    # Zen 3, AVX2, 2 threads, MobileNetV2's layers, loops against FMA_TILE: stride 1
    # 32x112x112 169 -> 150 us, 144x56x56 205 -> 170, 192x28x28 81 -> 69; stride 2
    # 96x112x112 142 -> 157, 144x56x56 68 -> 73
    if shape.stride == (1, 1):
        post += (Tensorize(taps, cfg.lanes),)
    oh, ow = shape.out
    if shape.n * shape.c * oh * ow < GRAIN:
        post += (Serial(f"{shape.n * shape.c * oh * ow} outputs < GRAIN {GRAIN}"),)
    return KernelPlan(Recipe.DEPTHWISE, program, sch.trace, post,
                      notes=f"# kiln.kernels.depthwise_plan({shape}, {cfg})", scheduled=sch.func)
