"""kiln op -> ONNX (opset 17): activations, contractions with their epilogues, normalizations,
pooling and embedding.

A fused kiln op becomes its standard sequence, or with ``contrib_ops`` the com.microsoft op
that ONNX Runtime runs as one kernel where one computes exactly that:

    %y = conv_act(%x, %w, %b, %r) {relu}   Relu(Add(Conv(x, w, b), r))  | FusedConv(x, w, b, r)
    %y = addmm_act(%b, %x, %w) {relu}      Relu(Gemm(x, w, b))          | FusedGemm(x, w, b)
    %y = addmm_act(%b, %x, %w) {gelu}      Gelu as Erf arithmetic       | BiasGelu(MatMul(x, w), b)
    %y = gelu(%x) {tanh}                   0.5 x (1 + tanh(...))         | FastGelu(x)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kiln.export.onnx_builder import CONTRIB_DOMAIN
from kiln.export.onnx_context import EmitContext, EmitterTable
from kiln.export.onnx_ops import reduce
from kiln.ir.ops import Op
from kiln.ir.types import DType

Names = Sequence[str]

# activations ONNX Runtime's FusedConv and FusedGemm apply themselves (its contrib op spec)
_FUSED_CONV_ACTIVATIONS = {Op.RELU: "Relu", Op.SIGMOID: "Sigmoid", Op.TANH: "Tanh",
                           Op.LEAKY_RELU: "LeakyRelu", Op.CLAMP: "Clip"}
_FUSED_GEMM_ACTIVATIONS = {Op.RELU: "Relu", Op.SIGMOID: "Sigmoid", Op.TANH: "Tanh",
                           Op.LEAKY_RELU: "LeakyRelu"}


# -- activations -------------------------------------------------------------------------------

def activation(ctx: EmitContext, x: str, op: Op, args: tuple[Any, ...], dtype: DType) -> str:
    """``op`` (an activation, with its fused ``args``) applied to the ONNX value ``x``."""
    if op in (Op.RELU, Op.SIGMOID, Op.TANH):
        return ctx.one({Op.RELU: "Relu", Op.SIGMOID: "Sigmoid", Op.TANH: "Tanh"}[op], [x])
    if op is Op.LEAKY_RELU:
        return ctx.one("LeakyRelu", [x], alpha=float(args[0]))
    if op is Op.CLAMP:
        low, high = (("" if v is None else ctx.literal(v, dtype)) for v in args)
        return ctx.one("Clip", [x, low, high])
    if op is Op.GELU:
        return _gelu(ctx, x, args[0], dtype)
    if op is Op.HARDSWISH:
        return ctx.one("HardSwish", [x])
    raise ctx.fail(f"activation {op.text} has no ONNX form in kiln")


def _gelu(ctx: EmitContext, x: str, approximate: str, dtype: DType) -> str:
    """ATen's gelu: x/2 (1 + erf(x/sqrt 2)), or with "tanh" x/2 (1 + tanh(sqrt(2/pi) (x +
    0.044715 x^3))); ONNX Runtime's optimizer recognizes both sequences."""
    if ctx.contrib:
        op_type = "Gelu" if approximate == "none" else "FastGelu"
        return ctx.one(op_type, [x], domain=CONTRIB_DOMAIN)
    if approximate == "none":
        inner = ctx.one("Erf", [ctx.one("Mul", [x, ctx.literal(math.sqrt(0.5), dtype)])])
    else:
        cube = ctx.one("Mul", [ctx.one("Mul", [x, x]), x])
        poly = ctx.one("Add", [x, ctx.one("Mul", [cube, ctx.literal(0.044715, dtype)])])
        scaled = ctx.one("Mul", [poly, ctx.literal(math.sqrt(2 / math.pi), dtype)])
        inner = ctx.one("Tanh", [scaled])
    one_plus = ctx.one("Add", [inner, ctx.literal(1.0, dtype)])
    return ctx.one("Mul", [ctx.one("Mul", [x, ctx.literal(0.5, dtype)]), one_plus])


