"""Folding into weights: batch norms, biases and scales that meet a contraction become part
of its (constant) weights, so they cost nothing at run time.

    batch_norm(conv(x, W, B)) -> conv(x, W*R, B*R + P)     R = gamma/sqrt(var+eps), P = beta-mean*R
    batch_norm(addmm(b, x, W)) -> addmm(b*R + P, x, W*R)
    conv(x, W) + b             -> conv(x, W, b)
    mm(a, b) * s               -> mm(a*s, b)             (s goes to the weight, or the smaller side)
    addmm(b, x, W) * s         -> addmm(b*s, x, W*s)     (attention's 1/sqrt(d), once folded)
    move(y) * s                -> move(y * s)            (a scale travels down views to its source)

The new weights are small subgraphs of the old ones; the fold pass computes them. Moving a
product across a sum or a normalization rounds differently, so those rows are ieee.
"""

from __future__ import annotations

import math

import torch

from kiln.ir.attrs import ShapeAttrs
from kiln.ir.graph import Value
from kiln.ir.ops import Op
from kiln.rewrite.pattern import FloatDType, Number, On, Var, Weight
from kiln.rewrite.rule import EXACT, IEEE, Match, Rule
from kiln.rules.support import is_finite_nonzero, numel, plain_gemm

MOVES = frozenset({Op.VIEW, Op.PERMUTE, Op.EXPAND, Op.SQUEEZE, Op.UNSQUEEZE})
w_ = Weight()
bn_operands = (Var("gamma", w_), Var("beta", w_), Var("mean", w_), Var("var", w_))



def _not_transposed(attrs) -> bool:
    return not attrs.transposed


def _bn_scale_shift(m: Match) -> tuple[Value, Value]:
    """R = gamma * rsqrt(var + eps) and P = beta - mean * R, as weight subgraphs."""
    eps = m.number(m.root.attrs.eps)
    r = m.op(Op.MUL, m["gamma"], m.op(Op.RSQRT, m.op(Op.ADD, m["var"], eps)))
    p = m.op(Op.SUB, m["beta"], m.op(Op.MUL, m["mean"], r))
    return r, p


def _conv_bias(m: Match) -> Value | None:
    conv = m["conv"]
    return conv.inputs[2] if len(conv.inputs) == 3 else None


def _conv_weights_only(m: Match) -> str | None:
    conv = m["conv"]
    bias = _conv_bias(m)
    if bias is not None and not m.ctx.is_weight_only(bias):
        return f"the bias of {conv.name} is not a weight"
    return None


def _fold_bn_into_conv(m: Match) -> Value:
    conv = m["conv"]
    r, p = _bn_scale_shift(m)
    w = m["w"]
    w2 = m.op(Op.MUL, w, m.op(Op.VIEW, r, attrs=ShapeAttrs((-1,) + (1,) * (len(w.type.shape) - 1))))
    bias = _conv_bias(m)
    b2 = p if bias is None else m.op(Op.ADD, m.op(Op.MUL, bias, r), p)
    return m.op(Op.CONVOLUTION, m["x"], w2, b2, attrs=conv.attrs, name=conv.name)


def _fold_bn_into_addmm(m: Match) -> Value:
    r, p = _bn_scale_shift(m)
    w2 = m.op(Op.MUL, m["w"], r)  # columns of the (K, N) weight scale by R
    b2 = m.op(Op.ADD, m.op(Op.MUL, m["b"], r), p)
    return m.op(Op.ADDMM, b2, m["x"], w2, attrs=m["mm"].attrs, name=m["mm"].name)


def _per_channel(conv_shape: tuple[int, ...], b: Value, squeeze_dims: tuple[int, ...] | None
                 ) -> str | None:
    """Does adding ``b`` to the conv output (squeezed by ``squeeze_dims``) add b[c] to every
    element of channel c? Checked on index tensors that are views, not copies."""
    channels = conv_shape[1]
    if math.prod(b.type.shape) != channels:
        return f"{b.type} does not hold one number per channel ({channels})"
    index = torch.arange(channels).view((1, channels) + (1,) * (len(conv_shape) - 2))
    index = index.expand(conv_shape)
    if squeeze_dims is not None:
        index = index.squeeze(squeeze_dims)
    try:
        probe = torch.arange(channels).view(b.type.shape).expand(index.shape)
    except RuntimeError:
        return f"{b.type} does not broadcast to {tuple(index.shape)}"
    return None if torch.equal(index, probe) else f"{b.type} does not line up with the channels"


