"""``as_strided`` as a gather of its operand's elements, so that its result no longer depends
on how kiln lays the operand out.

``as_strided(x, size, stride)`` reads memory at fixed strides that the model computed from
``x``'s strides at capture (Longformer's overlapping attention chunks). kiln may give ``x``
other strides: a merged projection's piece, an NHWC tensor, a planned buffer. Read through
the captured strides, those would be other elements (Longformer's outputs were off by 0.36).

What the call reads is known at import: laid out as captured, each element it reads is one
of ``x``'s own elements, by its logical position. So it becomes
``embedding(view(x, [numel, 1]), index)`` viewed to ``size``, with ``index`` a weight (or a
plain view where the positions are ``x``'s own order), exact on any layout. A call that reads
memory outside ``x`` (a slice's neighbours) cannot be made exact: that graph runs eagerly.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx

from kiln.ir import attrs as A
from kiln.ir.graph import Value
from kiln.ir.ops import Op

__all__ = ["STRIDED_READS", "OutsideOperand", "as_gather"]

# beyond this many elements of memory spanned, the index is not worth building
MAX_SPAN = 1 << 26


class OutsideOperand(Exception):
    pass


def read_positions(val: torch.Tensor, size: Any, stride: Any, offset: Any) -> torch.Tensor:
    """For each element ``as_strided`` reads, the logical (row-major) position in ``val`` of
    the element at that address, laid out as captured; `OutsideOperand` where there is none."""
    size, stride = [int(s) for s in size], [int(s) for s in stride]
    start = val.storage_offset() if offset is None else int(offset)
    span = 1 + max(_last(val.shape, val.stride(), val.storage_offset()),
                   _last(size, stride, start))
    if span > MAX_SPAN:
        raise OutsideOperand(f"it spans {span} elements of memory")
    base = torch.arange(span)
    inside = base.as_strided(tuple(val.shape), val.stride(), val.storage_offset())
    owner = torch.full((span,), -1, dtype=torch.int64)
    owner[inside.reshape(-1)] = torch.arange(inside.numel())
    read = owner[base.as_strided(size, stride, start)]
    if bool((read < 0).any()):
        raise OutsideOperand("it reads memory outside its operand, which kiln's layouts do "
                             "not keep")
    return read


def _last(shape: Any, stride: Any, offset: int) -> int:
    """The highest address a layout touches (its offset if it has no elements)."""
    if math.prod(shape) == 0:
        return offset
    return offset + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0)


def as_gather(importer: Any, node: torch.fx.Node, x: Value, size: Any, stride: Any,
              storage_offset: Any = None) -> Value:
    val = node.args[0].meta["val"]
    read = read_positions(val, size, stride, storage_offset)
    out_shape = tuple(int(s) for s in size)
    if read.numel() == val.numel() and torch.equal(read.reshape(-1),
                                                   torch.arange(read.numel())):
        return importer.emit(Op.VIEW, x, attrs=A.ShapeAttrs(out_shape))[0]
    (flat,) = importer.emit(Op.VIEW, x, attrs=A.ShapeAttrs((val.numel(), 1)))
    index = importer.b.constant(f"{node.name}.index", read)
    (rows,) = importer.emit(Op.EMBEDDING, flat, index)
    return importer.emit(Op.VIEW, rows, attrs=A.ShapeAttrs(out_shape))[0]


STRIDED_READS = {torch.ops.aten.as_strided.default: as_gather,
                 torch.ops.aten.as_strided_copy.default: as_gather}