def _activation_node(ctx: EmitContext) -> Names:
    x = ctx.operand(0, ctx.out_dtype)
    a = ctx.attrs
    args = {Op.GELU: lambda: (a.approximate,), Op.LEAKY_RELU: lambda: (a.negative_slope,),
            Op.CLAMP: lambda: (a.min, a.max)}.get(ctx.node.op, lambda: ())()
    return [activation(ctx, x, ctx.node.op, args, ctx.out_dtype)]


# -- contractions ------------------------------------------------------------------------------

def _matmul(ctx: EmitContext) -> Names:
    return [ctx.one("MatMul", [ctx.operand(0, ctx.out_dtype), ctx.operand(1, ctx.out_dtype)])]


def _gemm(ctx: EmitContext, *, fused: dict[str, Any] | None = None) -> str:
    """addmm(bias, x, w) = beta bias + alpha (x @ w); beta 0 ignores the bias (even NaN)."""
    a, dtype = ctx.attrs, ctx.out_dtype
    operands = [ctx.operand(1, dtype), ctx.operand(2, dtype)]
    if a.beta != 0:
        operands.append(ctx.operand(0, dtype))
    scales = {"alpha": None if a.alpha == 1 else float(a.alpha),
              "beta": None if a.beta in (0, 1) else float(a.beta)}
    if fused is not None:
        return ctx.one("FusedGemm", operands, domain=CONTRIB_DOMAIN, **scales, **fused)
    return ctx.one("Gemm", operands, **scales)


def _addmm(ctx: EmitContext) -> Names:
    return [_gemm(ctx)]


def _addmm_act(ctx: EmitContext) -> Names:
    a, dtype = ctx.attrs, ctx.out_dtype
    if ctx.contrib:
        contrib = _contrib_addmm_act(ctx)
        if contrib is not None:
            return [contrib]
    return [activation(ctx, _gemm(ctx), a.activation, a.act_args, dtype)]


def _contrib_addmm_act(ctx: EmitContext) -> str | None:
    a, dtype = ctx.attrs, ctx.out_dtype
    if a.activation in _FUSED_GEMM_ACTIVATIONS:
        alpha = float(a.act_args[0]) if a.activation is Op.LEAKY_RELU else None
        return _gemm(ctx, fused={"activation": _FUSED_GEMM_ACTIVATIONS[a.activation],
                                 "activation_alpha": alpha})
    n = ctx.out_type().shape[-1]
    if a.activation is Op.GELU and a.alpha == 1 and a.beta == 1 \
            and ctx.in_type(0).shape == (n,):
        product = ctx.one("MatMul", [ctx.operand(1, dtype), ctx.operand(2, dtype)])
        op_type = "BiasGelu" if a.act_args[0] == "none" else "FastGelu"
        return ctx.one(op_type, [product, ctx.operand(0, dtype)], domain=CONTRIB_DOMAIN)
    return None


def _conv_attributes(ctx: EmitContext, a: Any) -> dict[str, Any]:
    return {"strides": list(a.stride), "pads": list(a.padding) * 2,
            "dilations": list(a.dilation), "group": a.groups,
            "kernel_shape": list(ctx.in_type(1).shape[2:])}


def _convolution(ctx: EmitContext) -> Names:
    a, dtype = ctx.attrs, ctx.out_dtype
    operands = [ctx.operand(i, dtype) for i in range(len(ctx.node.inputs))]
    if a.transposed:
        return [ctx.one("ConvTranspose", operands, output_padding=list(a.output_padding),
                        **_conv_attributes(ctx, a))]
    return [ctx.one("Conv", operands, **_conv_attributes(ctx, a))]


