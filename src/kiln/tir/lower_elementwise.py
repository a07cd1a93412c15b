"""Compute definitions of elementwise and broadcast kiln ops."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from kiln.ir.fused import activation_args
from kiln.ir.graph import Node
from kiln.ir.ops import Op
from kiln.ir.types import DType
from kiln.tir.nodes import Binary, BinOp, Buffer, CmpOp, Expr, UnOp, Var, const
from kiln.tir.te import (
    Builder,
    NotLowerable,
    TensorRef,
    cast,
    cmp,
    max_,
    min_,
    select,
    unary,
)

LowerFn = Callable[[Builder, Node, list[TensorRef], list[Buffer]], None]

_UNARY_MATH = {Op.EXP: UnOp.EXP, Op.LOG: UnOp.LOG, Op.SQRT: UnOp.SQRT, Op.RSQRT: UnOp.RSQRT,
               Op.SIN: UnOp.SIN, Op.COS: UnOp.COS, Op.TANH: UnOp.TANH, Op.SIGMOID: UnOp.SIGMOID,
               Op.ERF: UnOp.ERF, Op.ABS: UnOp.ABS, Op.NEG: UnOp.NEG}
_BINARY = {Op.ADD: BinOp.ADD, Op.SUB: BinOp.SUB, Op.MUL: BinOp.MUL, Op.POW: BinOp.POW,
           Op.MAXIMUM: BinOp.MAX, Op.MINIMUM: BinOp.MIN}
_COMPARE = {Op.EQ: CmpOp.EQ, Op.NE: CmpOp.NE, Op.LT: CmpOp.LT, Op.LE: CmpOp.LE,
            Op.GT: CmpOp.GT, Op.GE: CmpOp.GE}


def _meta(ref: TensorRef) -> object:
    if ref.buffer is None:
        return ref.number
    return torch.empty(ref.shape, dtype=ref.dtype.torch, device="meta")


def result_dtype(a: TensorRef, b: TensorRef) -> DType:
    """ATen's type promotion of two operands (Python numbers are 'wrapped' scalars)."""
    return DType.from_torch(torch.result_type(_meta(a), _meta(b)))  # type: ignore[arg-type]