def _channel_bias(m: Match) -> str | None:
    if m["b"].type.dtype != m.root.type.dtype:
        return "the bias has another dtype"
    return _per_channel(m["conv"].type.shape, m["b"], None)


def _bias_into_conv(m: Match) -> Value:
    conv = m["conv"]
    bias = m.op(Op.VIEW, m["b"], attrs=ShapeAttrs((conv.type.shape[1],)))
    return m.op(Op.CONVOLUTION, m["x"], m["w"], bias, attrs=conv.attrs, name=conv.name)


def _sink_scale(m: Match) -> Value:
    move = m["move"]
    scaled = m.op(Op.MUL, m["y"], m["s"])
    return m.op(move.op, scaled, attrs=move.attrs, name=move.name)


def _scale_side(m: Match) -> str | None:
    a, b = m["a"], m["b"]
    if m.ctx.is_weight_only(b) or m.ctx.is_weight_only(a):
        return None
    out = numel(m.root.out())
    if numel(a) <= out or numel(b) <= out:
        return None
    return "both operands are larger than the product"


def _scale_into_matmul(m: Match) -> Value:
    a, b, s = m["a"], m["b"], m["s"]
    mm = m["mm"]
    if m.ctx.is_weight_only(b) or (not m.ctx.is_weight_only(a) and numel(b) < numel(a)):
        return m.op(mm.op, a, m.op(Op.MUL, b, s), name=mm.name)
    return m.op(mm.op, m.op(Op.MUL, a, s), b, name=mm.name)


def _scale_into_addmm(m: Match) -> Value:
    s = m["s"]
    mm = m["mm"]
    return m.op(Op.ADDMM, m.op(Op.MUL, m["b"], s), m["x"], m.op(Op.MUL, m["w"], s),
                attrs=mm.attrs, name=mm.name)


conv_pattern = On(Op.CONVOLUTION, Var("x"), Var("w", w_), exact_arity=False, name="conv",
                  where=_not_transposed, describe="not transposed")
scale = Number("s", is_finite_nonzero, "a finite nonzero number")

RULES = (
    Rule("conv-bn", On(Op.BATCH_NORM, conv_pattern, *bn_operands), _fold_bn_into_conv, IEEE,
         guard=_conv_weights_only),  # bn(conv(x, W, B)) -> conv(x, W*R, B*R + P)
    Rule("linear-bn", On(Op.BATCH_NORM, On(Op.ADDMM, Var("b", w_), Var("x"), Var("w", w_),
                                           name="mm", where=plain_gemm, describe="beta=alpha=1"),
                         *bn_operands),
         _fold_bn_into_addmm, IEEE),  # bn(addmm(b, x, W)) -> addmm(b*R + P, x, W*R)
    Rule("conv-bias", On(Op.ADD, On(Op.CONVOLUTION, Var("x"), Var("w"), name="conv",
                                    where=_not_transposed, describe="not transposed"),
                         Var("b", w_)),
         _bias_into_conv, IEEE, guard=_channel_bias),  # conv(x, W) + b -> conv(x, W, b)
    Rule("conv-squeeze-bias",
         On(Op.ADD, On(Op.SQUEEZE, On(Op.CONVOLUTION, Var("x"), Var("w"), name="conv",
                                      where=_not_transposed, describe="not transposed"),
                       name="move"),
            Var("b", w_)),
         lambda m: m.op(Op.SQUEEZE, _bias_into_conv(m), attrs=m["move"].attrs),
         IEEE, guard=lambda m: _squeezed_channel_bias(m)),  # squeeze(conv(x,W))+b -> ...(x,W,b))
    Rule("scale-sink", On(Op.MUL, On(MOVES, Var("y", FloatDType()), name="move"), scale),
         _sink_scale, EXACT),  # move(y)*s -> move(y*s)
    Rule("scale-into-matmul", On(Op.MUL, On({Op.MM, Op.BMM}, Var("a"), Var("b"), name="mm"), scale),
         _scale_into_matmul, IEEE, guard=_scale_side),  # (a@b)*s -> (a*s)@b
    Rule("scale-into-addmm", On(Op.MUL, On(Op.ADDMM, Var("b", w_), Var("x"), Var("w", w_),
                                           name="mm", where=plain_gemm, describe="beta=alpha=1"),
                                scale),
         _scale_into_addmm, IEEE),  # addmm(b, x, W)*s -> addmm(b*s, x, W*s)
)


def _squeezed_channel_bias(m: Match) -> str | None:
    if m["b"].type.dtype != m.root.type.dtype:
        return "the bias has another dtype"
    return _per_channel(m["conv"].type.shape, m["b"], m["move"].attrs.dims)
