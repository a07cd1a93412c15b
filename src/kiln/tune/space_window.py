"""Design spaces of the channels-last window kernels: kiln's dense direct convolution
(`kiln.kernels.conv_schedule`), depthwise convolution (`depthwise_schedule`) and pooling
(`pool_schedule`). Each heuristic (``ConvConfig.default``, ``DepthwiseConfig.default``) is
the default point, so tuning never starts below it.

Decisions, in order (a later one's candidates depend on the earlier ones):

* dense convolution: ``nr`` (output channels per register tile: one or two vectors),
  ``pad_copy`` (the padding written once into a copy of the input, or guards on the border),
  ``tile`` (pixels per register tile: as many as the accumulators leave registers for, at
  most 8 with guards, whose border versions spill beyond that), ``split_panels`` (the
  threads take channel panels, or rows);
* depthwise and pooling: ``lanes`` (channels per register tile: one or two vectors) and
  ``tile`` (pixels).

    space = WindowSpace("conv", shape, isa, threads=2, epilogue=Epilogue(Op.RELU, ()))
    plan = space.plan(space.default())     # the schedule kiln compiles untuned
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kiln.codegen.isa import Isa
from kiln.ir.fused import apply_activation
from kiln.kernels.conv_config import (
    ConvConfig,
    ConvShape,
    conv_shares_dynamically,
    group_lanes,
    panel_within_group,
)
from kiln.kernels.conv_schedule import conv_func, conv_plan, pack_conv_weight
from kiln.kernels.depthwise_schedule import (
    DepthwiseConfig,
    DepthwiseShape,
    depthwise_func,
    depthwise_plan,
    pack_depthwise_weight,
    padding_after,
)
from kiln.kernels.plan import Epilogue, KernelPlan
from kiln.kernels.pool_schedule import PoolShape, pool_func, pool_plan
from kiln.tune.db import workload_key
from kiln.tune.space import STREAMED, Decisions, with_samples

__all__ = ["WindowSpace"]

TILES = (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28)
GUARDED_TILE = 8  # the widest tile with guards (see ConvConfig.default)


@dataclass(frozen=True)
class WindowSpace:
    """One window kernel's schedules: ``kind`` "conv", "depthwise" or "pool", its shape,
    the ISA (vector lanes, registers), the threads, and the activation in its write-back."""

    kind: str
    shape: ConvShape | DepthwiseShape | PoolShape
    isa: Isa
    threads: int
    epilogue: Epilogue | None = None
    name: str = "window"
    # whether 512-bit FMAs run at full rate here (`kiln.cost.machine.full_rate_512`): the
    # convolution's heuristic then takes two rows a tile (`ConvConfig.default`)
    full_rate_512: bool = False
    # whether a model call finds its weights in memory (`kiln.kernels.streaming`): the tuner
    # then times it with the caches evicted, and its records are filed apart
    streamed: bool = False

    @property
    def lanes(self) -> int:
        lanes = max(self.isa.f32_lanes, 4)  # (a scalar build still runs 4-wide loops)
        return group_lanes(self.shape, lanes) if isinstance(self.shape, ConvShape) else lanes

    @property
    def k(self) -> int:
        """Terms per output (the runner scales its tolerance by their square root)."""
        s = self.shape
        taps = s.kernel[0] * s.kernel[1]
        return taps * (s.ci if isinstance(s, ConvShape) else 1)

    @property
    def strided_operands(self) -> tuple[int, ...]:
        """The input, a residual and the output are channels-last (or, the input, strided as
        the kernel reads it): the runner passes them as they are."""
        if isinstance(self.shape, PoolShape):
            return (0, 1)  # x, out
        after_weights = 3 if self.shape.bias else 2  # x, weight, (bias,) (residual,) out
        residual = isinstance(self.shape, ConvShape) and self.shape.residual
        return (0, after_weights, after_weights + 1) if residual else (0, after_weights)

    def names(self) -> tuple[str, ...]:
        if self.kind == "conv":
            return ("nr", "pad_copy", "rows", "tile", "tail_tile", "split_panels")
        return ("lanes", "tile")

    def default(self) -> Decisions:
        if self.kind == "conv":
            cfg = self._conv_default()
            return {"nr": cfg.nr, "pad_copy": cfg.pad_copy, "rows": cfg.rows, "tile": cfg.tile,
                    "tail_tile": cfg.tail_tile, "split_panels": cfg.split_panels}
        cfg = DepthwiseConfig.default(self.shape, self.lanes)  # type: ignore[arg-type]
        return {"lanes": cfg.lanes, "tile": cfg.tile}

    def _conv_default(self) -> ConvConfig:
        return ConvConfig.default(self.shape, self.lanes, self.isa.registers,  # type: ignore
                                  self.threads, self.full_rate_512)

    def candidates(self, name: str, fixed: Mapping[str, Any]) -> tuple[Any, ...]:
        s, lanes = self.shape, self.lanes
        ow = s.out[1]
        channels = s.co if isinstance(s, ConvShape) else s.c
        if name in ("nr", "lanes"):
            widths = (lanes, 2 * lanes) if channels > lanes else (lanes,)
            if isinstance(s, ConvShape):  # (a grouped layer's panels stay in their groups)
                widths = tuple(nr for nr in widths if panel_within_group(s, nr)) or (lanes,)
            return widths
        if name == "pad_copy":
            return (False, True) if any((*s.padding, *padding_after(s))) else (False,)
        if name == "split_panels":
            return (False, True) if self.threads > 1 else (False,)
        if name == "rows":  # output rows a tile (the tile's pixels then fewer a row)
            return (1, 2) if isinstance(s, ConvShape) and s.out[0] >= 2 else (1,)
        if name == "tail_tile":  # (none, or a narrower tile that ends the row exactly)
            tile = fixed["tile"]
            return (0, *(t for t in range(1, tile)
                         if ConvConfig(tile, tail_tile=t).split_at(max(ow, 1))))
        if name != "tile":
            raise KeyError(f"the {self.kind} space has no decision {name!r}")
        vectors = max(fixed.get("nr", fixed.get("lanes", lanes)) // lanes, 1)
        if self.kind == "conv":  # accumulators, the panel's vectors and one broadcast
            largest = (self.isa.registers - vectors - 1) // vectors
            if any((*s.padding, *padding_after(s))) and not fixed["pad_copy"]:
                largest = min(largest, GUARDED_TILE)
            largest = max(largest // fixed["rows"], 1)
        else:  # accumulators, and one vector of input (and of the weights)
            largest = (self.isa.registers - 2) // vectors
        options = {t for t in TILES if t <= min(largest, max(ow, 1))}
        if 0 < ow <= largest:
            options.add(ow)
        default = self.default()
        if all(fixed.get(n) == default[n] for n in self.names()[:self.names().index("tile")]):
            options.add(default["tile"])
        return tuple(sorted(options or {1}))

    def config(self, decisions: Mapping[str, Any]) -> ConvConfig | DepthwiseConfig:
        if self.kind == "conv":
            assert isinstance(self.shape, ConvShape)
            return ConvConfig(decisions["tile"], decisions["nr"], decisions["split_panels"],
                              decisions["pad_copy"], decisions["rows"],
                              dynamic=conv_shares_dynamically(self.shape),
                              lanes=self.lanes, tail_tile=decisions["tail_tile"])
        return DepthwiseConfig(decisions["tile"], decisions["lanes"])

    def plan(self, decisions: Mapping[str, Any]) -> KernelPlan:
        return with_samples(self.plan_config(self.config(decisions)), self, decisions)

    def plan_config(self, cfg: ConvConfig | DepthwiseConfig) -> KernelPlan:
        """The plan of one configuration, without recorded decisions (the untuned compile)."""
        if self.kind == "conv":
            return conv_plan(self.shape, cfg, self.name, self.epilogue)  # type: ignore
        if self.kind == "depthwise":
            return depthwise_plan(self.shape, cfg, self.name, self.epilogue)  # type: ignore
        return pool_plan(self.shape, cfg, self.name)  # type: ignore[arg-type]

    def workload(self) -> str:
        """The structural hash of the unscheduled program (the default's weight layout), and
        of the epilogue, which runs as a post-pass."""
        nr = self.default()["nr"] if self.kind == "conv" else 0
        return _window_workload(self.kind, self.shape, nr, repr(self.epilogue)) \
            + (STREAMED if self.streamed else "")

    def operands(self, decisions: Mapping[str, Any], gen: torch.Generator
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Random operands in the kernel's parameter order (the input and output
        channels-last, or the input with the strides the kernel reads it with; the weight
        packed for this point), and the expected output."""
        s = self.shape
        cl = torch.channels_last
        channels = s.ci if isinstance(s, ConvShape) else s.c
        x = torch.randn(s.n, channels, s.h, s.w, generator=gen).contiguous(memory_format=cl)
        x_strides = getattr(s, "x_strides", None)
        if x_strides is not None:  # a convolution that reads its NCHW input in place
            x = torch.empty_strided(x.shape, x_strides).copy_(x)
        out_channels = s.co if isinstance(s, ConvShape) else s.c
        out = torch.empty(s.n, out_channels, *s.out).contiguous(memory_format=cl)
        if isinstance(s, PoolShape):
            expected = F.max_pool2d(x, s.kernel, s.stride, s.padding, s.dilation) \
                if s.kind == "max" else \
                F.avg_pool2d(x, s.kernel, s.stride, s.padding,
                             count_include_pad=s.count_include_pad,
                             divisor_override=s.divisor_override)
            return [x, out], [expected]
        groups = s.groups if isinstance(s, ConvShape) else s.c
        weight = torch.randn(out_channels, channels // groups, *s.kernel, generator=gen)
        bias = torch.randn(out_channels, generator=gen) if s.bias else None
        padded, padding = x, s.padding
        if not isinstance(s, PoolShape) and s.padding_after is not None:
            (top, left), (bottom, right) = s.padding, s.padding_after
            padded, padding = F.pad(x, (left, right, top, bottom)), (0, 0)
        expected = F.conv2d(padded, weight, bias, s.stride, padding, s.dilation, groups)
        residual = []
        if isinstance(s, ConvShape) and s.residual:
            residual = [torch.randn(out.shape, generator=gen).contiguous(memory_format=cl)]
            expected = expected + residual[0]
        if self.epilogue is not None:
            apply_activation(expected, self.epilogue.activation, self.epilogue.args)
        packed = pack_conv_weight(weight, decisions["nr"]) if isinstance(s, ConvShape) \
            else pack_depthwise_weight(weight)
        return [x, packed, *([bias] if bias is not None else []), *residual, out], [expected]


@functools.lru_cache(maxsize=256)
def _window_workload(kind: str, shape: Any, nr: int, epilogue: str) -> str:
    program = conv_func(shape, nr) if kind == "conv" else \
        depthwise_func(shape) if kind == "depthwise" else pool_func(shape)
    return workload_key(program) + hashlib.sha256(f"{kind} {epilogue}".encode()).hexdigest()[:8]
