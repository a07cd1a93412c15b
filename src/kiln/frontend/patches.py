"""``F.unfold`` / ``F.fold`` (ATen's im2col / col2im) over non-overlapping patches as the
views they are, so kiln sees movement it can plan, fuse and lay out (MobileViT-v2's patches
of 2x2: its decomposition to gathers and an accumulating ``index_put`` ran as opaque calls).

With the kernel equal to the stride, no padding, no dilation and the image a whole number of
patches, every element lands in exactly one patch:

    im2col(x)[n, (c, i, j), (oh, ow)] = x[n, c, oh*kh + i, ow*kw + j]
        = reshape(permute(view(x, [N, C, H/kh, kh, W/kw, kw]), [0, 1, 3, 5, 2, 4]),
                  [N, C*kh*kw, H/kh * W/kw])

and col2im, which sums where patches overlap, is the inverse arrangement. Other geometries
stay calls of ATen's kernels (the ops are not decomposed: `kiln.frontend.kept.KEPT_WHOLE`).
"""

from __future__ import annotations

from typing import Any

import torch

from kiln.frontend.aten import Context, converts
from kiln.ir import attrs as A
from kiln.ir.graph import Value
from kiln.ir.ops import Op

aten = torch.ops.aten


def _tiles(kernel: Any, dilation: Any, padding: Any, stride: Any, height: int,
           width: int) -> tuple[int, int] | None:
    """(kh, kw) where patches tile the image exactly, else None."""
    kh, kw = (int(k) for k in kernel)
    if [int(d) for d in dilation] != [1, 1] or [int(p) for p in padding] != [0, 0]:
        return None
    if [int(s) for s in stride] != [kh, kw] or height % kh or width % kw:
        return None
    return kh, kw


def _chain(ctx: Context, x: Value, *steps: tuple[Op, A.Attrs]) -> tuple[Value, ...]:
    for op, attrs in steps:
        (x,) = ctx.emit(op, x, attrs=attrs)
    return (x,)


@converts(aten.im2col.default)
def _im2col(ctx: Context, x: Value, kernel: Any, dilation: Any, padding: Any,
            stride: Any) -> Any:
    if len(x.type.shape) != 4:
        return None
    n, c, h, w = x.type.shape
    tiles = _tiles(kernel, dilation, padding, stride, h, w)
    if tiles is None:
        return None
    kh, kw = tiles
    return _chain(ctx, x,
                  (Op.VIEW, A.ShapeAttrs((n, c, h // kh, kh, w // kw, kw))),
                  (Op.PERMUTE, A.PermuteAttrs((0, 1, 3, 5, 2, 4))),
                  (Op.VIEW, A.ShapeAttrs((n, c * kh * kw, (h // kh) * (w // kw)))))


@converts(aten.col2im.default)
def _col2im(ctx: Context, cols: Value, output_size: Any, kernel: Any, dilation: Any,
            padding: Any, stride: Any) -> Any:
    if len(cols.type.shape) != 3:
        return None
    h, w = (int(s) for s in output_size)
    tiles = _tiles(kernel, dilation, padding, stride, h, w)
    if tiles is None:
        return None
    kh, kw = tiles
    n, rows, patches = cols.type.shape
    if rows % (kh * kw) or patches != (h // kh) * (w // kw):
        return None
    c = rows // (kh * kw)
    return _chain(ctx, cols,
                  (Op.VIEW, A.ShapeAttrs((n, c, kh, kw, h // kh, w // kw))),
                  (Op.PERMUTE, A.PermuteAttrs((0, 1, 4, 2, 5, 3))),
                  (Op.VIEW, A.ShapeAttrs((n, c, h, w))))
