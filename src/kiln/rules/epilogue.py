"""Epilogue fusion: a bias, a residual add and an activation ride on the contraction.

    act(addmm(b, x, W))        -> addmm_act(b, x, W){act}
    act(view(addmm(b, x, W)))  -> view(addmm_act(b, x, W){act})
    conv(x, W, B) + r          -> conv_act(x, W, B, r){none}
    act(conv(x, W, B))         -> conv_act(x, W, B){act}
    act(conv_act(...){none})   -> conv_act(...){act}

The fused ops run the same ATen kernels, with the epilogue in place on the contraction's
output (see kiln.ir.fused), so every row is exact.
"""

from __future__ import annotations

from typing import Any

from kiln.ir.attrs import AddmmActAttrs, ConvActAttrs
from kiln.ir.fused import ACTIVATIONS, activation_args
from kiln.ir.graph import Node, Value
from kiln.ir.ops import Op
from kiln.rewrite.pattern import On, Var
from kiln.rewrite.rule import EXACT, Match, Rule


def _addmm_act(m: Match) -> Value:
    mm = m["mm"]
    attrs = AddmmActAttrs(m.root.op, activation_args(m.root), mm.attrs.beta, mm.attrs.alpha)
    return m.op(Op.ADDMM_ACT, *mm.inputs, attrs=attrs, name=mm.name)


def _addmm_view_act(m: Match) -> Value:
    view = m["view"]
    return m.op(Op.VIEW, _addmm_act(m), attrs=view.attrs, name=view.name)


def _conv_act_attrs(conv: Node, activation: Op | None, args: tuple[Any, ...],
                    residual: bool) -> ConvActAttrs:
    a = conv.attrs
    return ConvActAttrs(a.stride, a.padding, a.dilation, a.groups,  # type: ignore[attr-defined]
                        len(conv.inputs) == 3, residual, activation, args)


def _conv_residual(m: Match) -> Value:
    conv = m["conv"]
    attrs = _conv_act_attrs(conv, None, (), True)
    return m.op(Op.CONV_ACT, *conv.inputs, m["r"], attrs=attrs, name=conv.name)


def _conv_act(m: Match) -> Value:
    conv = m["conv"]
    attrs = _conv_act_attrs(conv, m.root.op, activation_args(m.root), False)
    return m.op(Op.CONV_ACT, *conv.inputs, attrs=attrs, name=conv.name)


def _add_activation(m: Match) -> Value:
    conv = m["conv"]
    a = conv.attrs
    attrs = ConvActAttrs(a.stride, a.padding, a.dilation, a.groups, a.has_bias,
                         a.has_residual, m.root.op, activation_args(m.root))
    return m.op(Op.CONV_ACT, *conv.inputs, attrs=attrs, name=conv.name)


def _same_shape_residual(m: Match) -> str | None:
    if m["r"].type != m["conv"].type:
        return f"the residual {m['r'].type} differs from the conv output {m['conv'].type}"
    return None


def _plain_2d_conv(attrs) -> bool:
    return not attrs.transposed and len(attrs.stride) == 2


def _no_activation(attrs) -> bool:
    return attrs.activation is None


addmm = On(Op.ADDMM, Var("b"), Var("x"), Var("w"), name="mm")
conv = On(Op.CONVOLUTION, Var("x"), Var("w"), exact_arity=False, name="conv",
          where=_plain_2d_conv, describe="a 2-d convolution, not transposed")

RULES = (
    Rule("addmm-act", On(ACTIVATIONS, addmm), _addmm_act, EXACT),  # act(addmm) -> addmm_act
    Rule("addmm-view-act", On(ACTIVATIONS, On(Op.VIEW, addmm, name="view")),
         _addmm_view_act, EXACT),  # act(view(addmm)) -> view(addmm_act)
    Rule("conv-residual", On(Op.ADD, conv, Var("r")), _conv_residual, EXACT,
         guard=_same_shape_residual),  # conv(x, W, B) + r -> conv_act(x, W, B, r)
    Rule("conv-act", On(ACTIVATIONS, conv), _conv_act, EXACT),  # act(conv) -> conv_act
    Rule("conv-act-epilogue",
         On(ACTIVATIONS, On(Op.CONV_ACT, Var("x"), exact_arity=False, name="conv",
                            where=_no_activation, describe="without an activation")),
         _add_activation, EXACT),  # act(conv_act{none}) -> conv_act{act}
)
