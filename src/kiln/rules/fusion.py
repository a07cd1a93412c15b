"""Folding into weights: batch norms, biases and scales that meet a contraction become part
of its (constant) weights, so they cost nothing at run time.

    batch_norm(conv(x, W, B)) -> conv(x, W*R, B*R + P)     R = gamma/sqrt(var+eps), P = beta-mean*R
    batch_norm(addmm(b, x, W)) -> addmm(b*R + P, x, W*R)
    batch_norm(mm(x, W))       -> addmm(P, x, W*R)    (a linear without bias: LeViT's)
    conv(x, W) + b             -> conv(x, W, b)
    mm(a, b) * s               -> mm(a*s, b)             (s goes to the weight, or the smaller side)
    addmm(b, x, W) * s         -> addmm(b*s, x, W*s)     (attention's 1/sqrt(d), once folded)
    view(addmm(b, x, W)) * g   -> view(addmm(b*g, x, W*g))   (g a weight per column: layer scale)
    move(y) * s                -> move(y * s)            (a scale travels down views to its source)

The new weights are small subgraphs of the old ones; the fold pass computes them. Moving a
product across a sum or a normalization rounds differently, so those rows are ieee.
"""

from __future__ import annotations

import math

import torch

from kiln.ir.attrs import AddmmAttrs, ShapeAttrs
from kiln.ir.graph import Value
from kiln.ir.ops import Op
from kiln.rewrite.law import A, App, AttrFnKind, C, CondKind, F, L, PVar, Term
from kiln.rewrite.pattern import FloatDType, Number, On, Var, Weight
from kiln.rewrite.rule import EXACT, IEEE, Match, Rule
from kiln.rules.laws_common import B, W, X, conv
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


def _column_scale(m: Match) -> str | None:
    """``g`` is one weight per column of the product, seen through a view that keeps the
    columns last ([N] or [1, ..., 1, N]: ConvNeXt's layer scale), and the product is not
    broadcast to a larger shape."""
    columns = m["mm"].type.shape[-1]
    g, view = m["g"].type, m["view"].type
    if view.shape[-1:] != (columns,) or m.root.type != view or g.dtype != view.dtype \
            or g.shape[-1:] != (columns,) or any(d != 1 for d in g.shape[:-1]):
        return f"the scale is not one weight per column ({columns}) of the product"
    return None


def _column_scale_into_addmm(m: Match) -> Value:
    mm, columns = m["mm"], m["mm"].type.shape[-1]
    g = m.op(Op.VIEW, m["g"], attrs=ShapeAttrs((columns,)))
    gemm = m.op(Op.ADDMM, m.op(Op.MUL, m["b"], g), m["x"], m.op(Op.MUL, m["w"], g),
                attrs=mm.attrs, name=mm.name)
    return m.op(Op.VIEW, gemm, attrs=m["view"].attrs, name=m["view"].name)


def _bn_per_column(m: Match) -> str | None:
    """The norm's four vectors hold one value per column of the product (ATen would also
    broadcast a one-element gamma: a graph kiln never captures, which the checks sample)."""
    columns = m["mm"].type.shape[-1]
    if any(tuple(m[k].type.shape) != (columns,) for k in ("gamma", "beta", "mean", "var")):
        return f"the batch norm's vectors are not one per column ({columns})"
    return None


def _fold_bn_into_mm(m: Match) -> Value:
    r, p = _bn_scale_shift(m)
    w2 = m.op(Op.MUL, m["w"], r)  # columns of the (K, N) weight scale by R
    return m.op(Op.ADDMM, p, m["x"], w2, attrs=AddmmAttrs(), name=m["mm"].name)


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

GAMMA, BETA, MEAN, VAR, EPS, S, Y = (PVar(n) for n in ("gamma", "beta", "mean", "var", "eps",
                                                       "s", "y"))
BN_WEIGHTS = tuple(C(CondKind.WEIGHT, v) for v in (GAMMA, BETA, MEAN, VAR))
# R = gamma * rsqrt(var + eps), P = beta - mean * R
R_TERM = A(Op.MUL, GAMMA, A(Op.RSQRT, A(Op.ADD, VAR, EPS)))
P_TERM = A(Op.SUB, BETA, A(Op.MUL, MEAN, R_TERM))
W_SCALED = A(Op.MUL, W, A(Op.VIEW, R_TERM, shape=(-1, 1, 1, 1)))


