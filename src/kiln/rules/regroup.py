"""A grouped convolution with narrow groups runs as one with half as many groups, each pair of
groups joined by a block-diagonal weight (zeros off the diagonal).

    conv(x, W, groups=g)  ->  conv(x, W', groups=g/2)
    W' row block j: [W_j, 0] for even j, [0, W_j] for odd j

The new convolution does twice the multiplications, half of them by zero, and on a CPU can
still be faster: with 4 channels a group a vector of 8 or 16 lanes is mostly idle. On this
project's 2-core Zen 3 machine, ResNeXt-50's first-stage 3x3 (128 channels, 32 groups,
56x56, channels-last) took 1447 us in ATen and 1026 us as 16 groups; its second stage's (8
channels a group) was faster as it was (556 against 691 us). Whether it pays is a question of
cost, so no greedy pass runs this rule: the cost-based search (`kiln.search`) tries it and
keeps it where the measured time says so, as TASO does with its kernel enlargement.

Safety is fast math: in the reals the added products are zero, but 0 * inf is NaN, so an
infinite or NaN input channel reaches the other group of its pair, and a sum of -0 products
plus +0 ones is +0.
"""

from __future__ import annotations

import dataclasses

from kiln.ir.attrs import DimAttrs, FullAttrs, SplitAttrs
from kiln.ir.graph import Value
from kiln.ir.ops import Op
from kiln.rewrite.law import A, App, AttrFnKind, C, CondKind, F, L, PVar, Term
from kiln.rewrite.pattern import On, Var, Weight
from kiln.rewrite.rule import FAST_MATH, Match, Rule

# groups up to this many input channels wide are joined in pairs; wider ones already fill a
# vector, and doubling their work was slower in every case measured (module docstring)
MAX_GROUP_CHANNELS = 8


def _narrow_groups(m: Match) -> str | None:
    root = m.root
    groups = root.attrs.groups  # type: ignore[attr-defined]
    width = m["w"].type.shape[1]
    if getattr(root.attrs, "transposed", False):
        return "a transposed convolution"
    if groups < 2 or groups % 2:
        return f"{groups} group(s): not an even count"
    if width == 1:
        return "a depthwise convolution (its own kernels serve it)"
    if width > MAX_GROUP_CHANNELS:
        return f"{width} channels a group fill a vector already"
    return None


def _regroup(m: Match) -> Value:
    root = m.root
    w = m["w"]
    groups = root.attrs.groups  # type: ignore[attr-defined]
    rows = w.type.shape[0] // groups
    pieces = m.node(Op.SPLIT, w, attrs=SplitAttrs((rows,) * groups, 0)).outputs
    zeros = m.op(Op.FULL, attrs=FullAttrs((rows, *w.type.shape[1:]), 0.0, w.type.dtype))
    blocks = [m.op(Op.CAT, *((piece, zeros) if j % 2 == 0 else (zeros, piece)),
                   attrs=DimAttrs(1)) for j, piece in enumerate(pieces)]
    wide = m.op(Op.CAT, *blocks, attrs=DimAttrs(0))
    attrs = dataclasses.replace(root.attrs, groups=groups // 2)
    return m.op(root.op, root.inputs[0], wide, *root.inputs[2:], attrs=attrs, name=root.name)


# The laws state one pair (2 groups -> 1); g groups are g/2 such pairs side by side. The
# input is written as its two groups' halves, so that instances on small shapes line up.
X0, X1, W0, W1 = PVar("x0"), PVar("x1"), PVar("w0"), PVar("w1")
X = A(Op.CAT, X0, X1, dim=1)
_GEOMETRY = {"stride": PVar("stride"), "padding": PVar("padding"),
             "dilation": PVar("dilation")}
_ZERO = A(Op.FULL, shape=F(AttrFnKind.SHAPE_OF, W0), value=0.0,
          dtype=F(AttrFnKind.DTYPE_OF, W0))
_PAIR = A(Op.CAT, W0, W1, dim=0)
_BLOCK_DIAGONAL = A(Op.CAT, A(Op.CAT, W0, _ZERO, dim=1), A(Op.CAT, _ZERO, W1, dim=1), dim=0)
_WHEN = (C(CondKind.WEIGHT, W0), C(CondKind.WEIGHT, W1), C(CondKind.SAME_TYPE, W0, W1))


def _conv(w: Term, groups: int) -> App:
    return A(Op.CONVOLUTION, X, w, transposed=False, output_padding=(0, 0), groups=groups,
             **_GEOMETRY)


def _conv_act(w: Term, groups: int) -> App:
    # the bias and residual operands pass through unchanged: the law leaves them out
    return A(Op.CONV_ACT, X, w, has_bias=False, has_residual=False, activation=Op.RELU,
             act_args=(), groups=groups, **_GEOMETRY)


REGROUP_LAWS = (
    L("conv-regroup.conv", _conv(_PAIR, 2), _conv(_BLOCK_DIAGONAL, 1), FAST_MATH, *_WHEN),
    L("conv-regroup.conv-act", _conv_act(_PAIR, 2), _conv_act(_BLOCK_DIAGONAL, 1), FAST_MATH,
      *_WHEN),
)

RULES = (
    Rule("conv-regroup",
         On({Op.CONVOLUTION, Op.CONV_ACT}, Var("x"), Var("w", Weight()), exact_arity=False),
         _regroup, FAST_MATH, guard=_narrow_groups, laws=REGROUP_LAWS),
    # conv(x, W, groups=g) -> conv(x, blockdiag pairs of W, groups=g/2); search only
)
