"""kiln op -> ONNX (opset 17): elementwise, reductions, movement and creation ops.

Each row of the table writes one kiln op as standard ONNX nodes that compute what its ATen
meaning (kiln.ir.semantics) computes; where ONNX has no single op, a short sequence:

    %y = rsqrt(%x)                    y = Reciprocal(Sqrt(x))
    %y = var(%x) {dims=(1,), ...}     m = ReduceMean(x); y = ReduceSum((x-m)^2) / (n - correction)
    %y = div(%a, %b) {floor}          ATen's floor division, step by step (ints: (a - a mod b)/b)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from kiln.export.onnx_builder import ONNX_DTYPE, tensor_proto
from kiln.export.onnx_context import EmitContext, EmitterTable, normalized_dims
from kiln.ir.ops import Op
from kiln.ir.types import DType

Names = Sequence[str]


# -- elementwise -------------------------------------------------------------------------------

def _unary(op_type: str) -> object:
    def emit(ctx: EmitContext) -> Names:
        return [ctx.one(op_type, [ctx.operand(0, ctx.out_dtype)])]
    return emit


def _binary(op_type: str) -> object:
    def emit(ctx: EmitContext) -> Names:
        return [ctx.one(op_type, [ctx.operand(0, ctx.out_dtype), ctx.operand(1, ctx.out_dtype)])]
    return emit


def _compare(op_type: str, negate: bool = False) -> object:
    def emit(ctx: EmitContext) -> Names:
        dtype = ctx.promoted(0, 1)
        y = ctx.one(op_type, [ctx.operand(0, dtype), ctx.operand(1, dtype)])
        return [ctx.one("Not", [y]) if negate else y]
    return emit


def _logical(op_type: str) -> object:
    def emit(ctx: EmitContext) -> Names:
        operands = [ctx.operand(i, DType.BOOL) for i in range(len(ctx.node.inputs))]
        return [ctx.one(op_type, operands)]
    return emit


def _rsqrt(ctx: EmitContext) -> Names:
    return [ctx.one("Reciprocal", [ctx.one("Sqrt", [ctx.operand(0, ctx.out_dtype)])])]


def _cast(ctx: EmitContext) -> Names:
    x = ctx.operand(0)  # no implicit cast: this is the cast
    if ctx.in_type(0).dtype is ctx.out_dtype:
        return [x]
    return [ctx.one("Cast", [x], to=ONNX_DTYPE[ctx.out_dtype])]


def _where(ctx: EmitContext) -> Names:
    dtype = ctx.out_dtype
    return [ctx.one("Where", [ctx.operand(0, DType.BOOL), ctx.operand(1, dtype),
                              ctx.operand(2, dtype)])]


def _div(ctx: EmitContext) -> Names:
    dtype, mode = ctx.out_dtype, ctx.attrs.rounding_mode
    a, b = ctx.operand(0, dtype), ctx.operand(1, dtype)
    if mode is None or (mode == "trunc" and not dtype.is_floating):
        return [ctx.one("Div", [a, b])]  # integer Div truncates towards zero
    if mode == "trunc":
        q = ctx.one("Div", [a, b])
        return [ctx.one("Mul", [ctx.one("Sign", [q]), ctx.one("Floor", [ctx.one("Abs", [q])])])]
    if not dtype.is_floating:  # a - (a mod b) is a multiple of b: exact integer division
        return [ctx.one("Div", [ctx.one("Sub", [a, ctx.one("Mod", [a, b], fmod=0)]), b])]
    return [_float_floor_div(ctx, a, b)]


def _float_floor_div(ctx: EmitContext, a: str, b: str) -> str:
    """ATen's floor division of floats (c10's div_floor_floating), which floors the exact
    quotient rather than the rounded one: floor(a / b) would differ near integers."""
    zero, one, half = ctx.literal(0.0), ctx.literal(1.0), ctx.literal(0.5)
    quotient = ctx.one("Div", [a, b])
    mod = ctx.one("Mod", [a, b], fmod=1)
    div = ctx.one("Div", [ctx.one("Sub", [a, mod]), b])
    signs_differ = ctx.one("Xor", [ctx.one("Less", [b, zero]), ctx.one("Less", [mod, zero])])
    adjust = ctx.one("And", [ctx.one("Not", [ctx.one("Equal", [mod, zero])]), signs_differ])
    div = ctx.one("Where", [adjust, ctx.one("Sub", [div, one]), div])
    floor = ctx.one("Floor", [div])
    round_up = ctx.one("Greater", [ctx.one("Sub", [div, floor]), half])
    floor = ctx.one("Where", [round_up, ctx.one("Add", [floor, one]), floor])
    signed_zero = ctx.one("Mul", [quotient, zero])  # copysign(0, a / b)
    result = ctx.one("Where", [ctx.one("Equal", [div, zero]), signed_zero, floor])
    return ctx.one("Where", [ctx.one("Equal", [b, zero]), quotient, result])


# -- reductions --------------------------------------------------------------------------------

def _reduce(op_type: str) -> object:
    def emit(ctx: EmitContext) -> Names:
        x = ctx.operand(0, ctx.out_dtype)  # sum of ints or bools: ATen sums in int64
        axes = normalized_dims(ctx.attrs.dims, ctx.in_type(0).rank)
        if not axes:  # a 0-d tensor: nothing to reduce
            return [x]
        return [reduce(ctx, op_type, x, axes, ctx.attrs.keepdim)]
    return emit


def reduce(ctx: EmitContext, op_type: str, x: str, axes: Sequence[int], keepdim: bool) -> str:
    """Opset 17 takes ReduceSum's axes as an input and the other reductions' as an attribute."""
    if op_type == "ReduceSum":
        return ctx.one(op_type, [x, ctx.b.ints(axes, "axes")], keepdims=int(keepdim))
    return ctx.one(op_type, [x], axes=list(axes), keepdims=int(keepdim))


def _arg_reduce(op_type: str) -> object:
    def emit(ctx: EmitContext) -> Names:
        x, a = ctx.operand(0), ctx.attrs
        rank = ctx.in_type(0).rank
        if a.dim is None or rank == 0:  # over the flattened tensor
            flat = ctx.one("Reshape", [x, ctx.b.ints([-1])])
            index = ctx.one(op_type, [flat], axis=0, keepdims=0)
            if ctx.out_type().shape == ():
                return [index]
            return [ctx.one("Reshape", [index, ctx.b.ints(ctx.out_type().shape)])]
        return [ctx.one(op_type, [x], axis=a.dim % rank, keepdims=int(a.keepdim))]
    return emit


def _var(ctx: EmitContext) -> Names:
    a, shape = ctx.attrs, ctx.in_type(0).shape
    x = ctx.operand(0, ctx.out_dtype)
    axes = normalized_dims(a.dims, len(shape))
    count = math.prod(shape[d] for d in axes)
    mean = reduce(ctx, "ReduceMean", x, axes, True)
    centered = ctx.one("Sub", [x, mean])
    squares = reduce(ctx, "ReduceSum", ctx.one("Mul", [centered, centered]), axes, a.keepdim)
    return [ctx.one("Div", [squares, ctx.literal(max(count - a.correction, 0))])]


# -- movement ----------------------------------------------------------------------------------

def _alias(ctx: EmitContext) -> Names:
    """A copy into some memory layout: ONNX values have no layout, so it is the value itself."""
    return [ctx.operand(0)]


def _reshape(ctx: EmitContext) -> Names:
    shape = ctx.out_type().shape
    allow_zero = 1 if 0 in shape else None  # else a 0 would mean "keep this dimension"
    return [ctx.one("Reshape", [ctx.operand(0), ctx.b.ints(shape, "shape")],
                    allowzero=allow_zero)]


def _expand(ctx: EmitContext) -> Names:
    return [ctx.one("Expand", [ctx.operand(0), ctx.b.ints(ctx.out_type().shape, "shape")])]


def _permute(ctx: EmitContext) -> Names:
    rank = ctx.in_type(0).rank
    if rank == 0:
        return [ctx.operand(0)]
    return [ctx.one("Transpose", [ctx.operand(0)], perm=[d % rank for d in ctx.attrs.dims])]


def _unsqueeze(ctx: EmitContext) -> Names:
    axis = ctx.attrs.dim % (ctx.in_type(0).rank + 1)
    return [ctx.one("Unsqueeze", [ctx.operand(0), ctx.b.ints([axis], "axes")])]


def _slice(ctx: EmitContext) -> Names:
    a = ctx.attrs
    dim = a.dim % ctx.in_type(0).rank
    start, end, _ = slice(a.start, a.end, a.step).indices(ctx.in_type(0).shape[dim])
    end = max(end, start)
    b = ctx.b
    return [ctx.one("Slice", [ctx.operand(0), b.ints([start], "starts"), b.ints([end], "ends"),
                              b.ints([dim], "axes"), b.ints([a.step], "steps")])]


def _select(ctx: EmitContext) -> Names:
    shape = ctx.in_type(0).shape
    dim = ctx.attrs.dim % len(shape)
    index = ctx.b.literal(ctx.attrs.index % shape[dim], DType.I64, "index")
    return [ctx.one("Gather", [ctx.operand(0), index], axis=dim)]


def _split(ctx: EmitContext) -> Names:
    a = ctx.attrs
    axis = a.dim % ctx.in_type(0).rank
    if len(a.sizes) == 1:
        return [ctx.operand(0)]
    return ctx.b.add("Split", [ctx.operand(0), ctx.b.ints(a.sizes, "split")], ctx.hint,
                     outputs=len(a.sizes), axis=axis)


def _cat(ctx: EmitContext) -> Names:
    out = ctx.out_type()
    # ATen skips empty pieces (even 1-d ones beside 4-d tensors); they add nothing
    pieces = [ctx.operand(i, out.dtype) for i, v in enumerate(ctx.node.inputs)
              if v.type.numel > 0]
    if not pieces:
        return [ctx.b.initializer(torch.empty(out.shape, dtype=out.dtype.torch), ctx.hint)]
    if len(pieces) == 1:
        return pieces
    return [ctx.one("Concat", pieces, axis=ctx.attrs.dim % out.rank)]


def _pad(ctx: EmitContext) -> Names:
    """ATen's pad lists (before, after) pairs from the last dimension backwards and may be
    negative (cropping); ONNX gets the crop as a Slice and the rest as a constant Pad."""
    a, shape = ctx.attrs, ctx.in_type(0).shape
    rank = len(shape)
    before, after = [0] * rank, [0] * rank
    for k in range(len(a.pad) // 2):
        before[rank - 1 - k], after[rank - 1 - k] = a.pad[2 * k], a.pad[2 * k + 1]
    x = ctx.operand(0)
    if any(p < 0 for p in before + after):
        starts = [max(-p, 0) for p in before]
        ends = [n - max(-p, 0) for n, p in zip(shape, after)]
        b = ctx.b
        x = ctx.one("Slice", [x, b.ints(starts, "starts"), b.ints(ends, "ends"),
                              b.ints(range(rank), "axes")])
    pads = [max(p, 0) for p in before] + [max(p, 0) for p in after]
    if not any(pads):
        return [x]
    value = ctx.literal(a.value, ctx.out_dtype)
    return [ctx.one("Pad", [x, ctx.b.ints(pads, "pads"), value], mode="constant")]


# -- opaque ATen calls ------------------------------------------------------------------------

def _index_select(ctx: EmitContext) -> Names:
    """index_select(x, dim, index): ONNX import makes it of Gather; a 0-d index keeps dim."""
    _, dim, index_slot = ctx.attrs.args
    index = ctx.operand(index_slot.index)
    if ctx.in_type(index_slot.index).rank == 0:
        index = ctx.one("Unsqueeze", [index, ctx.b.ints([0], "axes")])
    return [ctx.one("Gather", [ctx.operand(0), index], axis=dim % ctx.in_type(0).rank)]


# ATen ops kiln keeps as opaque calls, by overload; any other is an error naming it
CALLS = {
    torch.ops.aten.index_select.default: _index_select,
}


def _call(ctx: EmitContext) -> Names:
    target = ctx.attrs.target
    emit = CALLS.get(target)
    if emit is None or ctx.attrs.kwargs:
        raise ctx.fail(f"it calls the ATen op {target}, which kiln does not model and has no "
                       f"ONNX form for; export the model with torch.onnx.export instead, or "
                       f"replace the op in the model")
    return emit(ctx)


# -- creation ----------------------------------------------------------------------------------

def _full(ctx: EmitContext) -> Names:
    a = ctx.attrs
    value = tensor_proto("value", torch.tensor([a.value], dtype=a.dtype.torch))
    return [ctx.one("ConstantOfShape", [ctx.b.ints(a.shape, "shape")], value=value)]


def _arange(ctx: EmitContext) -> Names:
    a = ctx.attrs
    values = torch.arange(a.start, a.end, a.step, dtype=a.dtype.torch)
    return [ctx.b.initializer(values, ctx.hint)]


EMITTERS: EmitterTable = {
    Op.ABS: _unary("Abs"),
    Op.NEG: _unary("Neg"),
    Op.EXP: _unary("Exp"),
    Op.LOG: _unary("Log"),
    Op.SQRT: _unary("Sqrt"),
    Op.RSQRT: _rsqrt,  # 1 / sqrt(x)
    Op.RECIPROCAL: _unary("Reciprocal"),
    Op.SIN: _unary("Sin"),
    Op.COS: _unary("Cos"),
    Op.TANH: _unary("Tanh"),
    Op.SIGMOID: _unary("Sigmoid"),
    Op.ERF: _unary("Erf"),
    Op.RELU: _unary("Relu"),
    Op.FLOOR: _unary("Floor"),
    Op.CEIL: _unary("Ceil"),
    Op.LOGICAL_NOT: _logical("Not"),
    Op.CAST: _cast,
    Op.ADD: _binary("Add"),
    Op.SUB: _binary("Sub"),
    Op.MUL: _binary("Mul"),
    Op.DIV: _div,
    Op.POW: _binary("Pow"),
    Op.MAXIMUM: _binary("Max"),
    Op.MINIMUM: _binary("Min"),
    Op.EQ: _compare("Equal"),
    Op.NE: _compare("Equal", negate=True),
    Op.LT: _compare("Less"),
    Op.LE: _compare("LessOrEqual"),
    Op.GT: _compare("Greater"),
    Op.GE: _compare("GreaterOrEqual"),
    Op.LOGICAL_AND: _logical("And"),
    Op.LOGICAL_OR: _logical("Or"),
    Op.WHERE: _where,
    Op.SUM: _reduce("ReduceSum"),
    Op.MEAN: _reduce("ReduceMean"),
    Op.AMAX: _reduce("ReduceMax"),
    Op.AMIN: _reduce("ReduceMin"),
    Op.ARGMAX: _arg_reduce("ArgMax"),
    Op.ARGMIN: _arg_reduce("ArgMin"),
    Op.VAR: _var,
    Op.VIEW: _reshape,
    Op.EXPAND: _expand,
    Op.PERMUTE: _permute,
    Op.SQUEEZE: _reshape,  # the output shape says which size-1 dimensions went
    Op.UNSQUEEZE: _unsqueeze,
    Op.SLICE: _slice,
    Op.SELECT: _select,
    Op.SPLIT: _split,
    Op.CAT: _cat,
    Op.CLONE: _alias,
    Op.TO_LAYOUT: _alias,
    Op.PAD: _pad,
    Op.FULL: _full,
    Op.ARANGE: _arange,
    Op.CALL: _call,
}
