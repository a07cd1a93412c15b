"""Elementwise ops, activations and reductions (ONNX semantics in torch)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from kiln.frontend.onnx.optable import Decline, NodeCall, axes_of, onnx_op

_UNARY = {
    "Abs": torch.abs, "Neg": torch.neg, "Exp": torch.exp, "Log": torch.log,
    "Sqrt": torch.sqrt, "Reciprocal": torch.reciprocal, "Sin": torch.sin, "Cos": torch.cos,
    "Tan": torch.tan, "Asin": torch.asin, "Acos": torch.acos, "Atan": torch.atan,
    "Sinh": torch.sinh, "Cosh": torch.cosh, "Asinh": torch.asinh, "Acosh": torch.acosh,
    "Atanh": torch.atanh, "Tanh": torch.tanh, "Sigmoid": torch.sigmoid, "Erf": torch.erf,
    "Relu": torch.relu, "Floor": torch.floor, "Ceil": torch.ceil, "Not": torch.logical_not,
    "Sign": torch.sign, "IsNaN": torch.isnan, "Round": torch.round,  # round: half to even
    "BitwiseNot": torch.bitwise_not,
}


def _unary(fn: object) -> object:
    def handler(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
        return fn(x)  # type: ignore[operator]

    return handler


for _name, _fn in _UNARY.items():
    onnx_op(_name)(_unary(_fn))  # type: ignore[arg-type]


@onnx_op("Identity")
def _identity(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    return x


def _same_types(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dtype != b.dtype:  # ONNX types both alike; torch would promote
        raise Decline(f"operand types differ ({a.dtype}, {b.dtype})")


def _binary(fn: object) -> object:
    def handler(n: NodeCall, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        _same_types(a, b)
        return fn(a, b)  # type: ignore[operator]

    return handler


_BINARY = {
    "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Equal": torch.eq,
    "Less": torch.lt, "Greater": torch.gt, "LessOrEqual": torch.le, "GreaterOrEqual": torch.ge,
    "And": torch.logical_and, "Or": torch.logical_or, "Xor": torch.logical_xor,
    "BitwiseAnd": torch.bitwise_and, "BitwiseOr": torch.bitwise_or,
    "BitwiseXor": torch.bitwise_xor,
}
for _name, _fn in _BINARY.items():
    onnx_op(_name)(_binary(_fn))  # type: ignore[arg-type]


@onnx_op("Div")
def _div(n: NodeCall, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _same_types(a, b)
    if a.dtype.is_floating_point:
        return torch.div(a, b)
    if a.dtype == torch.bool:
        raise Decline("bool division")
    return torch.div(a, b, rounding_mode="trunc")  # ONNX integer division truncates


@onnx_op("Mod")
def _mod(n: NodeCall, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _same_types(a, b)
    if n.attr("fmod", 0):
        return torch.fmod(a, b)  # the sign of the dividend, as C's fmod
    if a.dtype.is_floating_point:
        raise Decline("Mod with fmod=0 on floats")
    return torch.remainder(a, b)  # the sign of the divisor, as Python's %


@onnx_op("Pow")
def _pow(n: NodeCall, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if not x.dtype.is_floating_point or (y.dtype != x.dtype and not y.dtype.is_floating_point):
        raise Decline("Pow on integers, or of mixed kinds")
    return torch.pow(x, y.to(x.dtype))  # the result has the base's type


def _variadic(fn: object) -> object:
    def handler(n: NodeCall, *xs: torch.Tensor) -> torch.Tensor:
        if any(x.dtype != xs[0].dtype for x in xs):
            raise Decline("operand types differ")
        return functools.reduce(fn, xs)  # type: ignore[arg-type]

    return handler


onnx_op("Max")(_variadic(torch.maximum))  # type: ignore[arg-type]
onnx_op("Min")(_variadic(torch.minimum))  # type: ignore[arg-type]
onnx_op("Sum")(_variadic(torch.add))  # type: ignore[arg-type]


@onnx_op("Mean")
def _mean(n: NodeCall, *xs: torch.Tensor) -> torch.Tensor:
    if not xs[0].dtype.is_floating_point or any(x.dtype != xs[0].dtype for x in xs):
        raise Decline("Mean of non-float or mixed operands")
    return functools.reduce(torch.add, xs) / len(xs)


@onnx_op("Where")
def _where(n: NodeCall, cond: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _same_types(a, b)
    return torch.where(cond, a, b)


@onnx_op("IsInf")
def _isinf(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    neg, pos = n.attr("detect_negative", 1), n.attr("detect_positive", 1)
    if neg and pos:
        return torch.isinf(x)
    if pos:
        return torch.isposinf(x)
    return torch.isneginf(x) if neg else torch.zeros_like(x, dtype=torch.bool)


# -- activations -------------------------------------------------------------------------------

def _floats(x: torch.Tensor) -> None:
    if not x.dtype.is_floating_point:
        raise Decline("activation of a non-float tensor")


@onnx_op("LeakyRelu")
def _leaky_relu(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    _floats(x)
    return F.leaky_relu(x, n.attr("alpha", 0.01))


@onnx_op("Elu")
def _elu(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    _floats(x)
    return F.elu(x, n.attr("alpha", 1.0))


@onnx_op("Celu")
def _celu(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    _floats(x)
    return F.celu(x, n.attr("alpha", 1.0))


@onnx_op("Selu")
def _selu(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    _floats(x)
    alpha = n.attr("alpha", 1.67326319217681884765625)
    gamma = n.attr("gamma", 1.05070102214813232421875)
    return gamma * torch.where(x > 0, x, alpha * (torch.exp(x) - 1))


@onnx_op("HardSigmoid")
def _hard_sigmoid(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    _floats(x)
    return torch.clamp(n.attr("alpha", 0.2) * x + n.attr("beta", 0.5), 0, 1)


@onnx_op("HardSwish")
def _hard_swish(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    _floats(x)
    return x * torch.clamp(x / 6 + 0.5, 0, 1)


@onnx_op("ThresholdedRelu")
def _thresholded_relu(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    _floats(x)
    return torch.where(x > n.attr("alpha", 1.0), x, torch.zeros_like(x))


@onnx_op("Softplus")
def _softplus(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    _floats(x)
    return torch.log(torch.exp(x) + 1)  # as ONNX writes it (large x overflows to inf there too)


@onnx_op("Softsign")
def _softsign(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    _floats(x)
    return x / (1 + torch.abs(x))


@onnx_op("Mish")
def _mish(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    _floats(x)
    return x * torch.tanh(torch.log(torch.exp(x) + 1))


@onnx_op("Gelu")
def _gelu(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    _floats(x)
    approximate = n.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise Decline(f"Gelu approximate={approximate}")
    return F.gelu(x, approximate=approximate)


@onnx_op("PRelu")
def _prelu(n: NodeCall, x: torch.Tensor, slope: torch.Tensor) -> torch.Tensor:
    _same_types(x, slope)
    return torch.where(x < 0, x * slope, x)


@onnx_op("Clip")
def _clip(n: NodeCall, x: torch.Tensor, low: torch.Tensor | None = None,
          high: torch.Tensor | None = None) -> torch.Tensor:
    for bound in (low, high):
        if bound is not None and (bound.dtype != x.dtype or bound.dim() != 0):
            raise Decline("Clip bound of another type or not a scalar")
    if low is not None:
        x = torch.maximum(x, low)
    if high is not None:
        x = torch.minimum(x, high)  # min(max(x, low), high), as ONNX says, even if low > high
    return x


# -- softmax and reductions --------------------------------------------------------------------

@onnx_op("Softmax", "LogSoftmax")
def _softmax(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    _floats(x)
    axis = axes_of([n.attr("axis", -1)], x.dim())[0] if x.dim() else 0
    if x.dim() == 0:
        raise Decline("softmax of a scalar")
    fn = torch.softmax if n.op_type == "Softmax" else torch.log_softmax
    return fn(x, axis)


def _reduce_axes(n: NodeCall, x: torch.Tensor) -> list[int] | None:
    """The axes to reduce, or None for 'leave x as it is' (noop_with_empty_axes)."""
    axes = n.ints(1) if n.has_input(1) else n.attr("axes")
    if not axes:
        return None if n.attr("noop_with_empty_axes", 0) else list(range(x.dim()))
    return sorted(set(axes_of(axes, x.dim())))


def _reduction(fn: object, floats_only: bool = False) -> object:
    def handler(n: NodeCall, x: torch.Tensor, axes: torch.Tensor | None = None) -> torch.Tensor:
        if floats_only:
            _floats(x)
        dims = _reduce_axes(n, x)
        if dims is None:
            return x
        if x.numel() == 0:
            raise Decline("reduction of an empty tensor")
        keep = bool(n.attr("keepdims", 1))
        if not dims:  # a scalar: nothing to reduce
            return x
        return fn(x, dims, keep).to(x.dtype)  # type: ignore[operator]

    return handler


_REDUCTIONS = {
    "ReduceSum": (lambda x, d, k: torch.sum(x, d, keepdim=k), False),
    "ReduceMean": (lambda x, d, k: torch.mean(x, d, keepdim=k), True),
    "ReduceMax": (lambda x, d, k: torch.amax(x, d, keepdim=k), False),
    "ReduceMin": (lambda x, d, k: torch.amin(x, d, keepdim=k), False),
    "ReduceProd": (lambda x, d, k: _prod(x, d, k), False),
    "ReduceL1": (lambda x, d, k: torch.sum(torch.abs(x), d, keepdim=k), False),
    "ReduceL2": (lambda x, d, k: torch.sqrt(torch.sum(x * x, d, keepdim=k)), True),
    "ReduceSumSquare": (lambda x, d, k: torch.sum(x * x, d, keepdim=k), False),
    "ReduceLogSum": (lambda x, d, k: torch.log(torch.sum(x, d, keepdim=k)), True),
    "ReduceLogSumExp": (lambda x, d, k: torch.logsumexp(x, d, keepdim=k), True),
}
for _name, (_fn, _floats_only) in _REDUCTIONS.items():
    onnx_op(_name)(_reduction(_fn, _floats_only))  # type: ignore[arg-type]


def _prod(x: torch.Tensor, dims: list[int], keep: bool) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=keep)
    return x


@onnx_op("ArgMax", "ArgMin")
def _argreduce(n: NodeCall, x: torch.Tensor) -> torch.Tensor:
    if n.attr("select_last_index", 0) or x.numel() == 0 or x.dim() == 0:
        raise Decline("select_last_index, or an empty or scalar tensor")
    axis = axes_of([n.attr("axis", 0)], x.dim())[0]
    fn = torch.argmax if n.op_type == "ArgMax" else torch.argmin
    return fn(x, axis, keepdim=bool(n.attr("keepdims", 1)))  # the first index of a tie


@onnx_op("CumSum")
def _cumsum(n: NodeCall, x: torch.Tensor, axis: torch.Tensor) -> torch.Tensor:
    dim = axes_of([n.ints(1)[0]], x.dim())[0]  # type: ignore[index]
    if n.attr("exclusive", 0) or n.attr("reverse", 0):
        raise Decline("exclusive or reverse CumSum")
    return torch.cumsum(x, dim).to(x.dtype)

