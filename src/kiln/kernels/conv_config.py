"""The register tile of kiln's direct convolution (`kiln.kernels.conv_schedule`) for a
convolution's sizes on this machine: `ConvShape` (the sizes), `ConvConfig` (``tile`` pixels
of a row by ``NR`` output channels, the threads' split, guards or a padded copy) and the
measured heuristics of `ConvConfig.default`, which the autotuner's space starts from
(`kiln.tune.space_window`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kiln.codegen.c import WORKSPACE_MAX
from kiln.kernels.depthwise_schedule import output_size, padding_after
from kiln.kernels.plan import shares_dynamically

__all__ = ["L1_WAYS", "PAD_COPY_BYTES", "SMALL_COPY_BYTES", "TWO_ROW_COPY_BYTES", "ConvConfig",
           "ConvShape", "broadcast_group", "conv_shares_dynamically", "group_lanes",
           "panel_within_group"]

# the largest padded copy of the input a kernel makes: the copy is a workspace each calling
# thread allocates once and keeps (`kiln.codegen.c.WORKSPACE_MAX`); freed after each call,
# glibc mapped a block this large afresh whenever the heap's top had been given back, and its
# pages faulted in on the call (MobileNetV2's first layer, a 613 KB copy: 347 us beside
# ATen's and oneDNN's allocations, 172 us alone; with guards instead, 131-139 us)
PAD_COPY_BYTES = WORKSPACE_MAX
# a copy up to this size always; a larger one only for a wide window over few channels
# (Zen 4, 2 threads, tile 7, the copy a kept workspace): ResNet's 7x7 stem over 3 channels
# 1094 us with the copy, 1359 with guards (oneDNN 1360-1470); MobileNetV2's 3x3 first layer
# 164 us with it, 122 with guards; 3x3 layers over 32-256 channels 3-20% slower with it
SMALL_COPY_BYTES = 128 * 1024
# with 16 vector registers (AVX2) a stride-1 layer takes a copy up to this size: its border
# tiles' guarded versions of the 7 x 16 tile (14 of the 16 registers accumulators) cost more
# than the copy (Zen 3, 2 threads, tensorized, 3x3: 17x17x128->192 1097 -> 960 us, 7x7x512
# 1537 -> 1386, 14x14x256 1427 -> 1330, 35x35x96 1232 -> 1201 with it; 56x56x64 within 1%;
# 147x147x32, a 2.8 MB copy, 4821 -> 4974; stride 2 keeps guards, 9-13% faster with them:
# only its first row and column reach the padding)
SMALL_COPY_BYTES_STRIDE1_16_REGISTERS = 640 * 1024
# where 512-bit FMAs run at full rate (`kiln.cost.machine.full_rate_512`), a stride-1 layer
# over two vectors of output channels takes a tile of two output rows (`ConvConfig.rows`) of
# up to 7 pixels, 28 accumulators, over a padded copy of up to this size: the 7-pixel tile
# of one row (14 accumulators, 9 loads a step for 14 FMAs) leaves the loads the limit, and
# a 14-pixel row tile needs the copy too but reads further apart. An AVX-512 Xeon, 2 threads,
# 3x3 + bias + relu, default (7 x 1 with guards) against 7 x 2 over the copy (oneDNN on a
# reordered weight): 28x28x128 771 -> 700 us (693), 14x14x256 791 -> 685 (692), 7x7x512
# 915 -> 757 (791), 17x17x128->192 554 -> 372 (386), 35x35x64->96 459 -> 416 (410),
# 149x149x32 without padding 1242 -> 1149 (1330), 56x56x64 (an 861 KB copy) 750 -> 750;
# 147x147x32->64, a 2.8 MB copy, 2789 -> 2832, so larger copies keep guards. Stride 2 keeps
# guards (56x56x128 to 28x28: 734 -> 932 over the copy); but a layer without padding, or
# one that takes the copy anyway (a first layer's wide window over 3 channels), takes two
# rows at any stride: ResNet's 7x7 stem 807 -> 737 us (oneDNN 1036), Inception's 3x3
# stride-2 stem over 299x299 242 -> 179 (306), its 35x35x288->384 stride 2 2062 -> 1998
TWO_ROW_COPY_BYTES = 1024 * 1024
# A tile reads its pixels' input vectors side by side; where the pixels lie a multiple of
# 4 KiB apart (CI x stride x 4 bytes), their lines share one L1 set, which holds this many:
# more pixels than that evict each other in every step of the channel loop. Zen 4 (8-way
# 32 KiB L1d), 2 threads, ResNet-50's 512->1024 1x1 stride-2 shortcut over 14 output
# columns (pixels 4 KiB apart): 14-pixel tiles 1204 us, 7-pixel 905 (oneDNN 994);
# 256->512 stride 2 (2 KiB apart: two sets) 922 at 14, 908 at 7
L1_WAYS = 8


@dataclass(frozen=True)
class ConvShape:
    """A convolution's sizes: input [N, CI, H, W], CO output channels, kernel KH x KW,
    stride, padding, dilation (per spatial dim), and whether it adds a bias. ``groups``:
    dense (1), or CO / groups output channels over CI / groups input channels each, a
    multiple of the register tile's ``nr`` (`panel_within_group`).
    ``x_strides``: the input's strides where it is not channels-last (a network's NCHW
    input, `kiln.kernels.conv.layout_prologue`). ``residual``: it adds a channels-last
    tensor of the output's shape (a ResNet basic block's shortcut), before the activation.
    ``padding_after``: see `DepthwiseShape`."""

    n: int
    ci: int
    h: int
    w: int
    co: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int] = (1, 1)
    bias: bool = False
    x_strides: tuple[int, ...] | None = None
    residual: bool = False
    # the padding after each spatial dim where it differs from ``padding`` (a zero ``pad``
    # folded in: TensorFlow's "same" padding of a strided convolution)
    padding_after: tuple[int, int] | None = None
    groups: int = 1

    @property
    def out(self) -> tuple[int, int]:
        """OH, OW, as ATen's convolution computes them."""
        return output_size(self)

    @property
    def group_ci(self) -> int:
        """Input channels an output channel reads."""
        return self.ci // self.groups

    @property
    def macs(self) -> int:
        oh, ow = self.out
        return self.n * self.co * oh * ow * self.group_ci * self.kernel[0] * self.kernel[1]


