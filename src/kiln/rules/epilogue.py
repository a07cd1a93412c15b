"""Epilogue fusion: a bias, a residual add and an activation ride on the contraction.

    act(addmm(b, x, W))        -> addmm_act(b, x, W){act}
    act(view(addmm(b, x, W)))  -> view(addmm_act(b, x, W){act})
    act(mm(x, W))              -> addmm_act(0.0, x, W){act}       (and through a view)
    conv(x, W, B) + r          -> conv_act(x, W, B, r){none}
    act(conv(x, W, B))         -> conv_act(x, W, B){act}
    act(view(conv(x, W, B)))   -> view(conv_act(x, W, B){act})   (1-d ones run as 2-d ones)
    act(conv_act(...){none})   -> conv_act(...){act}

The fused ops run the same ATen kernels, with the epilogue in place on the contraction's
output (see kiln.ir.fused), so every row is exact. A GEMM without a bias gets a bias of +0.0,
the value ATen's mm starts its sums from (so a sum of -0.0 products is +0.0 either way; the
law checker refuted a -0.0 bias with such a sum), so that its activation runs in the GEMM's
write-back too (T5's feed-forward relu(x @ Wi) took 80-117 us a layer as its own pass); not
where another GEMM reads the same input, which `kiln.rules.merge` joins into one.
"""

from __future__ import annotations

from typing import Any

from kiln.ir.attrs import AddmmActAttrs, ConvActAttrs, FullAttrs
from kiln.ir.fused import ACTIVATIONS, activation_args
from kiln.ir.graph import Node, Value
from kiln.ir.ops import Op, OpGroup
from kiln.rewrite.law import A, App, AttrFnKind, C, CondKind, F, L, Law, PVar, Term
from kiln.rewrite.pattern import On, Var
from kiln.rewrite.rule import EXACT, IEEE, Match, Rule
from kiln.rules.laws_common import CONV_ATTRS, B, R, W, X, act_args
from kiln.rules.laws_common import activation as act_term
from kiln.rules.laws_common import conv as conv_term


def _addmm_act(m: Match) -> Value:
    mm = m["mm"]
    attrs = AddmmActAttrs(m.root.op, activation_args(m.root), mm.attrs.beta, mm.attrs.alpha)
    return m.op(Op.ADDMM_ACT, *mm.inputs, attrs=attrs, name=mm.name)


def _addmm_view_act(m: Match) -> Value:
    view = m["view"]
    return m.op(Op.VIEW, _addmm_act(m), attrs=view.attrs, name=view.name)


def _mm_act(m: Match) -> Value:
    mm = m["mm"]
    out = mm.outputs[0].type
    bias = m.op(Op.FULL, attrs=FullAttrs((out.shape[1],), 0.0, out.dtype))
    attrs = AddmmActAttrs(m.root.op, activation_args(m.root), 1, 1)
    return m.op(Op.ADDMM_ACT, bias, *mm.inputs, attrs=attrs, name=mm.name)


def _mm_view_act(m: Match) -> Value:
    view = m["view"]
    return m.op(Op.VIEW, _mm_act(m), attrs=view.attrs, name=view.name)


_GEMMS = (Op.MM, Op.ADDMM, Op.ADDMM_ACT)


def _no_sibling_gemm(m: Match) -> str | None:
    """The mm's input feeds no other GEMM: siblings are merged into one wide GEMM instead
    (Llama's gate and up projections, whose silu(gate) * up is one row kernel over the
    merged output), which an activation on one of them would stop. Not where the
    activation only feeds GEMMs (through views): nothing joins it with a sibling, and the
    merged GEMM would leave the activation a pass of its own over its piece (Falcon's
    parallel attention and MLP read one layer norm: gelu(x @ W_fc) next to x @ W_qkv)."""
    x = m["x"].node
    others = [u for u in m.ctx.users.get(x, []) if u is not m["mm"] and u.op in _GEMMS]
    if others and not _feeds_only_gemms(m, m.root):
        return f"{others[0].name} reads the same input (the GEMMs merge instead)"
    return None