def _map(fn: Callable[[Expr], Expr]) -> LowerFn:
    """out = fn(x) computed in the output dtype."""
    def lower(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
        out = outs[0]
        b.compute(node.name, out, lambda v: fn(args[0].as_dtype(out.dtype, out.shape, v)))
    return lower


def _gelu(approximate: str) -> Callable[[Expr], Expr]:
    if approximate == "tanh":
        def gelu(x: Expr) -> Expr:
            inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
            return x * 0.5 * (unary(UnOp.TANH, inner) + 1.0)
        return gelu
    return lambda x: x * 0.5 * (unary(UnOp.ERF, x * (1.0 / math.sqrt(2.0))) + 1.0)


def _clamp(low: float | None, high: float | None) -> Callable[[Expr], Expr]:
    # the bound first: max/min return their second operand on a tie, and ATen keeps x there
    # (clamp(-0.0, min=0.0) is -0.0); a NaN bound or x gives NaN, as in ATen
    def clamp(x: Expr) -> Expr:
        if low is not None:
            x = max_(const(low, x.dtype), x)
        if high is not None:
            x = min_(const(high, x.dtype), x)
        return x
    return clamp


def activation(op: Op, args: tuple[Any, ...]) -> Callable[[Expr], Expr]:
    """The loop expression of an epilogue activation (`kiln.ir.fused.ACTIVATIONS`) with its
    arguments as `kiln.rules.epilogue.activation_args` gives them."""
    if op is Op.RELU:
        # NaN stays NaN and -0.0 stays -0.0, as torch.relu (max's second operand on a tie)
        return lambda x: max_(const(0, x.dtype), x)
    if op is Op.GELU:
        return _gelu(args[0] if args else "none")
    if op is Op.LEAKY_RELU:
        slope = args[0]
        return lambda x: select(cmp(CmpOp.GT, x, 0), x, x * slope)
    if op is Op.CLAMP:
        return _clamp(args[0], args[1])
    if op is Op.HARDSWISH:  # (as ATen's kernel: x times the clamp, then divided by 6)
        gate = _clamp(0, 6)
        return lambda x: x * gate(x + const(3, x.dtype)) / const(6, x.dtype)
    if op in (Op.SIGMOID, Op.TANH):
        un = _UNARY_MATH[op]
        return lambda x: unary(un, x)
    raise NotLowerable(op, "not an epilogue activation")


def lower_unary(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    op, dtype = node.op, outs[0].dtype
    fn: Callable[[Expr], Expr]
    if op in _UNARY_MATH:
        un = _UNARY_MATH[op]
        fn = (lambda x: x) if (un is UnOp.ABS and dtype is DType.BOOL) else (
            lambda x: unary(un, x))
    elif op in (Op.FLOOR, Op.CEIL):
        un = UnOp.FLOOR if op is Op.FLOOR else UnOp.CEIL
        fn = (lambda x: unary(un, x)) if dtype.is_floating else (lambda x: x)
    elif op is Op.RECIPROCAL:
        fn = lambda x: const(1, x.dtype) / x  # noqa: E731
    elif op in (Op.RELU, Op.GELU, Op.LEAKY_RELU, Op.CLAMP, Op.HARDSWISH):
        fn = activation(op, activation_args(node))
    elif op is Op.CAST:
        fn = lambda x: x  # noqa: E731 - the store converts
    else:
        raise NotLowerable(op, "no elementwise definition")
    if dtype is DType.BOOL and op not in (Op.CAST, Op.ABS, Op.FLOOR, Op.CEIL):
        raise NotLowerable(op, "bool operand")
    if op is Op.CAST:
        out = outs[0]
        b.compute(node.name, out, lambda v: cast(args[0].at(out.shape, v), out.dtype))
        return
    _map(fn)(b, node, args, outs)


def lower_logical_not(b: Builder, node: Node, args: list[TensorRef],
                      outs: list[Buffer]) -> None:
    out = outs[0]
    b.compute(node.name, out, lambda v: unary(UnOp.NOT, args[0].as_dtype(DType.BOOL,
                                                                          out.shape, v)))


def lower_binary(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    out, op = outs[0], node.op
    x, y = args
    if op in _COMPARE:
        dt = result_dtype(x, y)
        b.compute(node.name, out, lambda v: cmp(_COMPARE[op], x.as_dtype(dt, out.shape, v),
                                                y.as_dtype(dt, out.shape, v)))
        return
    if op in (Op.LOGICAL_AND, Op.LOGICAL_OR):
        bop = BinOp.AND if op is Op.LOGICAL_AND else BinOp.OR
        b.compute(node.name, out, lambda v: Binary(bop, x.as_dtype(DType.BOOL, out.shape, v),
                                                   y.as_dtype(DType.BOOL, out.shape, v)))
        return
    dt = out.dtype
    if dt is DType.BOOL and op not in (Op.MAXIMUM, Op.MINIMUM):
        raise NotLowerable(op, "arithmetic on bool")
    if op is Op.DIV:
        b.compute(node.name, out, _div(node, x, y, out))
        return
    if op is Op.POW and not dt.is_floating:
        raise NotLowerable(op, "integer power")
    if op is Op.POW and _pow_special(node) is not None:
        form = _pow_special(node)
        b.compute(node.name, out, lambda v: form(x.as_dtype(dt, out.shape, v), dt))
        return
    bop = _BINARY[op]
    b.compute(node.name, out, lambda v: Binary(bop, x.as_dtype(dt, out.shape, v),
                                               y.as_dtype(dt, out.shape, v)))


# ATen computes x ** c for these number exponents c without pow (PowKernel.cpp's
# pow_tensor_scalar_optimized_kernel): the same forms give the same bits, e.g. the sign of
# (-0.0) ** 0.5, which is -0.0 by sqrt and +0.0 by powf
_POW_FORMS: dict[float, Callable[[Expr, DType], Expr]] = {
    2.0: lambda x, dt: x * x,
    3.0: lambda x, dt: x * x * x,
    0.5: lambda x, dt: unary(UnOp.SQRT, x),
    -0.5: lambda x, dt: const(1, dt) / unary(UnOp.SQRT, x),
    -1.0: lambda x, dt: const(1, dt) / x,
    -2.0: lambda x, dt: const(1, dt) / (x * x),
}


def _pow_special(node: Node) -> Callable[[Expr, DType], Expr] | None:
    exponent = node.inputs[1].node
    if exponent.op is not Op.SCALAR or isinstance(exponent.attrs.value, bool):  # type: ignore[attr-defined]
        return None
    return _POW_FORMS.get(float(exponent.attrs.value))  # type: ignore[attr-defined]


def _div(node: Node, x: TensorRef, y: TensorRef,
         out: Buffer) -> Callable[[tuple[Var, ...]], Expr]:
    mode = node.attrs.rounding_mode  # type: ignore[attr-defined]
    dt = out.dtype
    if not dt.is_floating:
        if mode != "floor":
            raise NotLowerable(node.op, f"integer division with rounding mode {mode}")
        return lambda v: x.as_dtype(dt, out.shape, v) // y.as_dtype(dt, out.shape, v)

    def div(v: tuple[Var, ...]) -> Expr:
        if mode == "floor":  # ATen's floor division, by way of fmod: 3 // -inf is -1, not -0
            return x.as_dtype(dt, out.shape, v) // y.as_dtype(dt, out.shape, v)
        q = x.as_dtype(dt, out.shape, v) / y.as_dtype(dt, out.shape, v)
        if mode == "trunc":
            return select(cmp(CmpOp.LT, q, 0), unary(UnOp.CEIL, q), unary(UnOp.FLOOR, q))
        return q
    return div


def lower_where(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    out = outs[0]
    c, x, y = args
    b.compute(node.name, out, lambda v: select(c.as_dtype(DType.BOOL, out.shape, v),
                                               x.as_dtype(out.dtype, out.shape, v),
                                               y.as_dtype(out.dtype, out.shape, v)))


def lower_full(b: Builder, node: Node, args: list[TensorRef], outs: list[Buffer]) -> None:
    out, value = outs[0], node.attrs.value  # type: ignore[attr-defined]
    b.compute(node.name, out, lambda v: const(value, out.dtype))


ELEMENTWISE: dict[Op, LowerFn] = {op: lower_unary for op in (
    *_UNARY_MATH, Op.FLOOR, Op.CEIL, Op.RELU, Op.RECIPROCAL, Op.GELU, Op.LEAKY_RELU, Op.CLAMP,
    Op.HARDSWISH, Op.CAST)}
ELEMENTWISE.update({op: lower_binary for op in (
    *_BINARY, *_COMPARE, Op.DIV, Op.LOGICAL_AND, Op.LOGICAL_OR)})
ELEMENTWISE[Op.LOGICAL_NOT] = lower_logical_not
ELEMENTWISE[Op.WHERE] = lower_where
ELEMENTWISE[Op.FULL] = lower_full
