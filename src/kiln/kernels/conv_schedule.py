"""fp32 dense direct convolution in channels-last memory: the loop program, scheduled by
primitives into a register tile of ``T`` output pixels by ``NR`` output channels (two vectors
on AVX-512), recorded as a replayable Trace.

In NHWC memory an output pixel's channels are contiguous, and so are an input pixel's. With
the weight packed once, at compile time, into panels of ``NR`` output channels
(`pack_conv_weight`: ``w[co // NR, i, j, ci, co % NR]``, the last panel zero-padded), a
convolution is the GEMM micro-kernel with A's rows gathered from the input window: each
(tap, input channel) broadcasts one input value per pixel of the tile and meets one row of
the panel::

    out[n, oh, ow, co:co+NR] = bias[co:co+NR] + sum_{i, j, ci} x[n, oh*s + i*d - p,
                                                   ow*s + j*d - p, ci] * w[co//NR, i, j, ci, :]

No im2col buffer: the window is read in place. `conv_func` gives the program as a lowering
would (tensors logically NCHW with channels-last strides; the sum in a LOCAL accumulator set
to the bias by one block and stored by another). The zero padding is either a bounds guard
on the update, skipped as ATen's channels-last convolution skips it (the same sum for finite
weights), or a padded copy of the input that the kernel writes first, so that no tap needs a guard
(for a small input, or a wide window over few channels: ResNet's 7x7 stem, 1094 us with the
copy, 1359 us with guards). `schedule_conv` makes::

    for n:
      parallel co_0 (or serial, with the rows parallel): # a panel of NR output channels
        for oh:                                         # stays in L2 over all the rows
          for ow_0 in range(OW / T):                    # T pixels by NR channels: the tile
            unrolled ow_1 / vectorized co_1:  acc = bias
            for i, j, ci:
              unrolled ow_1 / vectorized co_1:
                acc[ow_1, co_1] += x[n, ci, ih, iw] * w[co_0, i, j, ci, co_1]
            unrolled ow_1 / vectorized co_1:  out = act(acc)
          for ow_0 in range(...):                       # with a `ConvConfig.tail_tile`: the
            ...                                         # row's last tiles, narrower

The panel loop is outside the rows so that one panel (KH*KW*CI*NR floats: 590 KB for a
512-channel 3x3 layer) stays in L2 while every pixel passes it; the threads split the panels
where there are enough to balance, else the rows. Post-passes: compaction, indices in loop
variables, `kiln.tir.tails.version_tails` on the panel, row, pixel-tile and tap loops
(interior rows and tiles run without a guard; in a border tile only the taps that reach the
padding keep theirs), the padded panel's guards dropped
(`kiln.tir.tails.drop_dead_guards`), and the activation in the write-back.
"""

from __future__ import annotations

import functools

import torch

from kiln.ir.types import DType
from kiln.kernels.conv_config import ConvConfig, ConvShape, panel_within_group
from kiln.kernels.depthwise_schedule import loop_nest, padding_after, tap_position
from kiln.kernels.gemm_schedule import PREFETCH_MIN_BYTES, SERIAL_MACS, SPREAD_PREFETCH
from kiln.kernels.plan import (
    Compact,
    DropDeadGuards,
    Epilogue,
    KernelPlan,
    PostPass,
    PrefetchPanels,
    Recipe,
    Serial,
    ShrinkTails,
    SimplifyIndices,
    Tensorize,
    VersionTails,
)
from kiln.tir.nodes import (
    Allocate,
    BufferStore,
    CmpOp,
    Compare,
    Expr,
    PrimFunc,
    Scope,
    Select,
    Stmt,
    Var,
    channels_last_strides,
    const,
    seq,
)
from kiln.tir.nodes import Buffer as TBuffer
from kiln.tir.schedule import Schedule
from kiln.tir.visit import conjoin

__all__ = ["conv_func", "conv_plan", "pack_conv_weight", "schedule_conv"]

F32 = DType.F32


