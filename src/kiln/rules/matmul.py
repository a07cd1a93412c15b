"""Better use of the GEMM intrinsics: bias additions, residual sums and transposes go into
the call.

ATen's GEMMs read transposed operands in place (BLAS's trans flags), so a transpose before a
matmul costs nothing and a contiguous copy of one is wasted work. A transposed weight is
folded into a constant view at compile time by the fold pass.
Adding the bias inside the GEMM changes where it enters the sum: equal up to rounding.

A residual added to a GEMM's output seen through a view (a Linear on [B, T, C] runs as
``view(addmm(b, x2d, W))``; LeViT's Linear + BatchNorm blocks) joins the bias, so the GEMM's
tiles start from it (`kiln.passes.partition.gemms`) and the add is no pass of its own::

    view(addmm(b, x, W)) + r  ->  view(addmm(view(r, [M, N]) + b, x, W))
"""

from __future__ import annotations

from kiln.ir.attrs import AddmmAttrs, ShapeAttrs
from kiln.ir.graph import Node, Value
from kiln.ir.ops import Op, OpGroup
from kiln.rewrite.law import A, AttrFnKind, C, CondKind, F, L, PVar
from kiln.rewrite.pattern import On, Rank, Var
from kiln.rewrite.rule import IEEE, Match, Rule
from kiln.rules.support import plain_gemm


def _row_bias(m: Match) -> str | None:
    b, out = m["b"].type, m.root.type
    if len(b.shape) > 2 or b.dtype != out.dtype:
        return "the bias must be a vector or matrix of the result's dtype"
    if m["mm"].type != out:  # ATen's addmm expands the bias to the product, of its dtype
        return "the add broadcasts the product to a larger shape or promotes its dtype"
    return None


def _residual_of_view(m: Match) -> str | None:
    """The add sums the GEMM's output, seen as another shape, with a residual of that same
    shape and dtype (no broadcast: the residual then has one value per output element), and
    the bias is a row or an [M, N] matrix."""
    r, out, product = m["r"].type, m.root.type, m["mm"].type
    if not r == m["view"].type == out or len(product.shape) != 2 or out.dtype != product.dtype:
        return "the residual must have the add's own shape and dtype"
    if m["b"].type.shape not in (product.shape[1:], product.shape):
        return "the bias must be a row of the product or of its shape"
    reader = _fusing_reader(m, m.root)
    if reader is not None:
        return f"{reader.name} reads the sum: its kernel computes the add"
    return None


def _fusing_reader(m: Match, node: Node) -> Node | None:
    """A reader of ``node``'s value (through views and permutes) that is no contraction and
    no add: a layer norm, an RMSNorm's square, an activation. `kiln.passes.partition`
    already computes the sum in that reader's kernel (GPT-2's ln(x + attn), the sum also
    written for the next layer), so the add is no pass of its own there and moving it buys
    nothing: in-process A/B with the rule firing there, hf_gpt2, bert, hf_vit and hf_bert
    ran 1.01-1.05x the time, inside this machine's noise (0.93-1.13 for two identical
    builds). LeViT's residual stream has only GEMMs and adds for readers, ConvNeXt's a
    depthwise convolution and the next add: there the add ran alone."""
    for user in m.ctx.users.get(node, []):
        if user.op.is_a(OpGroup.VIEW):
            found = _fusing_reader(m, user)
            if found is not None:
                return found
        elif user.op is not Op.ADD and not user.op.is_a(OpGroup.CONTRACTION):
            return user
    return None


def _residual_into_bias(m: Match) -> Value:
    product = m["mm"].out()
    residual = m.op(Op.VIEW, m["r"], attrs=ShapeAttrs(product.type.shape))
    bias = m.op(Op.ADD, residual, m["b"])
    gemm = m.op(Op.ADDMM, bias, m["x"], m["w"], attrs=m["mm"].attrs, name=m["mm"].name)
    return m.op(Op.VIEW, gemm, attrs=m["view"].attrs, name=m["view"].name)


X, W, B, R = PVar("x"), PVar("w"), PVar("b"), PVar("r")
_PRODUCT_SHAPE = (F(AttrFnKind.SIZE, X, 0), F(AttrFnKind.SIZE, W, 1))

RULES = (
    Rule("mm-add-to-addmm", On(Op.ADD, On(Op.MM, Var("x"), Var("w"), name="mm"),
                               Var("b", Rank(1, 2))),
         lambda m: m.op(Op.ADDMM, m["b"], m["x"], m["w"], attrs=AddmmAttrs(1, 1)),
         IEEE, guard=_row_bias,
         laws=(L("mm-add-to-addmm", A(Op.ADD, A(Op.MM, X, W), B),
                 A(Op.ADDMM, B, X, W, beta=1, alpha=1), IEEE, C(CondKind.GUARD, "row-bias")),)),
    # mm(x, w) + b -> addmm(b, x, w)
    Rule("addmm-view-residual",
         On(Op.ADD, On(Op.VIEW, On(Op.ADDMM, Var("b"), Var("x"), Var("w"), name="mm",
                                   where=plain_gemm, describe="beta = alpha = 1"),
                       name="view"), Var("r")),
         _residual_into_bias, IEEE, guard=_residual_of_view,
         laws=(L("addmm-view-residual",
                 A(Op.ADD, A(Op.VIEW, A(Op.ADDMM, B, X, W, beta=1, alpha=1),
                             shape=PVar("shape")), R),
                 A(Op.VIEW, A(Op.ADDMM, A(Op.ADD, A(Op.VIEW, R, shape=_PRODUCT_SHAPE), B),
                              X, W, beta=1, alpha=1), shape=PVar("shape")),
                 IEEE, C(CondKind.GUARD, "residual-of-view")),)),
    # view(addmm(b, x, w)) + r -> view(addmm(view(r) + b, x, w))
    Rule("mm-skip-copy", On(Op.MM, On(Op.CLONE, Var("x")), Var("w")),
         lambda m: m.op(Op.MM, m["x"], m["w"]), IEEE,
         laws=(L("mm-skip-copy", A(Op.MM, A(Op.CLONE, X), W), A(Op.MM, X, W), IEEE),)),
    # mm(contiguous(x), w) -> mm(x, w)
    Rule("addmm-skip-copy", On(Op.ADDMM, Var("b"), On(Op.CLONE, Var("x")), Var("w"),
                               where=plain_gemm, describe="beta = alpha = 1"),
         lambda m: m.op(Op.ADDMM, m["b"], m["x"], m["w"], attrs=m.root.attrs),
         IEEE,
         laws=(L("addmm-skip-copy", A(Op.ADDMM, B, A(Op.CLONE, X), W, beta=1, alpha=1),
                 A(Op.ADDMM, B, X, W, beta=1, alpha=1), IEEE),)),
    # addmm(b, contiguous(x), w) -> addmm(b, x, w)
    Rule("bmm-skip-copy", On(Op.BMM, On(Op.CLONE, Var("x")), Var("w")),
         lambda m: m.op(Op.BMM, m["x"], m["w"]), IEEE,
         laws=(L("bmm-skip-copy", A(Op.BMM, A(Op.CLONE, X), W), A(Op.BMM, X, W), IEEE),)),
    # bmm(contiguous(x), w) -> bmm(x, w)
)