def _conv_act(ctx: EmitContext) -> Names:
    """conv_act(x, w[, bias][, residual]): convolution, + residual, then the activation."""
    a, dtype = ctx.attrs, ctx.out_dtype
    x, w = ctx.operand(0, dtype), ctx.operand(1, dtype)
    bias = ctx.operand(2, dtype) if a.has_bias else ""
    residual = ctx.operand(2 + int(a.has_bias), dtype) if a.has_residual else ""
    if ctx.contrib and a.activation in _FUSED_CONV_ACTIVATIONS:
        params = None
        if a.activation is Op.LEAKY_RELU:
            params = [float(a.act_args[0])]
        elif a.activation is Op.CLAMP:
            low, high = a.act_args
            params = [-math.inf if low is None else float(low),
                      math.inf if high is None else float(high)]
        operands = [x, w, bias] + ([residual] if residual else [])
        return [ctx.one("FusedConv", operands, domain=CONTRIB_DOMAIN,
                        activation=_FUSED_CONV_ACTIVATIONS[a.activation],
                        activation_params=params, **_conv_attributes(ctx, a))]
    y = ctx.one("Conv", [x, w] + ([bias] if bias else []), **_conv_attributes(ctx, a))
    if residual:
        y = ctx.one("Add", [y, residual])
    if a.activation is not None:
        y = activation(ctx, y, a.activation, a.act_args, dtype)
    return [y]


def _embedding(ctx: EmitContext) -> Names:
    return [ctx.one("Gather", [ctx.operand(0), ctx.operand(1)], axis=0)]


# -- normalizations ----------------------------------------------------------------------------

def _softmax(op_type: str) -> Any:
    def emit(ctx: EmitContext) -> Names:
        rank = max(ctx.in_type(0).rank, 1)
        return [ctx.one(op_type, [ctx.operand(0)], axis=ctx.attrs.dim % rank)]
    return emit


def _layer_norm(ctx: EmitContext) -> Names:
    """native_layer_norm's (y, mean, rstd) are LayerNormalization's (Y, Mean, InvStdDev)."""
    a = ctx.attrs
    outputs = 3 if ctx.reads(1) or ctx.reads(2) else 1
    names = ctx.b.add("LayerNormalization", [ctx.operand(i) for i in range(3)], ctx.hint,
                      outputs=outputs, axis=-len(a.normalized_shape), epsilon=float(a.eps))
    return names + [""] * (3 - outputs)


def _batch_norm(ctx: EmitContext) -> Names:
    return [ctx.one("BatchNormalization", [ctx.operand(i) for i in range(5)],
                    epsilon=float(ctx.attrs.eps))]


# -- pooling -----------------------------------------------------------------------------------

def _overrun(size: int, kernel: int, stride: int, pad: int, dilation: int, out: int) -> int:
    """How far ATen's ceil-mode windows reach past the end padding: ONNX gets that as extra
    end padding with ceil_mode=0, which gives ATen's output size whatever ONNX's rule."""
    reach = (out - 1) * stride + dilation * (kernel - 1) + 1
    return max(0, reach - (size + 2 * pad))


def _batched(ctx: EmitContext, x: str) -> str:
    """ATen's 2-d pooling takes (C, H, W) too; ONNX's wants (N, C, H, W)."""
    if ctx.in_type(0).rank == 4:
        return x
    return ctx.one("Unsqueeze", [x, ctx.b.ints([0], "axes")])


def _unbatched(ctx: EmitContext, y: str) -> str:
    if ctx.in_type(0).rank == 4:
        return y
    return ctx.one("Squeeze", [y, ctx.b.ints([0], "axes")])


def _max_pool(ctx: EmitContext) -> Names:
    a = ctx.attrs
    sizes, outs = ctx.in_type(0).shape[-2:], ctx.out_type(0).shape[-2:]
    extra = [_overrun(*args) for args in zip(sizes, a.kernel, a.stride, a.padding, a.dilation,
                                             outs)]
    pads = list(a.padding) + [p + e for p, e in zip(a.padding, extra)]
    with_indices = ctx.reads(1)
    names = ctx.b.add("MaxPool", [_batched(ctx, ctx.operand(0))], ctx.hint,
                      outputs=2 if with_indices else 1, kernel_shape=list(a.kernel),
                      strides=list(a.stride), pads=pads, dilations=list(a.dilation))
    values = _unbatched(ctx, names[0])
    if not with_indices:
        return [values, ""]
    # ONNX counts indices over the whole tensor, ATen within each (H, W) plane
    plane = ctx.b.literal(sizes[0] * sizes[1], DType.I64, "plane")
    return [values, _unbatched(ctx, ctx.one("Mod", [names[1], plane]))]