def panel_within_group(shape: ConvShape, nr: int) -> bool:
    """Whether a panel of ``nr`` output channels reads its input channels in a way the
    register tile can: the panel lies in one group, so that each (tap, input channel) of the
    reduction is one value for all its lanes (a broadcast); or it spans whole narrow groups
    (`broadcast_group`), each of as many input as output channels, so that one input vector
    shuffled within each group's lanes serves them all (`kiln.tir.tensorize`'s group
    broadcast). Never a panel whose lanes meet another group's channels through zeros in
    its weights: 0 x inf is NaN, and an infinite input channel would reach the other
    group's outputs, which ATen's grouped convolution never does."""
    if shape.groups == 1 or (shape.co // shape.groups) % nr == 0:
        return True
    group = broadcast_group(shape)  # (whole panels: a lane past CO would read past CI)
    return group > 0 and nr % group == 0 and shape.co % nr == 0


# the narrowest vectors a grouped convolution's tiles run on (`group_lanes`): 128 bits
MIN_GROUP_LANES = 4
# groups of at most this many channels (in and out) fill a whole vector, several groups a
# vector, each group's lanes reading its input channels through one shuffle of the input
# vector per channel (`panel_within_group`); wider groups narrow the vectors instead
# (ResNeXt-50's 8 channels a group: 256-bit vectors on an AVX-512 machine)
BROADCAST_GROUP_MAX = 4


def broadcast_group(shape: ConvShape) -> int:
    """The channels a group where a grouped convolution's panels span several whole groups,
    each lane reading its own group's input channels by a shuffle (`BROADCAST_GROUP_MAX`
    channels a group at most, as many in as out: ResNeXt-50's first stage, 4); 0 where
    they do not."""
    per_group = shape.co // shape.groups
    if shape.groups > 1 and MIN_GROUP_LANES <= per_group <= BROADCAST_GROUP_MAX \
            and per_group == shape.group_ci:
        return per_group
    return 0


def group_lanes(shape: ConvShape, lanes: int) -> int:
    """The vector width for ``shape``'s tiles: ``lanes``, or for a grouped convolution whose
    groups' output channels do not fill vectors that wide, the widest of its halves (down to
    `MIN_GROUP_LANES`) that they fill (`panel_within_group`). ResNeXt-50's 8 channels a group
    then run on 256-bit vectors on an AVX-512 machine, instead of the library's kernel; its
    4 channels a group keep the whole vector, four groups a vector (`broadcast_group`)."""
    if shape.groups > 1:
        while lanes > MIN_GROUP_LANES and not panel_within_group(shape, lanes):
            lanes //= 2
    return lanes


@dataclass(frozen=True)
class ConvConfig:
    """The register tile (``tile`` pixels of a row by ``nr`` output channels) and whether
    the threads split the channel panels (else the rows)."""

    tile: int = 14
    nr: int = 32
    split_panels: bool = True
    # the zero padding written once into a padded copy of the input (the taps then need no
    # guards), instead of guards on the border rows and tiles
    pad_copy: bool = True
    rows: int = 1  # output rows in the register tile (``tile`` pixels of each)
    # the threads take panels (or rows) as they come free, not a fixed contiguous run each
    # (`conv_shares_dynamically`)
    dynamic: bool = False
    # the vector width the tile was sized for: the register tile's reduction (taps and
    # channels) is tensorized on vectors this wide (`plan.Tensorize`); 0 leaves the loops
    lanes: int = 0
    # the last tiles of each row: ``tile``-pixel tiles up to `ConvConfig.split_at`, then
    # tiles of this many (28 columns: 6, 6, 6, 5, 5), so that no tile is short; 0: one width
    tail_tile: int = 0

    def split_at(self, ow: int) -> int:
        """The first column of the ``tail_tile`` tiles: the most ``tile``-pixel tiles that
        leave a whole number of ``tail_tile`` ones (0, one width, with no tail, where
        ``tile`` divides the row, or where no such split is)."""
        if self.tail_tile <= 0 or ow % self.tile == 0:
            return 0
        return next((full * self.tile for full in range(ow // self.tile, 0, -1)
                     if (ow - full * self.tile) % self.tail_tile == 0), 0)

    @staticmethod
    def default(shape: ConvShape, lanes: int, registers: int = 32,
                threads: int = 2, full_rate: bool = False) -> ConvConfig:
        """NR: two vectors where CO fills more than one, else one. The tile: as many pixels
        as the accumulators leave registers for (two for the weights' vectors, one for the
        broadcast), preferring a tile that divides the row, and never wider than the row;
        7 or 8 pixels where the border keeps guards. On 16 registers, 6 pixels, and 5 for
        the last tiles of a row that 6 does not divide (`tail_tile`).
        The threads split the panels where each thread gets the same number of them (or
        there are at least four per thread), else the rows; the rows too where a thread
        would get a single panel and there are rows enough to balance. The padded copy
        where there is padding and the copy is small (`SMALL_COPY_BYTES`), or the window is
        wide (5x5 and up) over few input channels, so that a guard costs more than its taps'
        work (up to `PAD_COPY_BYTES`); else guards, and always guards with the 6- and
        5-pixel tiles.
        ``full_rate`` (512-bit FMAs at full rate): a layer over two vectors of channels takes
        two rows of up to 7 pixels where no tile needs a guard: no padding, the padded copy
        taken anyway, or (stride 1) a copy of at most `TWO_ROW_COPY_BYTES`."""
        lanes = max(lanes, 4)
        if shape.groups > 1:
            return ConvConfig._grouped(shape, lanes, registers, threads)
        vectors = 2 if shape.co > lanes else 1
        nr = vectors * lanes
        (ph, pw), (qh, qw), (h, w) = shape.padding, padding_after(shape), (shape.h, shape.w)
        padding = any((ph, pw, qh, qw))
        ow = shape.out[1]
        few_channels_wide_window = shape.group_ci < 8 and \
            shape.kernel[0] * shape.kernel[1] >= 25
        row = _row_tiles_16_registers(ow) if registers <= 16 and vectors == 2 and ow > 7 \
            else None
        copy_bytes = 4 * shape.n * shape.ci * (h + ph + qh) * (w + pw + qw)
        small = SMALL_COPY_BYTES_STRIDE1_16_REGISTERS \
            if registers <= 16 and shape.stride == (1, 1) else SMALL_COPY_BYTES
        # (those tiles' guarded border versions fit the registers, and beat the copy:
        # 28x28x128 1230 -> 1187 us, 17x17x128->192 737 -> 684, 12x12x64 78 -> 68,
        # MobileNetV2's 3x3 first layer 193 -> 162; not 7x7 over 3 channels: 1389 -> 1853)
        pad_copy = padding and copy_bytes <= PAD_COPY_BYTES and (
            (copy_bytes <= small and row is None) or few_channels_wide_window)
        two_rows = full_rate and registers >= 32 and vectors == 2 and shape.out[0] >= 2 and (
            not padding or pad_copy or (  # (no guards either way)
                shape.stride == (1, 1) and not few_channels_wide_window
                and copy_bytes <= min(TWO_ROW_COPY_BYTES, PAD_COPY_BYTES)))
        if two_rows:
            pad_copy = padding
        guarded = padding and not pad_copy
        # with guards, a tile of 7 or 8 pixels: the border tiles' versions of a 14-pixel
        # tile ran out of registers (an accumulator spilled next to a clamp's constants:
        # MobileNetV2's first layer 309 us at 14 pixels, 126 at 7, oneDNN 160; ResNet's
        # 64->64 3x3 1178 us at 14, 1024 at 7, oneDNN 1078)
        largest = 8 if guarded else max((registers - vectors - 1) // vectors, 1)
        largest = min(largest, _pixels_an_l1_set_holds(shape))
        rows = 2 if two_rows else 1
        largest = max(largest // rows, 1)
        tail_tile = 0
        if row is not None:
            tile, tail_tile = row
        elif 0 < ow <= largest:
            tile = ow
        elif registers <= 16 and shape.group_ci < lanes:
            # 16 registers, a first layer's few channels over one vector of output
            # channels: at most 6 pixels (ResNet's 7x7 stem, when its taps were loops: 2072
            # us over 7 pixels, 1718 over 6)
            tile = next((t for t in (6, 5, 4) if ow % t in (0, t - 2, t - 1)), 6)
        elif registers <= 16 and shape.stride == (1, 1) and not (
                guarded or few_channels_wide_window) and (
                ow % 6 in (0, 4, 5) or ow % 7 in (0, 5, 6)):
            # 16 registers, stride 1, over the copy, rows of 7 (7x7x512: 7 x 16 1396 us;
            # 4 + 3 1589, 5 + 2 1493 with guards) or one vector of channels: 6 where the
            # last tile is not short, else 7
            tile = 6 if ow % 6 in (0, 4, 5) else 7
        elif guarded or few_channels_wide_window:  # (the 7x7 stem over its padded copy:
            # 1094 us at 7 pixels, 1188 at 14)
            tile = next((t for t in (7, 8, 6, 5, 4) if t <= largest and ow % t == 0), 0)
            if not tile and guarded:
                # no width divides the row: tiles of t, then of t - 1, so that no tile is
                # short (Zen 4, 2 threads, Inception's 1x7 layers over 17 columns, guards on
                # both sides: 192->192 7 + 7 + 3 pixels 974 us, 6 + 6 + 5 624, oneDNN
                # 652; 160->192 796, 524, 547)
                tile, tail_tile = next(((t, t - 1) for t in (8, 7, 6) if t <= largest
                                        and ConvConfig(t, tail_tile=t - 1).split_at(ow)),
                                       (0, 0))
            tile = tile or min(7, largest)
        else:
            dividing = [t for t in range(largest, max(largest // 2, 1) - 1, -1) if ow % t == 0]
            # else the fewest tiles, as even as they go: a last tile of a pixel or three
            # costs most of a full one (Inception's 80->192 3x3 over 71 pixels: 6.74 ms at
            # 14 = 5 x 14 + 1, 6.16 at 12 = 5 x 12 + 11; its 288->384 stride 2 over 17:
            # 2.69 ms at 14 + 3, 2.50 at 12 + 5)
            tile = dividing[0] if dividing else -(-ow // -(-ow // largest))
        panels = -(-shape.co // nr)
        # a panel or so a thread, over many rows: the threads split the rows instead, each
        # reading half the input (2 threads, weights cold, 56x56x64 3x3: 679 -> 652 us;
        # not at 14x14, whose 7 row tiles do not balance: 64 -> 68)
        few_panels = panels < 2 * threads and -(-shape.out[0] // rows) >= 4 * threads
        split = threads > 1 and (panels % threads == 0 or panels >= 4 * threads) \
            and not (few_channels_wide_window or few_panels)
        # rows split over the padded copy in fixed runs, as the copy's are: a thread reads
        # the rows it wrote, from its own cache (56x56x32 3x3: 175 -> 161 us; without the
        # copy a tie)
        dynamic = conv_shares_dynamically(shape) and (split or not pad_copy)
        return ConvConfig(tile, nr, split, pad_copy, rows, dynamic=dynamic,
                          lanes=lanes, tail_tile=tail_tile)

    @staticmethod
    def _grouped(shape: ConvShape, lanes: int, registers: int, threads: int) -> ConvConfig:
        """A grouped layer's reduction is short (ResNeXt-50: 8 to 32 channels x 9 taps), so a
        tile's set-up and the input's padded copy weigh more than in a dense one.
        - Where a group's output channels fill two vectors and a row is wider than one
          tile: two vectors, in the fewest tiles as even as they go (14 pixels: 5 + 5 + 4),
          at most 8 pixels, with guards on the border tiles and no padded copy (a pass over
          the input that the interior tiles, free of guards, do not need).
        - Else one vector of channels, the padded copy, tiles of 7 or 8 pixels.
        Zen 3, AVX2, 2 threads, ResNeXt-50's 3x3 layers (32 groups), isolated, shuffled
        rounds, two vectors with guards against one vector over the copy (ATen):
        14x14x512 177-301 us against 251-428 (325-504), stride 2 to 14x14x512 333 against
        670-711 (521). In the model, profiled five times in each of three processes per
        side: 363-388 us against 382-410 a 14x14 layer, while the unchanged layers read 20%
        slower in the new side's processes; the stride-2 layer 515 against the library's
        911. One vector with guards instead of the copy was faster alone (28x28x256: 360
        against 375 us) but slower in the model (681-729 against 415-474), so one vector
        keeps the copy."""
        ow = shape.out[1]
        (ph, pw), (qh, qw) = shape.padding, padding_after(shape)
        padding = any((ph, pw, qh, qw))
        copy_bytes = 4 * shape.n * shape.ci * (shape.h + ph + qh) * (shape.w + pw + qw)
        two_vectors = ow > 8 and (shape.co // shape.groups) % (2 * lanes) == 0
        if two_vectors:
            largest = min(max((registers - 3) // 2, 1), 8)
            tile = -(-ow // -(-ow // largest))
        else:
            tile = next((t for t in (8, 7, 6, 5, 4) if ow % t == 0), min(8, max(ow, 1)))
        pad_copy = padding and not two_vectors and copy_bytes <= PAD_COPY_BYTES
        nr = (2 if two_vectors else 1) * lanes
        panels = -(-shape.co // nr)
        split = threads > 1 and (panels % threads == 0 or panels >= 4 * threads)
        return ConvConfig(tile, nr, split, pad_copy, dynamic=conv_shares_dynamically(shape),
                          lanes=lanes)


def _row_tiles_16_registers(ow: int) -> tuple[int, int]:
    """On 16 registers (AVX2), two vectors of output channels: the register tiles of an
    output row wider than 7 pixels, (``tile``, ``tail_tile``). 6 x 16 tiles (12
    accumulators), the row's last ones 5 x 16 where 6 does not divide it (28 = 6+6+6+5+5):
    both ran at 95% of the FMA peak by hand, where 7 x 16 (14 accumulators, one weight
    vector read by each FMA from memory) ran at 87%, and a short last tile (4 x 16: 8
    accumulators) made the whole kernel up to 2x slower. Zen 3, 2 threads, 3x3, 7 x 16
    over the padded copy against these with guards (and oneDNN): 28x28x128 1360 us, 1187
    (1246); 56x56x64 1404, 1214 (1274); 112x112x64 5504, 4786 (4875); 147x147x32->64 4950,
    4133 (4392); 35x35x48->64 5x5 1097, 972 (1289); stride 2 to 28x28x128 1375, 1233
    (1394). Rows no 6s and 5s make: a 7 first, then 6s (13 pixels 294 us, 252 as 7 + 6;
    19: 787, 540), else 6s and what is left (14x14x256: 1352, 1272 as 6 + 6 + 2; 8x8x384
    1377 over 4 + 4, 977 as 6 + 2)."""
    if ow % 6 == 0:
        return 6, 0
    if ConvConfig(6, tail_tile=5).split_at(ow):
        return 6, 5
    if ow % 5 == 0:
        return 5, 0
    if ow % 6 == 1:
        return 7, 6
    return 6, ow % 6


def conv_shares_dynamically(shape: ConvShape) -> bool:
    """`plan.shares_dynamically` for the convolution: two FLOPs a multiply-add, over its
    input, weights and output once (a 3x3 convolution over 64 channels: about 130 FLOPs a
    byte, dynamic; MobileNetV2's 3-channel stem: 10, static)."""
    (kh, kw), (oh, ow) = shape.kernel, shape.out
    elements = (shape.n * shape.ci * shape.h * shape.w + shape.co * shape.group_ci * kh * kw
                + shape.n * shape.co * oh * ow * (2 if shape.residual else 1))
    return shares_dynamically(2.0 * shape.macs, 4.0 * elements)


def _pixels_an_l1_set_holds(shape: ConvShape) -> int:
    """The most pixels a row tile may take before its input vectors evict each other from
    L1 (`L1_WAYS`): pixels a multiple of 4 KiB apart (the L1 index's span) share a set."""
    if shape.x_strides is not None:
        return 1 << 30  # (an NCHW source: the tile's pixels are adjacent floats)
    step = 4 * shape.ci * shape.stride[1]  # bytes between a tile's pixels, channels-last
    return L1_WAYS * (4096 // math.gcd(step, 4096))
