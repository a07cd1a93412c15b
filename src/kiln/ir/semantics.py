"""What every op computes, as one call of an ATen op.

This table is the single source of truth for an op's meaning: the reference interpreter runs
it, type inference runs it on meta tensors, and the library-call runtime emits it. A lowering
takes the node's attributes and operand count and returns an `AtenCall` whose arguments hold
`Operand(i)` where the i-th operand goes and `DEVICE` where the graph's device goes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.ir import attrs as A
from kiln.ir import fused
from kiln.ir.attrs import Operand
from kiln.ir.ops import Op

aten = torch.ops.aten


class _Device:
    def __repr__(self) -> str:
        return "DEVICE"


DEVICE = _Device()  # placeholder for the graph's device in creation ops


@dataclass(frozen=True)
class AtenCall:
    target: Any  # torch._ops.OpOverload
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    returns_list: bool = False  # the ATen op returns a sequence (split), even of one tensor
    select: int | None = None  # the kiln op is this one output of the ATen op


def _x(i: int) -> Operand:
    return Operand(i)


X, Y, Z = _x(0), _x(1), _x(2)

Lowering = Callable[[Any, int], AtenCall]


def _unary(target: Any) -> Lowering:
    return lambda a, n: AtenCall(target, (X,))


def _binary(target: Any) -> Lowering:
    return lambda a, n: AtenCall(target, (X, Y))


def _reduce(target: Any, all_target: Any) -> Lowering:
    def lower(a: A.ReduceAttrs, n: int) -> AtenCall:
        if a.dims is None and not a.keepdim and all_target is not None:
            return AtenCall(all_target, (X,))
        dims = list(a.dims) if a.dims is not None else []
        return AtenCall(target, (X, dims, a.keepdim))

    return lower


def _optional(n: int, i: int) -> Operand | None:
    return Operand(i) if i < n else None


LOWERINGS: dict[Op, Lowering] = {
    Op.FULL: lambda a, n: AtenCall(aten.full.default, (list(a.shape), a.value),
                                   {"dtype": a.dtype.torch, "device": DEVICE}),
    Op.ARANGE: lambda a, n: AtenCall(aten.arange.start_step, (a.start, a.end, a.step),
                                     {"dtype": a.dtype.torch, "device": DEVICE}),
    Op.ABS: _unary(aten.abs.default),
    Op.NEG: _unary(aten.neg.default),
    Op.EXP: _unary(aten.exp.default),
    Op.LOG: _unary(aten.log.default),
    Op.SQRT: _unary(aten.sqrt.default),
    Op.RSQRT: _unary(aten.rsqrt.default),
    Op.RECIPROCAL: _unary(aten.reciprocal.default),
    Op.SIN: _unary(aten.sin.default),
    Op.COS: _unary(aten.cos.default),
    Op.TANH: _unary(aten.tanh.default),
    Op.SIGMOID: _unary(aten.sigmoid.default),
    Op.ERF: _unary(aten.erf.default),
    Op.RELU: _unary(aten.relu.default),
    Op.HARDSWISH: _unary(aten.hardswish.default),
    Op.FLOOR: _unary(aten.floor.default),
    Op.CEIL: _unary(aten.ceil.default),
    Op.LOGICAL_NOT: _unary(aten.logical_not.default),
    Op.GELU: lambda a, n: AtenCall(aten.gelu.default, (X,), {"approximate": a.approximate}),
    Op.LEAKY_RELU: lambda a, n: AtenCall(aten.leaky_relu.default, (X, a.negative_slope)),
    Op.CLAMP: lambda a, n: AtenCall(aten.clamp.default, (X, a.min, a.max)),
    Op.CAST: lambda a, n: AtenCall(aten._to_copy.default, (X,), {"dtype": a.dtype.torch}),
    Op.ADD: _binary(aten.add.Tensor),
    Op.SUB: _binary(aten.sub.Tensor),
    Op.MUL: _binary(aten.mul.Tensor),
    Op.DIV: lambda a, n: (AtenCall(aten.div.Tensor, (X, Y)) if a.rounding_mode is None else
                          AtenCall(aten.div.Tensor_mode, (X, Y),
                                   {"rounding_mode": a.rounding_mode})),
    Op.POW: _binary(aten.pow.Tensor_Tensor),
    Op.MAXIMUM: _binary(aten.maximum.default),
    Op.MINIMUM: _binary(aten.minimum.default),
    Op.EQ: _binary(aten.eq.Tensor),
    Op.NE: _binary(aten.ne.Tensor),
    Op.LT: _binary(aten.lt.Tensor),
    Op.LE: _binary(aten.le.Tensor),
    Op.GT: _binary(aten.gt.Tensor),
    Op.GE: _binary(aten.ge.Tensor),
    Op.LOGICAL_AND: _binary(aten.logical_and.default),
    Op.LOGICAL_OR: _binary(aten.logical_or.default),
    Op.WHERE: lambda a, n: AtenCall(aten.where.self, (X, Y, Z)),
    Op.SUM: _reduce(aten.sum.dim_IntList, aten.sum.default),
    Op.MEAN: _reduce(aten.mean.dim, aten.mean.default),
    Op.AMAX: _reduce(aten.amax.default, None),
    Op.AMIN: _reduce(aten.amin.default, None),
    Op.ARGMAX: lambda a, n: AtenCall(aten.argmax.default, (X, a.dim, a.keepdim)),
    Op.ARGMIN: lambda a, n: AtenCall(aten.argmin.default, (X, a.dim, a.keepdim)),
    Op.VAR: lambda a, n: AtenCall(aten.var.correction, (X, None if a.dims is None else
                                                        list(a.dims)),
                                  {"correction": a.correction, "keepdim": a.keepdim}),
    Op.SOFTMAX: lambda a, n: AtenCall(aten._softmax.default, (X, a.dim, False)),
    Op.LOG_SOFTMAX: lambda a, n: AtenCall(aten._log_softmax.default, (X, a.dim, False)),
    Op.LAYER_NORM: lambda a, n: AtenCall(aten.native_layer_norm.default,
                                         (X, list(a.normalized_shape), Y, Z, a.eps)),
    Op.BATCH_NORM: lambda a, n: AtenCall(aten._native_batch_norm_legit_no_training.default,
                                         (X, Y, Z, Operand(3), Operand(4), 0.1, a.eps),
                                         select=0),
    # the IR's view has no layout: reshape is the view where the strides allow one and a copy
    # in logical order where they do not (an NHWC tensor seen as [N*H*W, C] is a view only if
    # its memory is NHWC, which the IR can tell only as far as `passes.layout` knows)
    Op.VIEW: lambda a, n: AtenCall(aten.reshape.default, (X, list(a.shape))),
    Op.EXPAND: lambda a, n: AtenCall(aten.expand.default, (X, list(a.shape))),
    Op.PERMUTE: lambda a, n: AtenCall(aten.permute.default, (X, list(a.dims))),
    Op.SQUEEZE: lambda a, n: AtenCall(aten.squeeze.dims, (X, list(a.dims))),
    Op.UNSQUEEZE: lambda a, n: AtenCall(aten.unsqueeze.default, (X, a.dim)),
    Op.SLICE: lambda a, n: AtenCall(aten.slice.Tensor, (X, a.dim, a.start, a.end, a.step)),
    Op.SELECT: lambda a, n: AtenCall(aten.select.int, (X, a.dim, a.index)),
    Op.SPLIT: lambda a, n: AtenCall(aten.split_with_sizes.default, (X, list(a.sizes), a.dim),
                                    returns_list=True),
    Op.CAT: lambda a, n: AtenCall(aten.cat.default, ([Operand(i) for i in range(n)], a.dim)),
    # a contiguous copy: whatever the source's strides, a later view of it always works
    Op.CLONE: lambda a, n: AtenCall(aten.clone.default, (X,),
                                    {"memory_format": torch.contiguous_format}),
    Op.PAD: lambda a, n: AtenCall(aten.constant_pad_nd.default, (X, list(a.pad), a.value)),
    Op.MM: _binary(aten.mm.default),
    Op.BMM: _binary(aten.bmm.default),
    Op.ADDMM: lambda a, n: AtenCall(aten.addmm.default, (X, Y, Z),
                                    {"beta": a.beta, "alpha": a.alpha}),
    Op.CONVOLUTION: lambda a, n: AtenCall(
        aten.convolution.default,
        (X, Y, _optional(n, 2), list(a.stride), list(a.padding), list(a.dilation),
         a.transposed, list(a.output_padding), a.groups)),
    Op.ADDMM_ACT: lambda a, n: AtenCall(fused.addmm_act, (X, Y, Z), {
        "beta": a.beta, "alpha": a.alpha, "activation": a.activation, "act_args": a.act_args}),
    Op.CONV_ACT: lambda a, n: AtenCall(fused.conv_act, tuple(Operand(i) for i in range(n)), {
        "stride": list(a.stride), "padding": list(a.padding), "dilation": list(a.dilation),
        "groups": a.groups, "has_bias": a.has_bias, "activation": a.activation,
        "act_args": a.act_args}),
    Op.TO_LAYOUT: lambda a, n: AtenCall(aten.clone.default, (X,), {
        "memory_format": torch.channels_last if a.channels_last else torch.contiguous_format}),
    Op.EMBEDDING: lambda a, n: AtenCall(aten.embedding.default, (X, Y)),
    Op.MAX_POOL2D: lambda a, n: AtenCall(
        aten.max_pool2d_with_indices.default,
        (X, list(a.kernel), list(a.stride), list(a.padding), list(a.dilation), a.ceil_mode)),
    Op.AVG_POOL2D: lambda a, n: AtenCall(
        aten.avg_pool2d.default,
        (X, list(a.kernel), list(a.stride), list(a.padding), a.ceil_mode, a.count_include_pad,
         a.divisor_override)),
    Op.ADAPTIVE_AVG_POOL2D: lambda a, n: AtenCall(aten._adaptive_avg_pool2d.default,
                                                  (X, list(a.output_size))),
    Op.CALL: lambda a, n: AtenCall(a.target, _listify(a.args), dict(_listify(a.kwargs)),
                                   returns_list=returns_sequence(a.target)),
}


def returns_sequence(target: Any) -> bool:
    """The ATen op returns a tuple or a list, even of one tensor (split into one piece)."""
    returns = target._schema.returns
    return len(returns) != 1 or isinstance(returns[0].type, torch.ListType)


def _listify(template: Any) -> Any:
    """Call templates store lists as tuples (hashable); ATen wants lists back."""
    if isinstance(template, tuple):
        return [_listify(t) for t in template]
    return template


# Overloads that take a Python number at one position; ATen computes them differently from
# the Tensor form (pow(x, 2) squares; pow(x, 0.5) takes a square root).
# Comparisons accept a Python number only in their Scalar overloads.
SCALAR_FORMS: dict[Op, dict[int, Any]] = {
    Op.POW: {1: aten.pow.Tensor_Scalar, 0: aten.pow.Scalar},
    Op.EQ: {1: aten.eq.Scalar},
    Op.NE: {1: aten.ne.Scalar},
    Op.LT: {1: aten.lt.Scalar},
    Op.LE: {1: aten.le.Scalar},
    Op.GT: {1: aten.gt.Scalar},
    Op.GE: {1: aten.ge.Scalar},
}


def lower_to_aten(op: Op, attrs: Any, num_inputs: int,
                  scalar_operands: frozenset[int] = frozenset()) -> AtenCall:
    """The ATen call for an op; ``scalar_operands`` are the positions fed by SCALAR nodes."""
    try:
        lowering = LOWERINGS[op]
    except KeyError:
        raise ValueError(f"op {op.text} has no ATen meaning (it is a source op)") from None
    call = lowering(attrs, num_inputs)
    for position, target in SCALAR_FORMS.get(op, {}).items():
        if position in scalar_operands:
            return AtenCall(target, call.args, call.kwargs, call.returns_list, call.select)
    return call


def lower_node(node: Any) -> AtenCall:
    scalars = frozenset(i for i, v in enumerate(node.inputs) if v.node.op is Op.SCALAR)
    return lower_to_aten(node.op, node.attrs, len(node.inputs), scalars)


def bind(template: Any, operands: Any, device: Any) -> Any:
    """Replace `Operand`s and `DEVICE` in an argument template with actual values."""
    if isinstance(template, Operand):
        return operands[template.index]
    if template is DEVICE:
        return device
    if isinstance(template, list):
        return [bind(t, operands, device) for t in template]
    if isinstance(template, tuple):
        return tuple(bind(t, operands, device) for t in template)
    if isinstance(template, dict):
        return {k: bind(v, operands, device) for k, v in template.items()}
    return template


def run_call(call: AtenCall, operands: Any, device: Any) -> tuple[Any, ...]:
    """Run one lowered op; always returns a tuple of outputs."""
    result = call.target(*bind(call.args, operands, device), **bind(call.kwargs, operands, device))
    if call.select is not None:
        return (result[call.select],)
    if isinstance(result, (tuple, list)):
        return tuple(result)
    return () if result is None else (result,)  # None: an op returning () for its effect