def pack_conv_weight(weight: torch.Tensor, nr: int) -> torch.Tensor:
    """A weight [CO, CI / groups, KH, KW] (any strides) as the kernel reads it: panels of
    ``nr`` output channels, f32[ceil(CO / nr), KH, KW, CI / groups, nr], contiguous, the last
    panel zero-padded, so one row of a panel is ``nr / lanes`` vector loads. (A panel lies in
    one group, or spans whole narrow groups, `panel_within_group`: a lane's rows are its own
    group's input channels.)"""
    co, ci, kh, kw = weight.shape
    panels = -(-co // nr)
    padded = torch.zeros(panels * nr, ci, kh, kw, dtype=weight.dtype)
    padded[:co] = weight.detach()
    return padded.view(panels, nr, ci, kh, kw).permute(0, 3, 4, 2, 1).contiguous()


def _lt(a: Expr, b: Expr) -> Expr:
    return Compare(CmpOp.LT, a, b)


def conv_func(shape: ConvShape, nr: int, name: str = "conv", pad_copy: bool = False,
              split_at: int = 0) -> PrimFunc:
    """The unscheduled program (see the module docstring): blocks ``init`` (the accumulator
    set to the bias, or 0, plus the residual where there is one), ``conv`` (the guarded
    update over taps and input channels) and ``store`` (the accumulator written to
    ``out``), each in its own loop nest. With ``pad_copy`` (and some padding) a first block
    ``pad`` writes the input with its zero border into a temporary ``xp``, and ``conv``
    reads that without guards. With ``0 < split_at < OW`` the three nests cover the output
    columns before ``split_at``, and three more (``init_tail``, ``conv_tail``,
    ``store_tail``, accumulating in their own ``acc_tail``) the columns from there on, so
    that the two parts can take register tiles of different widths."""
    n, ci, h, w, co = shape.n, shape.ci, shape.h, shape.w, shape.co
    if not panel_within_group(shape, nr):
        raise ValueError(f"{shape.groups} groups of {co // shape.groups} output channels: "
                         f"a panel of {nr} would span two groups")
    kh, kw = shape.kernel
    oh, ow = shape.out
    gci, per_group = shape.group_ci, co // shape.groups
    x = TBuffer("x", (n, ci, h, w), F32, shape.x_strides or channels_last_strides((n, ci, h, w)))
    wt = TBuffer("w", (-(-co // nr), kh, kw, gci, nr), F32)
    bias = TBuffer("bias", (co,), F32) if shape.bias else None
    out = TBuffer("out", (n, co, oh, ow), F32, channels_last_strides((n, co, oh, ow)))
    residual = TBuffer("residual", (n, co, oh, ow), F32, channels_last_strides((n, co, oh, ow))
                       ) if shape.residual else None
    (ph, pw), (qh, qw) = shape.padding, padding_after(shape)
    padded = pad_copy and any((ph, pw, qh, qw))
    xp = TBuffer("xp", (n, ci, h + ph + qh, w + pw + qw), F32,
                 channels_last_strides((n, ci, h + ph + qh, w + pw + qw)))

    def position(o: Expr, k: Var, d: int) -> Expr:
        return tap_position(shape, o, k, d)

    def within(pos_h: Expr, pos_w: Expr) -> Expr | None:
        conds = []
        for pos, size, before, after in ((pos_h, h, ph, qh), (pos_w, w, pw, qw)):
            # (where there is no padding on a side, no position falls past it)
            if before > 0:
                conds.append(_lt(const(-1, pos.dtype), pos))
            if after > 0:
                conds.append(_lt(pos, const(size, pos.dtype)))
        return conjoin(*conds)

    def pad(vn: Var, vh: Var, vw: Var, vci: Var) -> Stmt:
        pos_h, pos_w = vh - ph, vw - pw
        value = Select(within(pos_h, pos_w), x[vn, vci, pos_h, pos_w],  # type: ignore[arg-type]
                       const(0.0, F32))
        return BufferStore(xp, (vn, vci, vh, vw), value)

    reduce = (("i", kh), ("j", kw), ("ci", gci))

    def channel(vco: Expr, vci: Expr) -> Expr:
        """The input channel of reduction index ``vci`` for output channel ``vco``: the
        panel's group's (the panel index over the panels a group has), or where a panel
        spans narrow groups, each lane's own group's."""
        if shape.groups == 1:
            return vci
        if per_group % nr == 0:
            return (vco // nr) // (per_group // nr) * gci + vci
        return vco // per_group * gci + vci

    def part(suffix: str, start: int, stop: int) -> tuple[TBuffer, Stmt]:
        """The accumulator and the three nests over output columns [start, stop): a nest's
        column var (and the accumulator's column) counts from 0, ``col`` is the output's."""
        acc = TBuffer(f"acc{suffix}", (n, oh, stop - start, co), F32, scope=Scope.LOCAL)

        def col(vow: Expr) -> Expr:
            return vow + start if start else vow

        def init(vn: Var, voh: Var, vow: Var, vco: Var) -> Stmt:
            value = bias[vco] if bias is not None else const(0.0, F32)
            if residual is not None:
                shortcut = residual[vn, vco, voh, col(vow)]
                value = shortcut if bias is None else value + shortcut
            return BufferStore(acc, (vn, voh, vow, vco), value)

        def update(vn: Var, voh: Var, vow: Var, vco: Var, vi: Var, vj: Var, vci: Var) -> Stmt:
            pos_h, pos_w = position(voh, vi, 0), position(col(vow), vj, 1)
            c = channel(vco, vci)
            value = xp[vn, c, pos_h + ph, pos_w + pw] if padded else x[vn, c, pos_h, pos_w]
            tap = value * wt[vco // nr, vi, vj, vci, vco % nr]
            return BufferStore(acc, (vn, voh, vow, vco), acc[vn, voh, vow, vco] + tap)

        def inside(vn: Var, voh: Var, vow: Var, vco: Var, vi: Var, vj: Var, vci: Var
                   ) -> Expr | None:
            return None if padded else within(position(voh, vi, 0),
                                              position(col(vow), vj, 1))

        def store(vn: Var, voh: Var, vow: Var, vco: Var) -> Stmt:
            return BufferStore(out, (vn, vco, voh, col(vow)), acc[vn, voh, vow, vco])

        spatial = (("n", n), ("oh", oh), ("ow", stop - start), ("co", co))
        return acc, seq(loop_nest(f"init{suffix}", spatial, init),
                        loop_nest(f"conv{suffix}", spatial, update, reduce, inside),
                        loop_nest(f"store{suffix}", spatial, store))

    split = 0 < split_at < ow
    parts = [part("", 0, split_at if split else ow)]
    if split:
        parts.append(part("_tail", split_at, ow))
    body = seq(*(nests for _, nests in parts))
    for acc, _ in reversed(parts):
        body = Allocate(acc, body)
    inputs = (x, wt) if bias is None else (x, wt, bias)
    inputs += (residual,) if residual is not None else ()
    if padded:
        padding = loop_nest("pad", (("n", n), ("h", h + ph + qh), ("w", w + pw + qw),
                                    ("ci", ci)), pad)
        return PrimFunc(name, inputs, (out,), Allocate(xp, seq(padding, body)))
    return PrimFunc(name, inputs, (out,), body)


def schedule_conv(func: PrimFunc, config: ConvConfig
                  ) -> tuple[Schedule, list[str], tuple[str, ...]]:
    """The register-tiled schedule of `conv_func`'s program; returns the schedule, the
    loops whose bodies `version_tails` versions: panels, rows and pixel tiles (interior ones
    run without a guard), then the taps (in a border row a tap row outside the input is one
    test, and in a border tile only the taps that reach the padding keep their guards), and
    the loops of the reduction around the register tile, outermost first (tap rows, tap
    columns, input channels). Where the program has a second part of the columns
    (``conv_tail``), it takes tiles of ``config.tail_tile`` pixels, and its batch, panel
    and row loops fuse with the first part's: one parallel loop, each row's tiles in
    turn."""
    sch = Schedule(func)
    parts = [("", config.tile)]
    if "conv_tail" in sch.blocks():
        parts.append(("_tail", config.tail_tile))
    outer, tails, taps = [], [], []
    for suffix, tile in parts:
        conv = sch.get_block(f"conv{suffix}")
        n, oh, ow, co, i, j, ci = sch.get_loops(conv)
        oh_0, oh_1 = sch.split(oh, [None, config.rows])
        ow_0, ow_1 = sch.split(ow, [None, tile])
        co_0, co_1 = sch.split(co, [None, config.nr])
        sch.reorder(n, co_0, oh_0, ow_0, i, j, ci, oh_1, ow_1, co_1)
        init, store = sch.get_block(f"init{suffix}"), sch.get_block(f"store{suffix}")
        sch.reverse_compute_at(store, ow_0)  # (first: then no reader of acc is left outside)
        sch.compute_at(init, ow_0)
        sch.unroll(oh_1)
        sch.unroll(ow_1)
        sch.vectorize(co_1)
        for block in (init, store):
            rows, pixels, lanes = sch.get_loops(block)[-3:]
            sch.unroll(rows)
            sch.unroll(pixels)
            sch.vectorize(lanes)
        outer.append((n, co_0, oh_0))
        tails += [ow_0.name, i.name, j.name]
        taps += [i.name, j.name, ci.name]
    n, co_0, oh_0 = outer[0]
    for first, second in zip(*outer[:2]) if len(outer) > 1 else ():
        sch.fusion(first, second)
    # (n stays serial: fused with oh, the row guards would not be affine)
    sch.parallel(co_0 if config.split_panels else oh_0, config.dynamic)
    if any(b.name == "xp" for b in _allocated(func)):  # the padded copy: rows on the threads
        _, rows, _, channels = sch.get_loops(sch.get_block("pad"))
        sch.parallel(rows)
        sch.vectorize(channels)
    return sch, [co_0.name, oh_0.name, *tails], tuple(taps)


def _allocated(func: PrimFunc) -> list[TBuffer]:
    stmt, found = func.body, []
    while isinstance(stmt, Allocate):
        found.append(stmt.buffer)
        stmt = stmt.body
    return found


def _prefetch_next_panel(shape: ConvShape, config: ConvConfig, tails: list[str],
                        ci_loop: str) -> PrefetchPanels:
    """The next weight panel prefetched along the input channels' loop: each of the panel's
    register tiles (rows of tiles by tiles of a row) its share, where the row has one tile
    width; with a second width (``tail_tile``) every tile prefetches the whole panel, as
    every tile did before (ResNet-50's 14x14x256 layer: 14 times over). An AVX-512 Xeon,
    2 threads, models in one process, interleaved, the whole panel (A) against the share
    (B): ResNet-50 0.978 and 0.949 of the time (B faster in 11/15, 13/21 rounds), HF
    ResNet-50 0.932 (12/15); ResNet-18 1.001, Inception 1.006 (its 17x17 layers keep two
    widths). Layers alone went either way (7x7x512 0.95 hot, 0.92 cold; 14x14x256 1.02,
    1.05)."""
    if not SPREAD_PREFETCH or config.split_at(shape.out[1]):
        return PrefetchPanels(ci_loop, "w")
    rows, pixels = -(-shape.out[0] // config.rows), -(-shape.out[1] // config.tile)
    if rows * pixels < 2:
        return PrefetchPanels(ci_loop, "w")
    _, row_loop, pixel_loop = tails[:3]
    return PrefetchPanels(ci_loop, "w", pixel_loop, rows * pixels, outer_loop=row_loop,
                          inner_tiles=pixels)


@functools.lru_cache(maxsize=256)  # (a plan is immutable: repeated layers share one)
def conv_plan(shape: ConvShape, config: ConvConfig, name: str = "conv",
              epilogue: Epilogue | None = None) -> KernelPlan:
    """The convolution as a plan: `conv_func`'s program, the Trace of `schedule_conv`, then
    compaction, indices in loop vars, the guards versioned away from interior rows and
    tiles and full panels, the padded panel's dead guards dropped, the next weight panel
    prefetched where the packed weight is large (`plan.PrefetchPanels`: a model call finds
    it in DRAM; 7x7x512 -> 512 on cold weights, an AVX-512 Xeon, 2 threads: 1043 -> 808
    us, 14x14x256 -> 256 642 -> 597; hot, within noise), the activation in the
    write-back, and one thread below `SERIAL_MACS` multiply-adds."""
    program = conv_func(shape, config.nr, name, config.pad_copy, config.split_at(shape.out[1]))
    sch, tails, taps = schedule_conv(program, config)
    post: tuple[PostPass, ...] = (Compact(), SimplifyIndices(), VersionTails(tuple(tails)),
                                  ShrinkTails(), DropDeadGuards())
    panels = -(-shape.co // config.nr)
    if panels * shape.kernel[0] * shape.kernel[1] * (shape.ci // shape.groups) * config.nr * 4 \
            >= PREFETCH_MIN_BYTES:  # (the packed weight's bytes)
        post += (_prefetch_next_panel(shape, config, tails, taps[-1]),)
    if epilogue is not None:
        post += (epilogue,)
    # (a first layer's taps over 3 channels too, now that the tile's reduction stays a loop;
    # Zen 3, AVX2, 6-pixel tiles, as loops against FMA_TILE: ResNet's 7x7 stem 1717 us,
    # 1384; Inception's 3x3 over 299x299 358, 280; MobileNetV2's 3x3 over 225x225 204, 167)
    if config.lanes and config.nr % config.lanes == 0:
        post += (Tensorize(taps, config.lanes),)
    if shape.macs < SERIAL_MACS:  # (by work, as a GEMM: 512 outputs of a 7x7 layer are
        # 2.3 M multiply-adds each)
        post += (Serial(f"{shape.macs} multiply-adds < SERIAL_MACS {SERIAL_MACS}"),)
    return KernelPlan(Recipe.CONV, program, sch.trace, post,
                      notes=f"# kiln.kernels.conv_plan({shape}, {config})", scheduled=sch.func)
