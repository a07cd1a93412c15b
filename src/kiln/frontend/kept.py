"""ATen ops a capture keeps whole: not decomposed, each then one opaque call of ATen's kernel
(`kiln.frontend.export` and `kiln.frontend.dynamo` drop them from torch's decomposition tables
and trace inside `traced_whole`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch._C import DispatchKey

__all__ = ["KEPT_WHOLE", "traced_whole"]

aten = torch.ops.aten

# ATen's fused attention, which eager runs too, where the math form adds a guard of three
# opaque calls to each softmax;
KEPT_WHOLE = (aten.scaled_dot_product_attention.default,
              aten._scaled_dot_product_flash_attention_for_cpu.default,
              # and scatters, which kiln can write into their base's memory where nothing
              # reads it after (kiln.runtime.scatters), where their decomposition (a where
              # over the whole base) reads and writes all of it
              aten.select_scatter.default, aten.slice_scatter.default,
              # and F.unfold / F.fold, views where patches tile the image
              # (kiln.frontend.patches), whose decomposition gathers and scatters
              aten.im2col.default, aten.col2im.default,
              # and bilinear and nearest upsampling (segmentation and depth heads), whose
              # decomposition is four opaque index gathers and their blend: 4x eager's time
              # (ZoeDepth's eight 384x384 upsamplings 300 ms against 92)
              aten.upsample_bilinear2d.default, aten.upsample_bilinear2d.vec,
              aten.upsample_nearest2d.default, aten.upsample_nearest2d.vec,
              aten.upsample_bicubic2d.default, aten.upsample_bicubic2d.vec,  # (YOLOS's 32
              # gathers of its position embeddings)
              aten.upsample_linear1d.default, aten.upsample_linear1d.vec,  # (SAM's and
              # SegGPT's relative positions: 16 gathers)
              # and roll (Swin's shifted windows) and reflection and replication padding
              # (super-resolution and vocoder convolutions), whose decompositions are an
              # index gather per dimension; kiln converts none of them, and one left in the
              # single trace made `kiln.frontend.export.capture` trace the model a second
              # time through the whole decomposition table (Swin2SR: 36 rolls and a
              # reflection pad, ~10 s of its capture)
              aten.roll.default,
              aten.reflection_pad1d.default, aten.reflection_pad2d.default,
              aten.reflection_pad3d.default, aten.replication_pad1d.default,
              aten.replication_pad2d.default, aten.replication_pad3d.default,
              # and weight normalization (wav2vec2's positional convolution, vocoders): a
              # function of constants, which folding then computes once, as it does the
              # decomposition, without the second trace
              aten._weight_norm_interface.default,
              # and softplus (Mamba's step sizes), whose decomposition holds log1p, which
              # kiln does not model either, and tril / triu (masks), a comparison of iotas
              # decomposed: one ATen kernel each, as eager, and no second trace
              aten.softplus.default, aten.tril.default, aten.triu.default,
              # and the rest the sweeps' models left to the table: log-sum-exp (Reformer),
              # log-sigmoid (xLSTM), all (RT-DETR), index_add, and the constants linspace
              # and eye, which folding computes
              aten.logsumexp.default, aten.log_sigmoid_forward.default, aten.all.dim,
              aten.index_add.default, aten.linspace.default, aten.eye.default)


@contextlib.contextmanager
def traced_whole(ops: Sequence[Any] = KEPT_WHOLE) -> Iterator[None]:
    """A trace to ATen that keeps ``ops`` as they are called: torch registers Python
    decompositions for some of them (the upsamplings) that run below autograd while tracing,
    whatever decomposition table the trace is given; they are set aside for the trace, and
    only their shape (Meta) rules stay."""
    keys = (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd)
    saved = [(op, key, op.py_kernels.pop(key)) for op in ops for key in keys
             if key in getattr(op, "py_kernels", {})]
    _forget_dispatch(op for op, _, _ in saved)
    try:
        yield
    finally:
        for op, key, kernel in saved:
            op.py_kernels[key] = kernel
        _forget_dispatch(op for op, _, _ in saved)


def _forget_dispatch(ops: Iterable[Any]) -> None:
    for op in ops:  # (an overload caches the kernel each dispatch key resolved to)
        cache = getattr(op, "_dispatch_cache", None)
        if cache is not None:
            cache.clear()
