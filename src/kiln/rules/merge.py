"""Parallel contractions that read one input become one wider contraction and a split.

    q = addmm(bq, x, Wq); k = addmm(bk, x, Wk); v = addmm(bv, x, Wv)
        -> qkv = addmm(cat(bq, bk, bv), x, cat(Wq, Wk, Wv, dim=1)); q, k, v = split(qkv)

    gate = mm(x, Wg); up = mm(x, Wu)          (bias-free linears: LLaMA, T5)
        -> split(mm(x, cat(Wg, Wu, dim=1)))

    conv(x, W1, B1), conv(x, W2, B2) (same geometry)
        -> split(conv(x, cat(W1, W2), cat(B1, B2)), dim=1)

One GEMM reads x once and runs at a better shape. The pieces of a split are strided views;
every view a piece flows into is replayed on meta tensors first, and a merge whose views
would fail or copy on those strides is not made. Each output element sums the same products, but the
wider kernel may block the sum differently: equal up to rounding.
"""

from __future__ import annotations

from typing import Any

import torch

from kiln.ir.attrs import DimAttrs, PermuteAttrs, SplitAttrs
from kiln.ir.graph import Value
from kiln.ir.infer import META, meta_operand
from kiln.ir.ops import Op, OpGroup
from kiln.ir.semantics import lower_node, run_call
from kiln.rewrite.law import A, App, AttrFnKind, C, CondKind, F, L, PVar, Term
from kiln.rewrite.pattern import On, Siblings, Var, Weight
from kiln.rewrite.rule import IEEE, Match, Rule
from kiln.rules.laws_common import X, conv
from kiln.rules.support import plain_gemm

w_ = Weight()


def _addmm_key(b: dict[str, Any]) -> Any:
    node = b["_interior"][-1][0]
    bias = b["b"].type
    if len(bias.shape) != 1 or bias.shape[0] != b["w"].type.shape[1]:
        return ("unmergeable", node)  # a row-broadcast or matrix bias: keep apart
    return (node.op, node.attrs, b["w"].type.shape[0], b["w"].type.dtype)


def _conv_key(b: dict[str, Any]) -> Any:
    node = b["_interior"][-1][0]
    a = node.attrs
    w = b["w"].type
    if node.op is Op.CONV_ACT:
        if a.has_residual:
            return ("unmergeable", node)
        geometry: tuple[Any, ...] = (a.stride, a.padding, a.dilation, a.activation, a.act_args,
                                     a.has_bias)
    else:
        geometry = (a.stride, a.padding, a.dilation, a.transposed, a.output_padding,
                    len(node.inputs) == 3)
    if a.groups != 1 or getattr(a, "transposed", False):
        return ("unmergeable", node)
    return (node.op, geometry, w.shape[1:], w.dtype)


def _cat_weights(m: Match, weights: list[Value]) -> Value:
    """cat(W_i, dim=1). Weights stored transposed (nn.Linear's) are joined as
    permute(cat(permute(W_i), dim=0)), so the GEMM keeps reading a transposed view: measured
    faster here than a contiguous copy (see kiln.passes.fold)."""
    if all(_stored_transposed(m, w) for w in weights):
        flip = PermuteAttrs((1, 0))
        inner = m.op(Op.CAT, *[m.op(Op.PERMUTE, w, attrs=flip) for w in weights],
                     attrs=DimAttrs(0))
        return m.op(Op.PERMUTE, inner, attrs=flip)
    return m.op(Op.CAT, *weights, attrs=DimAttrs(1))


def _stored_transposed(m: Match, w: Value) -> bool:
    node = w.node
    if node.op is Op.PERMUTE:
        return node.attrs.dims == (1, 0)  # type: ignore[attr-defined]
    if node.op is Op.CONSTANT:
        t = m.ctx.graph.constant(node)
        return t.dim() == 2 and t.stride(0) == 1 and t.shape[0] > 1
    return False


def _merge_gemm(m: Match) -> list[Value]:
    """addmm/addmm_act siblings (their biases joined too), or mm siblings."""
    members = m.members
    first = members[0]["_root"]
    w = _cat_weights(m, [mb["w"] for mb in members])
    if first.op is Op.MM:
        merged = m.op(Op.MM, members[0]["x"], w, attrs=first.attrs, name=first.name)
    else:
        b = m.op(Op.CAT, *[mb["b"] for mb in members], attrs=DimAttrs(0))
        merged = m.op(first.op, b, members[0]["x"], w, attrs=first.attrs, name=first.name)
    sizes = tuple(mb["_root"].type.shape[1] for mb in members)
    return list(m.node(Op.SPLIT, merged, attrs=SplitAttrs(sizes, 1)).outputs)


def _mm_key(b: dict[str, Any]) -> Any:
    node = b["_interior"][-1][0]
    return (node.op, b["w"].type.shape[0], b["w"].type.dtype)


def _merge_conv(m: Match) -> list[Value]:
    members = m.members
    first = members[0]["_root"]
    w = m.op(Op.CAT, *[mb["w"] for mb in members], attrs=DimAttrs(0))
    operands = [members[0]["x"], w]
    if len(first.inputs) == 3:
        operands.append(m.op(Op.CAT, *[mb["_root"].inputs[2] for mb in members],
                             attrs=DimAttrs(0)))
    merged = m.op(first.op, *operands, attrs=first.attrs, name=first.name)
    sizes = tuple(mb["_root"].type.shape[1] for mb in members)
    return list(m.node(Op.SPLIT, merged, attrs=SplitAttrs(sizes, 1)).outputs)


