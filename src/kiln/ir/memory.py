"""A tensor laid out in the order of its memory, for reductions over all of it.

A reduction over every element (min and max, ``isfinite().all()``) has the same answer in
any order, and reads memory fastest in the memory's own order. A transposed view reduced
in its logical order strides across memory: aminmax of a Linear weight's transpose,
[768, 3072] (2 threads, an AVX-512 Xeon), 8.2 ms, against 0.44 ms over the same memory in
order; aminmax of Llama's Q, K and V at 1024 tokens, heads split out and transposed, 486 ->
89 us.
"""

from __future__ import annotations

import torch

__all__ = ["in_memory_order"]


def in_memory_order(x: torch.Tensor) -> torch.Tensor:
    """``x`` with its dims permuted into the order of its strides, where that makes it
    contiguous (a transposed weight; heads split out of a projection and transposed:
    [B, L, H, E] again). Otherwise ``x`` itself."""
    order = sorted(range(x.dim()), key=lambda d: -x.stride(d))
    laid = x.permute(order)
    return laid if laid.is_contiguous() else x
