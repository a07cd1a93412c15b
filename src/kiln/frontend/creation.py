"""ATen's creation ops -> kiln's FULL and ARANGE: zeros, ones, full, fill, the ``*_like`` forms,
scalar_tensor and arange, with the shape and dtype the capture recorded. A call that asks
for another layout, device or pinned memory stays an ATen call (`kiln.frontend.aten`)."""

from __future__ import annotations

import sys
from typing import Any

import torch

from kiln.frontend.aten import Context, converts
from kiln.ir import attrs as A
from kiln.ir.graph import Value
from kiln.ir.ops import Op

aten = torch.ops.aten


def _creation_ok(ctx: Context, layout: Any, device: Any, pin_memory: Any) -> bool:
    return (layout in (None, torch.strided) and not pin_memory
            and (device is None or torch.device(device) == ctx.device))


@converts(aten.full.default)
def _full(ctx: Context, size: Any, fill_value: Any, *, dtype: Any = None, layout: Any = None,
          device: Any = None, pin_memory: Any = None) -> Any:
    if not _creation_ok(ctx, layout, device, pin_memory):
        return None
    out = ctx.out_types[0]
    return ctx.emit(Op.FULL, attrs=A.FullAttrs(out.shape, fill_value, out.dtype))


_FILLS = {aten.zeros.default: 0, aten.ones.default: 1, aten.new_zeros.default: 0,
          aten.new_ones.default: 1, aten.new_empty.default: 0}  # (unspecified: zeros)


@converts(*_FILLS)
def _fill(ctx: Context, *sizes: Any, dtype: Any = None, layout: Any = None, device: Any = None,
          pin_memory: Any = None) -> Any:
    """zeros / ones (size) and new_zeros / new_ones (x, size): the shape and dtype captured."""
    if not _creation_ok(ctx, layout, device, pin_memory):
        return None
    out = ctx.out_types[0]
    return ctx.emit(Op.FULL, attrs=A.FullAttrs(out.shape, _FILLS[ctx.target], out.dtype))


@converts(aten.fill.Scalar)
def _fill_scalar(ctx: Context, x: Value, value: Any) -> Any:
    """x.fill_(value), functionalized: a new tensor of x's shape and dtype."""
    out = ctx.out_types[0]
    return ctx.emit(Op.FULL, attrs=A.FullAttrs(out.shape, value, out.dtype))


@converts(aten.fill.Tensor)
def _fill_tensor(ctx: Context, x: Value, value: Value) -> Any:
    """x.fill_(value) with a 0-d tensor of x's dtype: ones times the value (exact for every
    value, -0 and NaN included, where zeros plus it would turn -0 into +0)."""
    if value.type.shape != () or value.type.dtype is not x.type.dtype:
        return None
    out = ctx.out_types[0]
    (ones,) = ctx.emit(Op.FULL, attrs=A.FullAttrs(out.shape, 1, out.dtype))
    return ctx.emit(Op.MUL, ones, value)


@converts(aten.full_like.default)
def _full_like(ctx: Context, x: Value, fill_value: Any, *, dtype: Any = None, layout: Any = None,
               device: Any = None, pin_memory: Any = None, memory_format: Any = None) -> Any:
    if not _creation_ok(ctx, layout, device, pin_memory) or memory_format not in (
            None, torch.preserve_format, torch.contiguous_format):
        return None  # channels-last strides: kiln's FULL is contiguous
    out = ctx.out_types[0]  # x's shape; x's dtype unless dtype says otherwise
    return ctx.emit(Op.FULL, attrs=A.FullAttrs(out.shape, fill_value, out.dtype))


@converts(aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default)
def _fill_like(ctx: Context, x: Value, *, dtype: Any = None, layout: Any = None,
               device: Any = None, pin_memory: Any = None, memory_format: Any = None) -> Any:
    # (empty_like's values are unspecified: zeros are some)
    value = 1 if ctx.target is aten.ones_like.default else 0  # type: ignore[attr-defined]
    return _full_like(ctx, x, value, dtype=dtype, layout=layout, device=device,
                      pin_memory=pin_memory, memory_format=memory_format)


@converts(aten.scalar_tensor.default)
def _scalar_tensor(ctx: Context, value: Any, *, dtype: Any = None, layout: Any = None,
                   device: Any = None, pin_memory: Any = None) -> Any:
    if not _creation_ok(ctx, layout, device, pin_memory):
        return None
    return ctx.emit(Op.FULL, attrs=A.FullAttrs((), value, ctx.out_types[0].dtype))


@converts(aten.arange.start_step, aten.arange.start, aten.arange.default)
def _arange(ctx: Context, *bounds: Any, dtype: Any = None, layout: Any = None,
            device: Any = None, pin_memory: Any = None) -> Any:
    if not _creation_ok(ctx, layout, device, pin_memory):
        return None
    start, end, step = (0, bounds[0], 1) if len(bounds) == 1 else (
        bounds[0], bounds[1], bounds[2] if len(bounds) > 2 else 1)
    if end is None or end == sys.maxsize:
        return None
    return ctx.emit(Op.ARANGE, attrs=A.ArangeAttrs(start, end, step, ctx.out_types[0].dtype))