def _pieces_work(m: Match) -> str | None:
    """Every operand is a weight, and every view downstream of a piece accepts its strides."""
    members = m.members
    for mb in members:
        root = mb["_root"]
        for v in root.inputs[2:] if root.op in (Op.CONVOLUTION, Op.CONV_ACT) else ():
            if not m.ctx.is_weight_only(v):
                return f"the bias of {root.name} is not a weight"
    roots = [mb["_root"] for mb in members]
    sizes = [r.type.shape[1] for r in roots]
    shape = list(roots[0].type.shape)
    shape[1] = sum(sizes)
    merged = torch.empty(shape, dtype=roots[0].type.dtype.torch, device=META)
    for root, piece in zip(roots, merged.split(sizes, 1)):
        alone = torch.empty(root.type.shape, dtype=root.type.dtype.torch, device=META)
        reason = _views_accept(root.out(), piece, alone, m)
        if reason:
            return reason
    return None


def _views_accept(value: Value, tensor: torch.Tensor, alone: torch.Tensor,
                  m: Match) -> str | None:
    """Every view downstream of ``value`` works on ``tensor`` (its merged piece) and copies
    it only where it copies ``alone`` (the unmerged value) too: a reshape of an expanded
    tensor (LLaMA's grouped keys and values) copies either way."""
    for user in m.ctx.users.get(value.node, []):
        if not user.op.is_a(OpGroup.VIEW) or user.inputs[0] != value:
            continue
        rest = [meta_operand(v) for v in user.inputs[1:]]
        try:
            results = run_call(lower_node(user), [tensor, *rest], META)
        except RuntimeError as err:
            return f"{user.name} cannot view a merged piece: {str(err).splitlines()[0]}"
        unmerged = run_call(lower_node(user), [alone, *rest], META)
        if user.op is Op.VIEW and not results[0]._is_view() and unmerged[0]._is_view():
            # (the IR's view is a reshape)
            return f"{user.name} would copy a merged piece: its strides allow no view"
        for out, result, before in zip(user.outputs, results, unmerged, strict=True):
            reason = _views_accept(out, result, before, m)
            if reason:
                return reason
    return None




parallel_addmm = On({Op.ADDMM, Op.ADDMM_ACT}, Var("b", w_), Var("x"), Var("w", w_),
                    where=plain_gemm, describe="beta=alpha=1")
parallel_mm = On({Op.MM}, Var("x"), Var("w", w_))
parallel_conv = On({Op.CONVOLUTION, Op.CONV_ACT}, Var("x"), Var("w", w_), exact_arity=False)

# two siblings; the rule takes any number, and the algebra is the same
B1, B2, W1, W2 = PVar("b1"), PVar("b2"), PVar("w1"), PVar("w2")


def _pieces(merged: App, w1: Term, w2: Term, dim: int) -> tuple[App, App]:
    sizes = (F(AttrFnKind.SIZE, w1, dim), F(AttrFnKind.SIZE, w2, dim))
    return (A(Op.SPLIT, merged, sizes=sizes, dim=1, output=0),
            A(Op.SPLIT, merged, sizes=sizes, dim=1, output=1))


MERGE_ADDMM_LAW = L(
    "merge-parallel-addmm", (A(Op.ADDMM, B1, X, W1), A(Op.ADDMM, B2, X, W2)),
    _pieces(A(Op.ADDMM, A(Op.CAT, B1, B2, dim=0), X, A(Op.CAT, W1, W2, dim=1)), W1, W2, 1),
    IEEE, *(C(CondKind.WEIGHT, v) for v in (B1, B2, W1, W2)))
MERGE_MM_LAW = L(
    "merge-parallel-mm", (A(Op.MM, X, W1), A(Op.MM, X, W2)),
    _pieces(A(Op.MM, X, A(Op.CAT, W1, W2, dim=1)), W1, W2, 1),
    IEEE, C(CondKind.WEIGHT, W1), C(CondKind.WEIGHT, W2))
MERGE_CONV_LAWS = (
    L("merge-parallel-conv.no-bias", (conv(X, W1), conv(X, W2)),
      _pieces(conv(X, A(Op.CAT, W1, W2, dim=0)), W1, W2, 0), IEEE,
      C(CondKind.WEIGHT, W1), C(CondKind.WEIGHT, W2)),
    L("merge-parallel-conv.bias", (conv(X, W1, B1), conv(X, W2, B2)),
      _pieces(conv(X, A(Op.CAT, W1, W2, dim=0), A(Op.CAT, B1, B2, dim=0)), W1, W2, 0), IEEE,
      *(C(CondKind.WEIGHT, v) for v in (B1, B2, W1, W2))),
)

RULES = (
    Rule("merge-parallel-addmm", Siblings(parallel_addmm, "x", _addmm_key), _merge_gemm, IEEE,
         guard=_pieces_work, laws=(MERGE_ADDMM_LAW,)),
    # addmm(b_i, x, W_i) -> split(addmm(cat b, x, cat W))
    Rule("merge-parallel-mm", Siblings(parallel_mm, "x", _mm_key), _merge_gemm, IEEE,
         guard=_pieces_work, laws=(MERGE_MM_LAW,)),
    # mm(x, W_i) -> split(mm(x, cat W))
    Rule("merge-parallel-conv", Siblings(parallel_conv, "x", _conv_key), _merge_conv, IEEE,
         guard=_pieces_work, laws=MERGE_CONV_LAWS),
    # conv(x, W_i, B_i) -> split(conv(x, cat W, cat B))
)