def _avg_pool(ctx: EmitContext) -> Names:
    """ATen divides by the window clipped to input + padding (count_include_pad) or to the
    input, or by ``divisor_override``; explicit zero padding makes ONNX count the same."""
    a = ctx.attrs
    sizes, outs = ctx.in_type(0).shape[-2:], ctx.out_type().shape[-2:]
    extra = [_overrun(n, k, s, p, 1, o)
             for n, k, s, p, o in zip(sizes, a.kernel, a.stride, a.padding, outs)]
    x = _batched(ctx, ctx.operand(0))
    fixed = a.divisor_override is not None
    if fixed or (a.count_include_pad and any(extra)):
        ends = [p + e for p, e in zip(a.padding, extra)] if fixed else list(a.padding)
        zero_pads = [0, 0, *a.padding, 0, 0, *ends]
        x = ctx.one("Pad", [x, ctx.b.ints(zero_pads, "pads"), ctx.literal(0.0)],
                    mode="constant")
        pads, include = [0, 0] + ([0, 0] if fixed else extra), int(fixed)
    else:
        pads = list(a.padding) + [p + e for p, e in zip(a.padding, extra)]
        include = int(a.count_include_pad)
    y = ctx.one("AveragePool", [x], kernel_shape=list(a.kernel), strides=list(a.stride),
                pads=pads, count_include_pad=include)
    if fixed:
        y = ctx.one("Mul", [y, ctx.literal(a.kernel[0] * a.kernel[1] / a.divisor_override)])
    return [_unbatched(ctx, y)]


def _adaptive_avg_pool(ctx: EmitContext) -> Names:
    """Window i along a dimension of size n into m: [floor(i n / m), ceil((i + 1) n / m)).
    The windows are products of one range per dimension, so the mean can go one dimension
    at a time."""
    shape, outs = ctx.in_type(0).shape, ctx.out_type().shape[-2:]
    rank = len(shape)
    axes = [rank - 2, rank - 1]
    x = ctx.operand(0)
    if tuple(outs) == (1, 1):
        return [reduce(ctx, "ReduceMean", x, axes, True)]
    sizes = shape[-2:]
    if rank == 4 and all(n % m == 0 for n, m in zip(sizes, outs)):
        kernel = [n // m for n, m in zip(sizes, outs)]
        return [ctx.one("AveragePool", [x], kernel_shape=kernel, strides=kernel)]
    for axis, n, m in zip(axes, sizes, outs):
        if n == m:
            continue
        pieces = []
        for i in range(m):
            start, end = (i * n) // m, -((-(i + 1) * n) // m)
            b = ctx.b
            window = ctx.one("Slice", [x, b.ints([start], "starts"), b.ints([end], "ends"),
                                       b.ints([axis], "axes")])
            pieces.append(reduce(ctx, "ReduceMean", window, [axis], True))
        x = ctx.one("Concat", pieces, axis=axis)
    return [x]


EMITTERS: EmitterTable = {
    Op.GELU: _activation_node,
    Op.LEAKY_RELU: _activation_node,
    Op.HARDSWISH: _activation_node,
    Op.CLAMP: _activation_node,
    Op.MM: _matmul,
    Op.BMM: _matmul,
    Op.ADDMM: _addmm,
    Op.ADDMM_ACT: _addmm_act,
    Op.CONVOLUTION: _convolution,
    Op.CONV_ACT: _conv_act,
    Op.EMBEDDING: _embedding,
    Op.SOFTMAX: _softmax("Softmax"),
    Op.LOG_SOFTMAX: _softmax("LogSoftmax"),
    Op.LAYER_NORM: _layer_norm,
    Op.BATCH_NORM: _batch_norm,
    Op.MAX_POOL2D: _max_pool,
    Op.AVG_POOL2D: _avg_pool,
    Op.ADAPTIVE_AVG_POOL2D: _adaptive_avg_pool,
}