def _feeds_only_gemms(m: Match, node: Node) -> bool:
    """Every use of ``node``'s value, through views, is the left operand of a GEMM."""
    users = m.ctx.users.get(node, [])
    outputs = m.ctx.graph.outputs
    return bool(users) and not any(v in outputs for v in node.outputs) and all(
        _feeds_only_gemms(m, u) if u.op.is_a(OpGroup.VIEW) and u.inputs[0].node is node
        else u.op in _GEMMS and u.inputs[0 if u.op is Op.MM else 1].node is node
        and node not in [v.node for v in u.inputs[(1 if u.op is Op.MM else 2):]]
        for u in users)


def _float_product(m: Match) -> str | None:
    if not m["mm"].outputs[0].type.dtype.is_floating:
        return "an integer product (ATen's addmm_act is for floats)"
    return None


def _sums_terms(m: Match) -> str | None:
    """A product of one term (K = 1) is that term, the sign of a zero included: ATen's mm
    gives -0.0 for -0.0 x 1, and 0.0 + -0.0, the zero bias's sum, is 0.0 (fuzz seed 57,
    graph 6851: tanh of such a product). From two terms on the library's mm and addmm sum
    from +0.0 alike: ATen, M, N in 1..64, K in 2..64, one row of -0.0."""
    if m["mm"].inputs[0].type.shape[-1] == 1:
        return "one term a dot product (K = 1): a zero bias would drop a -0.0's sign"
    return None


def _plain_mm(m: Match) -> str | None:
    return _float_product(m) or _sums_terms(m) or _no_sibling_gemm(m)


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


def _conv_view_act(m: Match) -> Value:
    view = m["view"]
    return m.op(Op.VIEW, _conv_act(m), attrs=view.attrs, name=view.name)


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
mm = On(Op.MM, Var("x"), Var("w"), name="mm")
conv = On(Op.CONVOLUTION, Var("x"), Var("w"), exact_arity=False, name="conv",
          where=_plain_2d_conv, describe="a 2-d convolution, not transposed")

# act(addmm(b, x, W)) -> addmm_act(b, x, W){act}, and the same through a view
_GEMM_ATTRS = {"beta": PVar("beta"), "alpha": PVar("alpha")}


def _addmm_act_law(act: Op, through_view: bool) -> Law:
    inner = A(Op.ADDMM, B, X, W, **_GEMM_ATTRS)
    fused = A(Op.ADDMM_ACT, B, X, W, activation=act, act_args=act_args(act), **_GEMM_ATTRS)
    if through_view:
        shape = {"shape": PVar("shape")}
        return L(f"addmm-view-act.{act.text}", act_term(act, A(Op.VIEW, inner, **shape)),
                 A(Op.VIEW, fused, **shape), EXACT)
    return L(f"addmm-act.{act.text}", act_term(act, inner), fused, EXACT)


# the bias of a GEMM that has none: a vector of zeros, one per output column
ZERO_BIAS = A(Op.FULL, shape=(F(AttrFnKind.SIZE, W, 1),), value=0.0,
              dtype=F(AttrFnKind.DTYPE_OF, X))


def _mm_act_law(act: Op, through_view: bool) -> Law:
    fused = A(Op.ADDMM_ACT, ZERO_BIAS, X, W, activation=act, act_args=act_args(act),
              beta=1, alpha=1)
    guard = C(CondKind.GUARD, "plain-mm")
    if through_view:
        shape = {"shape": PVar("shape")}
        return L(f"mm-view-act.{act.text}", act_term(act, A(Op.VIEW, A(Op.MM, X, W), **shape)),
                 A(Op.VIEW, fused, **shape), IEEE, guard)
    return L(f"mm-act.{act.text}", act_term(act, A(Op.MM, X, W)), fused, IEEE, guard)


def _conv_act_term(*operands: Term, bias: bool, residual: bool, act: Op | None) -> App:
    return A(Op.CONV_ACT, *operands, has_bias=bias, has_residual=residual, activation=act,
             act_args=act_args(act) if act else (), **CONV_ATTRS)