def _bn(operand: Term) -> App:
    return A(Op.BATCH_NORM, operand, GAMMA, BETA, MEAN, VAR, eps=EPS)


CONV_BN_LAWS = (
    L("conv-bn.no-bias", _bn(conv(X, W)), conv(X, W_SCALED, P_TERM), IEEE,
      C(CondKind.WEIGHT, W), *BN_WEIGHTS),
    L("conv-bn.bias", _bn(conv(X, W, B)),
      conv(X, W_SCALED, A(Op.ADD, A(Op.MUL, B, R_TERM), P_TERM)), IEEE,
      C(CondKind.WEIGHT, W), C(CondKind.WEIGHT, B), *BN_WEIGHTS),
)
LINEAR_BN_LAW = L("linear-bn", _bn(A(Op.ADDMM, B, X, W)),
                  A(Op.ADDMM, A(Op.ADD, A(Op.MUL, B, R_TERM), P_TERM), X, A(Op.MUL, W, R_TERM)),
                  IEEE, C(CondKind.WEIGHT, W), C(CondKind.WEIGHT, B), *BN_WEIGHTS)
MM_BN_LAW = L("mm-bn", _bn(A(Op.MM, X, W)), A(Op.ADDMM, P_TERM, X, A(Op.MUL, W, R_TERM)),
              IEEE, C(CondKind.WEIGHT, W), *BN_WEIGHTS)
CHANNEL_VIEW = A(Op.VIEW, B, shape=(F(AttrFnKind.SIZE, W, 0),))
CONV_BIAS_LAW = L("conv-bias", A(Op.ADD, conv(X, W), B), conv(X, W, CHANNEL_VIEW), IEEE,
                  C(CondKind.WEIGHT, B), C(CondKind.GUARD, "channel-bias"))
CONV_SQUEEZE_BIAS_LAW = L(
    "conv-squeeze-bias", A(Op.ADD, A(Op.SQUEEZE, conv(X, W), dims=PVar("dims")), B),
    A(Op.SQUEEZE, conv(X, W, CHANNEL_VIEW), dims=PVar("dims")), IEEE,
    C(CondKind.WEIGHT, B), C(CondKind.GUARD, "squeezed-channel-bias"))
MOVE_ATTRS = {Op.VIEW: "shape", Op.PERMUTE: "dims", Op.EXPAND: "shape", Op.SQUEEZE: "dims",
              Op.UNSQUEEZE: "dim"}
SCALE_SINK_LAWS = tuple(
    L(f"scale-sink.{op.text}", A(Op.MUL, A(op, Y, **{key: PVar("a")}), S),
      A(op, A(Op.MUL, Y, S), **{key: PVar("a")}), EXACT,
      C(CondKind.FLOAT, Y), C(CondKind.FINITE_NONZERO, S))
    for op, key in MOVE_ATTRS.items())
AV, BV = PVar("a"), PVar("b")
SCALE_INTO_MATMUL_LAWS = tuple(
    L(f"scale-into-matmul.{op.text}.{side}", A(Op.MUL, A(op, AV, BV), S),
      A(op, A(Op.MUL, AV, S), BV) if side == "left" else A(op, AV, A(Op.MUL, BV, S)), IEEE,
      C(CondKind.FINITE_NONZERO, S), C(CondKind.GUARD, "scale-side"))
    for op in (Op.MM, Op.BMM) for side in ("left", "right"))
SCALE_INTO_ADDMM_LAW = L("scale-into-addmm", A(Op.MUL, A(Op.ADDMM, B, X, W), S),
                         A(Op.ADDMM, A(Op.MUL, B, S), X, A(Op.MUL, W, S)), IEEE,
                         C(CondKind.FINITE_NONZERO, S), C(CondKind.WEIGHT, B),
                         C(CondKind.WEIGHT, W))

