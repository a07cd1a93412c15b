"""fp32 max and average pooling in channels-last memory: the loop program of a window
reduction per channel, scheduled as the depthwise convolution is (`depthwise_schedule`): a
register tile of ``T`` output pixels by one vector of channels, recorded as a replayable Trace.

In NHWC memory a pooling window's taps are whole vectors of channels, so a pool is a
depthwise convolution without weights::

    max: out[n, oh, ow, c:c+L] = max_{i, j} x[n, oh*s + i*d - p, ow*s + j*d - p, c:c+L]
    avg: out[n, oh, ow, c:c+L] = (sum_{i, j} x[...]) / divisor(oh, ow)

The padded taps are skipped (a bounds guard on the update block), as ATen's channels-last
kernels skip them. ``max`` is NaN-propagating and keeps the earlier of equal taps
(``max(tap, acc)`` in `kiln_max_f32`: ATen's ``val > max || isnan(val)``, so -0.0 before
+0.0 stays -0.0). The average divides the sum, taken in tap order
from 0, by ATen's divisor: ``divisor_override``, else the window clipped to the padded input
(``count_include_pad``), else clipped to the input; a per-pixel expression that the versioned
interior tiles see as the constant KH * KW. A global average pool (``mean`` over H and W,
keepdim) is the pool whose window is the whole input.

`pool_func` gives the unscheduled program (``init`` / ``pool`` / ``store``, each in its own
loop nest), `pool_plan` the plan: `schedule_depthwise`'s schedule, compaction, indices in
loop variables, the guards versioned away from interior rows, tiles and channel blocks, and
one thread below `GRAIN` outputs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from kiln.ir.types import DType
from kiln.kernels.depthwise_schedule import (
    DepthwiseConfig,
    loop_nest,
    output_size,
    schedule_depthwise,
    tap_inside,
    tap_position,
)
from kiln.kernels.plan import (
    GRAIN,
    Compact,
    KernelPlan,
    PostPass,
    Recipe,
    Serial,
    SimplifyIndices,
    VersionTails,
)
from kiln.tir.lower_contract import avg_pool_divisor
from kiln.tir.nodes import (
    Allocate,
    Binary,
    BinOp,
    BufferStore,
    Expr,
    PrimFunc,
    Scope,
    Stmt,
    Var,
    channels_last_strides,
    seq,
)
from kiln.tir.nodes import Buffer as TBuffer
from kiln.tir.te import identity_of

__all__ = ["PoolShape", "pool_func", "pool_plan"]

F32 = DType.F32


@dataclass(frozen=True)
class PoolShape:
    """A pool's sizes: input [N, C, H, W], window KH x KW, stride, padding, dilation (max
    only), ``kind`` "max" or "avg", and the average's divisor rule (as ATen's avg_pool2d)."""

    n: int
    c: int
    h: int
    w: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int] = (1, 1)
    kind: str = "max"
    count_include_pad: bool = True
    divisor_override: int | None = None

    @property
    def out(self) -> tuple[int, int]:
        """OH, OW without ceil mode."""
        return output_size(self)


def pool_func(shape: PoolShape, name: str = "pool") -> PrimFunc:
    """The unscheduled program (see the module docstring): blocks ``init`` (the accumulator
    set to -inf or 0), ``pool`` (the guarded max or sum over the KH x KW taps) and ``store``
    (the accumulator, or the average, written to ``out``), each in its own loop nest."""
    n, c, h, w = shape.n, shape.c, shape.h, shape.w
    kh, kw = shape.kernel
    oh, ow = shape.out
    is_max = shape.kind == "max"
    x = TBuffer("x", (n, c, h, w), F32, channels_last_strides((n, c, h, w)))
    out = TBuffer("out", (n, c, oh, ow), F32, channels_last_strides((n, c, oh, ow)))
    acc = TBuffer("acc", (n, oh, ow, c), F32, scope=Scope.LOCAL)
    spatial = (("n", n), ("oh", oh), ("ow", ow), ("c", c))
    combine = BinOp.MAX if is_max else BinOp.ADD

    def init(vn: Var, voh: Var, vow: Var, vc: Var) -> Stmt:
        return BufferStore(acc, (vn, voh, vow, vc), identity_of(combine, F32))

    def update(vn: Var, voh: Var, vow: Var, vc: Var, vi: Var, vj: Var) -> Stmt:
        tap = x[vn, vc, tap_position(shape, voh, vi, 0), tap_position(shape, vow, vj, 1)]
        # max(tap, acc): on a tie the earlier tap stays, as in ATen (-0.0 before +0.0
        # gives -0.0); a NaN on either side wins
        pair = (tap, acc[vn, voh, vow, vc]) if is_max else (acc[vn, voh, vow, vc], tap)
        return BufferStore(acc, (vn, voh, vow, vc), Binary(combine, *pair))

    def inside(vn: Var, voh: Var, vow: Var, vc: Var, vi: Var, vj: Var) -> Expr | None:
        return tap_inside(shape, voh, vow, vi, vj)

    def store(vn: Var, voh: Var, vow: Var, vc: Var) -> Stmt:
        value = acc[vn, voh, vow, vc]
        if not is_max:
            value = Binary(BinOp.DIV, value, avg_pool_divisor(shape, (voh, vow),
                                                                (h, w), F32))
        return BufferStore(out, (vn, vc, voh, vow), value)

    body = seq(loop_nest("init", spatial, init),
               loop_nest("pool", spatial, update, (("i", kh), ("j", kw)), inside),
               loop_nest("store", spatial, store))
    return PrimFunc(name, (x,), (out,), Allocate(acc, body))


@functools.lru_cache(maxsize=256)  # (a plan is immutable: repeated layers share one)
def pool_plan(shape: PoolShape, config: DepthwiseConfig, name: str = "pool") -> KernelPlan:
    """The pool as a plan: `pool_func`'s program, the Trace of `schedule_depthwise`, then
    compaction, indices in loop vars, the guards versioned away from interior rows, tiles and
    channel blocks, and one thread below `GRAIN` output elements."""
    program = pool_func(shape, name)
    sch, tails, _ = schedule_depthwise(program, config, update="pool")
    post: tuple[PostPass, ...] = (Compact(), SimplifyIndices(), VersionTails(tuple(tails)))
    oh, ow = shape.out
    outputs = shape.n * shape.c * oh * ow
    if outputs < GRAIN:
        post += (Serial(f"{outputs} outputs < GRAIN {GRAIN}"),)
    return KernelPlan(Recipe.POOL, program, sch.trace, post,
                      notes=f"# kiln.kernels.pool_plan({shape}, {config})", scheduled=sch.func)
