"""Neural-network ops: MatMul, Gemm, convolutions, pooling, normalizations."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kiln.frontend.onnx.optable import Decline, NodeCall, axis_of, onnx_op


@onnx_op("MatMul")
def _matmul(n: NodeCall, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype != b.dtype or a.dim() == 0 or b.dim() == 0:
        raise Decline("MatMul of mixed types or of a scalar")
    return torch.matmul(a, b)


@onnx_op("Gemm")
def _gemm(n: NodeCall, a: torch.Tensor, b: torch.Tensor,
          c: torch.Tensor | None = None) -> torch.Tensor:
    """Y = alpha * A' @ B' + beta * C, A' = A.T if transA, B' = B.T if transB."""
    if not a.dtype.is_floating_point or a.dtype != b.dtype:
        raise Decline("Gemm of integers or of mixed types")
    a = a.t() if n.attr("transA", 0) else a
    b = b.t() if n.attr("transB", 0) else b
    alpha, beta = n.attr("alpha", 1.0), n.attr("beta", 1.0)
    y = torch.mm(a, b)
    if alpha != 1.0:
        y = y * alpha
    if c is not None and beta != 0.0:
        y = y + (c if beta == 1.0 else c * beta)
    return y


def _spatial(n: NodeCall, x: torch.Tensor, kernel: list[int]) -> tuple[list[int], list[int],
                                                                       list[int]]:
    """(strides, dilations, [begin..., end...] pads) with auto_pad resolved."""
    rank = len(kernel)
    strides = list(n.attr("strides") or [1] * rank)
    dilations = list(n.attr("dilations") or [1] * rank)
    auto_pad = n.attr("auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", "VALID"):
        pads = list(n.attr("pads") or [0] * (2 * rank)) if auto_pad == "NOTSET" else [0] * (
            2 * rank)
        return strides, dilations, pads
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise Decline(f"auto_pad {auto_pad}")
    begin, end = [], []
    for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations):
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small = total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else total - small)
        end.append(total - begin[-1])
    return strides, dilations, begin + end


def _pad_for(x: torch.Tensor, pads: list[int], value: float = 0.0,
             ) -> tuple[torch.Tensor, list[int]]:
    """Symmetric pads go to the op; asymmetric ones are applied here, first."""
    rank = len(pads) // 2
    begin, end = pads[:rank], pads[rank:]
    if begin == end:
        return x, begin
    torch_pads: list[int] = []
    for b, e in zip(reversed(begin), reversed(end)):
        torch_pads += [b, e]
    return F.pad(x, torch_pads, value=value), [0] * rank


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


@onnx_op("Conv")
def _conv(n: NodeCall, x: torch.Tensor, w: torch.Tensor,
          b: torch.Tensor | None = None) -> torch.Tensor:
    rank = w.dim() - 2
    if rank not in _CONV or not x.dtype.is_floating_point:
        raise Decline(f"a {rank}-d or non-float convolution")
    kernel = list(n.attr("kernel_shape") or w.shape[2:])
    if kernel != list(w.shape[2:]):
        raise Decline("kernel_shape differs from the weight's")
    strides, dilations, pads = _spatial(n, x, kernel)
    x, padding = _pad_for(x, pads)
    return _CONV[rank](x, w, b, strides, padding, dilations, n.attr("group", 1))


_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


@onnx_op("ConvTranspose")
def _conv_transpose(n: NodeCall, x: torch.Tensor, w: torch.Tensor,
                    b: torch.Tensor | None = None) -> torch.Tensor:
    rank = w.dim() - 2
    if rank not in _CONV_T or n.attr("output_shape") is not None or n.attr(
            "auto_pad", "NOTSET") != "NOTSET":
        raise Decline("ConvTranspose with output_shape or auto_pad")
    kernel = list(n.attr("kernel_shape") or w.shape[2:])
    if kernel != list(w.shape[2:]):
        raise Decline("kernel_shape differs from the weight's")
    strides = list(n.attr("strides") or [1] * rank)
    dilations = list(n.attr("dilations") or [1] * rank)
    pads = list(n.attr("pads") or [0] * (2 * rank))
    if pads[:rank] != pads[rank:]:
        raise Decline("asymmetric ConvTranspose pads")
    out_pad = list(n.attr("output_padding") or [0] * rank)
    return _CONV_T[rank](x, w, b, strides, pads[:rank], out_pad, n.attr("group", 1), dilations)


def _pool_sizes_agree(x: torch.Tensor, kernel: list[int], strides: list[int],
                      pads: list[int], dilations: list[int]) -> bool:
    """ceil_mode: torch drops a last window that starts in the end padding, ONNX (before
    opset 19) keeps it; only use torch where the two agree on the output size."""
    rank = len(kernel)
    for i, (size, k, s, d) in enumerate(zip(x.shape[2:], kernel, strides, dilations)):
        span = size + pads[i] + pads[rank + i] - ((k - 1) * d + 1)
        onnx_size = math.ceil(span / s) + 1
        torch_size = onnx_size - 1 if (onnx_size - 1) * s >= size + pads[i] else onnx_size
        if onnx_size != torch_size:
            return False
    return True


_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _pool_args(n: NodeCall, x: torch.Tensor) -> tuple[list[int], list[int], list[int],
                                                      list[int], bool]:
    kernel = list(n.attr("kernel_shape"))
    if len(kernel) not in _MAX_POOL or len(kernel) != x.dim() - 2:
        raise Decline(f"{len(kernel)}-d pooling")
    strides, dilations, pads = _spatial(n, x, kernel)
    ceil = bool(n.attr("ceil_mode", 0))
    if ceil and not _pool_sizes_agree(x, kernel, strides, pads, dilations):
        raise Decline("ceil_mode where torch and ONNX disagree on the last window")
    return kernel, strides, dilations, pads, ceil


@onnx_op("MaxPool")
def _max_pool(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    if n.wants(1) or n.attr("storage_order", 0) or not x.dtype.is_floating_point:
        raise Decline("MaxPool indices output, or not floats")
    kernel, strides, dilations, pads, ceil = _pool_args(n, x)
    x, padding = _pad_for(x, pads, value=-math.inf)
    return _MAX_POOL[len(kernel)](x, kernel, strides, padding, dilations, ceil_mode=ceil)


@onnx_op("AveragePool")
def _average_pool(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    kernel, strides, dilations, pads, ceil = _pool_args(n, x)
    rank = len(kernel)
    if any(d != 1 for d in dilations) or pads[:rank] != pads[rank:] or ceil:
        raise Decline("dilated, asymmetrically padded or ceil_mode AveragePool")
    include = bool(n.attr("count_include_pad", 0))
    return _AVG_POOL[rank](x, kernel, strides, pads[:rank], False, include)


@onnx_op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    dims = list(range(2, x.dim()))
    if n.op_type == "GlobalAveragePool":
        return torch.mean(x, dims, keepdim=True)
    return torch.amax(x, dims, keepdim=True)


@onnx_op("BatchNormalization")
def _batch_norm(n: NodeCall, x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    if n.attr("training_mode", 0) or n.num_outputs > 1:
        raise Decline("BatchNormalization in training mode")
    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, n.attr("epsilon", 1e-5))


@onnx_op("InstanceNormalization")
def _instance_norm(n: NodeCall, x: torch.Tensor, scale: torch.Tensor,
                   bias: torch.Tensor) -> torch.Tensor:
    return F.instance_norm(x, weight=scale, bias=bias, eps=n.attr("epsilon", 1e-5))


@onnx_op("LayerNormalization")
def _layer_norm(n: NodeCall, x: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    if n.wants(1) or n.wants(2) or not x.dtype.is_floating_point:
        raise Decline("LayerNormalization mean / inverse std outputs")
    axis = axis_of(n.attr("axis", -1), x.dim())
    shape = tuple(x.shape[axis:])
    scale = scale.expand(shape) if tuple(scale.shape) != shape else scale
    if bias is not None and tuple(bias.shape) != shape:
        bias = bias.expand(shape)
    return F.layer_norm(x, shape, scale, bias, n.attr("epsilon", 1e-5))


@onnx_op("LRN")
def _lrn(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    size = n.attr("size")
    if size % 2 == 0:  # torch centres an even window one element differently
        raise Decline("LRN of an even size")
    return F.local_response_norm(x, size, n.attr("alpha", 1e-4), n.attr("beta", 0.75),
                                 n.attr("bias", 1.0))


# Nearest-neighbour coordinate rules under which an integer upscale by s maps output index
# x to input index x // s exactly: asymmetric (x / s) floored, and half-pixel
# ((x + 0.5) / s - 0.5, within 0.5 of x // s) rounded either way.
_NEAREST_BY_REPEAT = {("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"),
                      ("half_pixel", "round_prefer_ceil"),
                      ("pytorch_half_pixel", "round_prefer_floor"),
                      ("pytorch_half_pixel", "round_prefer_ceil")}


@onnx_op("Resize")
def _resize(n: NodeCall, x: torch.Tensor, *rest: torch.Tensor | None) -> torch.Tensor:
    """Nearest upsampling by whole factors only (each pixel repeated); the rest runs as is."""
    rule = (n.attr("coordinate_transformation_mode", "half_pixel"),
            n.attr("nearest_mode", "round_prefer_floor"))
    if n.attr("mode", "nearest") != "nearest" or rule not in _NEAREST_BY_REPEAT or n.attr(
            "axes") is not None or n.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise Decline("Resize other than nearest upsampling by whole factors")
    factors = _resize_factors(n, x)
    for axis, factor in enumerate(factors):
        if factor != 1:
            shape = list(x.shape)
            x = x.unsqueeze(axis + 1).expand(*shape[:axis + 1], factor, *shape[axis + 1:])
            shape[axis] *= factor
            x = x.reshape(shape)
    return x


def _resize_factors(n: NodeCall, x: torch.Tensor) -> list[int]:
    scales = n.value(2)
    if scales is not None and scales.size:
        ratios = [float(s) for s in scales.reshape(-1)]
    else:
        sizes = n.ints(3)
        if not sizes:
            raise Decline("Resize without scales or sizes")
        ratios = [out / size if size else 0.0 for out, size in zip(sizes, x.shape)]
    if len(ratios) != x.dim() or any(r < 1 or r != int(r) for r in ratios):
        raise Decline("Resize by a factor that is not a whole number >= 1")
    return [int(r) for r in ratios]