_ACTS = sorted(ACTIVATIONS, key=lambda op: op.text)
CONV_RESIDUAL_LAWS = (
    L("conv-residual.no-bias", A(Op.ADD, conv_term(X, W), R),
      _conv_act_term(X, W, R, bias=False, residual=True, act=None), EXACT,
      C(CondKind.GUARD, "same-shape-residual")),
    L("conv-residual.bias", A(Op.ADD, conv_term(X, W, B), R),
      _conv_act_term(X, W, B, R, bias=True, residual=True, act=None), EXACT,
      C(CondKind.GUARD, "same-shape-residual")),
)
CONV_ACT_LAWS = tuple(
    L(f"conv-act.{act.text}.{'bias' if bias else 'no-bias'}",
      act_term(act, conv_term(X, W, B) if bias else conv_term(X, W)),
      _conv_act_term(*((X, W, B) if bias else (X, W)), bias=bias, residual=False, act=act), EXACT)
    for act in _ACTS for bias in (False, True))
CONV_VIEW_ACT_LAWS = tuple(
    L(f"conv-view-act.{act.text}.{'bias' if bias else 'no-bias'}",
      act_term(act, A(Op.VIEW, conv_term(X, W, B) if bias else conv_term(X, W),
                      shape=PVar("shape"))),
      A(Op.VIEW, _conv_act_term(*((X, W, B) if bias else (X, W)), bias=bias, residual=False,
                                act=act), shape=PVar("shape")), EXACT)
    for act in _ACTS for bias in (False, True))
CONV_ACT_EPILOGUE_LAWS = tuple(
    L(f"conv-act-epilogue.{act.text}",
      act_term(act, _conv_act_term(X, W, B, R, bias=True, residual=True, act=None)),
      _conv_act_term(X, W, B, R, bias=True, residual=True, act=act), EXACT)
    for act in _ACTS)

RULES = (
    Rule("addmm-act", On(ACTIVATIONS, addmm), _addmm_act, EXACT,
         laws=tuple(_addmm_act_law(act, False) for act in _ACTS)),  # act(addmm) -> addmm_act
    Rule("addmm-view-act", On(ACTIVATIONS, On(Op.VIEW, addmm, name="view")),
         _addmm_view_act, EXACT, laws=tuple(_addmm_act_law(act, True) for act in _ACTS)),
    # act(view(addmm)) -> view(addmm_act)
    Rule("mm-act", On(ACTIVATIONS, mm), _mm_act, IEEE, guard=_plain_mm,
         laws=tuple(_mm_act_law(act, False) for act in _ACTS)),
    # act(mm) -> addmm_act(0, ...)
    Rule("mm-view-act", On(ACTIVATIONS, On(Op.VIEW, mm, name="view")), _mm_view_act, IEEE,
         guard=_plain_mm, laws=tuple(_mm_act_law(act, True) for act in _ACTS)),
    # act(view(mm)) -> view(addmm_act(0, ...))
    Rule("conv-residual", On(Op.ADD, conv, Var("r")), _conv_residual, EXACT,
         guard=_same_shape_residual, laws=CONV_RESIDUAL_LAWS),
    # conv(x, W, B) + r -> conv_act(x, W, B, r)
    Rule("conv-act", On(ACTIVATIONS, conv), _conv_act, EXACT,
         laws=CONV_ACT_LAWS),  # act(conv) -> conv_act
    Rule("conv-view-act", On(ACTIVATIONS, On(Op.VIEW, conv, name="view")), _conv_view_act,
         EXACT, laws=CONV_VIEW_ACT_LAWS),
    # act(view(conv)) -> view(conv_act): a 1-d convolution run as a 2-d one
    # (`kiln.passes.conv1d`), a flattened one
    Rule("conv-act-epilogue",
         On(ACTIVATIONS, On(Op.CONV_ACT, Var("x"), exact_arity=False, name="conv",
                            where=_no_activation, describe="without an activation")),
         _add_activation, EXACT, laws=CONV_ACT_EPILOGUE_LAWS),
    # act(conv_act{none}) -> conv_act{act}
)