G_COLUMNS = A(Op.VIEW, PVar("g"), shape=(F(AttrFnKind.SIZE, W, 1),))
COLUMN_SCALE_LAW = L("column-scale-into-addmm",
                     A(Op.MUL, A(Op.VIEW, A(Op.ADDMM, B, X, W, beta=1, alpha=1),
                                 shape=PVar("shape")), PVar("g")),
                     A(Op.VIEW, A(Op.ADDMM, A(Op.MUL, B, G_COLUMNS), X, A(Op.MUL, W, G_COLUMNS),
                                  beta=1, alpha=1), shape=PVar("shape")),
                     IEEE, C(CondKind.WEIGHT, W), C(CondKind.WEIGHT, B),
                     C(CondKind.WEIGHT, PVar("g")), C(CondKind.GUARD, "column-scale"))

RULES = (
    Rule("conv-bn", On(Op.BATCH_NORM, conv_pattern, *bn_operands), _fold_bn_into_conv, IEEE,
         guard=_conv_weights_only, laws=CONV_BN_LAWS),  # bn(conv(x, W, B)) -> conv(x, W*R, B*R + P)
    Rule("linear-bn", On(Op.BATCH_NORM, On(Op.ADDMM, Var("b", w_), Var("x"), Var("w", w_),
                                           name="mm", where=plain_gemm, describe="beta=alpha=1"),
                         *bn_operands),
         _fold_bn_into_addmm, IEEE, laws=(LINEAR_BN_LAW,)),
    # bn(addmm(b, x, W)) -> addmm(b*R + P, x, W*R)
    Rule("mm-bn", On(Op.BATCH_NORM, On(Op.MM, Var("x"), Var("w", w_), name="mm"),
                     *bn_operands),
         _fold_bn_into_mm, IEEE, guard=_bn_per_column, laws=(MM_BN_LAW,)),
    # bn(mm(x, W)) -> addmm(P, x, W*R)
    Rule("conv-bias", On(Op.ADD, On(Op.CONVOLUTION, Var("x"), Var("w"), name="conv",
                                    where=_not_transposed, describe="not transposed"),
                         Var("b", w_)),
         _bias_into_conv, IEEE, guard=_channel_bias, laws=(CONV_BIAS_LAW,)),
    # conv(x, W) + b -> conv(x, W, b)
    Rule("conv-squeeze-bias",
         On(Op.ADD, On(Op.SQUEEZE, On(Op.CONVOLUTION, Var("x"), Var("w"), name="conv",
                                      where=_not_transposed, describe="not transposed"),
                       name="move"),
            Var("b", w_)),
         lambda m: m.op(Op.SQUEEZE, _bias_into_conv(m), attrs=m["move"].attrs),
         IEEE, guard=lambda m: _squeezed_channel_bias(m), laws=(CONV_SQUEEZE_BIAS_LAW,)),
    # squeeze(conv(x,W))+b -> squeeze(conv(x,W,b))
    Rule("scale-sink", On(Op.MUL, On(MOVES, Var("y", FloatDType()), name="move"), scale),
         _sink_scale, EXACT, laws=SCALE_SINK_LAWS),  # move(y)*s -> move(y*s)
    Rule("scale-into-matmul", On(Op.MUL, On({Op.MM, Op.BMM}, Var("a"), Var("b"), name="mm"), scale),
         _scale_into_matmul, IEEE, guard=_scale_side, laws=SCALE_INTO_MATMUL_LAWS),
    # (a@b)*s -> (a*s)@b
    Rule("scale-into-addmm", On(Op.MUL, On(Op.ADDMM, Var("b", w_), Var("x"), Var("w", w_),
                                           name="mm", where=plain_gemm, describe="beta=alpha=1"),
                                scale),
         _scale_into_addmm, IEEE, laws=(SCALE_INTO_ADDMM_LAW,)),
    # addmm(b, x, W)*s -> addmm(b*s, x, W*s)
    Rule("column-scale-into-addmm",
         On(Op.MUL, On(Op.VIEW, On(Op.ADDMM, Var("b", w_), Var("x"), Var("w", w_), name="mm",
                                   where=plain_gemm, describe="beta=alpha=1"), name="view"),
            Var("g", w_)),
         _column_scale_into_addmm, IEEE, guard=_column_scale, laws=(COLUMN_SCALE_LAW,)),
    # view(addmm(b, x, W))*g -> view(addmm(b*g, x, W*g)), g a weight per column
)


def _squeezed_channel_bias(m: Match) -> str | None:
    if m["b"].type.dtype != m.root.type.dtype:
        return "the bias has another dtype"
    return _per_channel(m["conv"].type.shape, m["b"], m["move"].attrs.dims)
