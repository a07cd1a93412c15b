"""Better use of the GEMM intrinsics: bias additions and transposes go into the call.

ATen's GEMMs read transposed operands in place (BLAS's trans flags), so a transpose before a
matmul costs nothing and a contiguous copy of one is wasted work. A transposed weight is
folded into a constant view at compile time by the fold pass.
Adding the bias inside the GEMM changes where it enters the sum: equal up to rounding.
"""

from __future__ import annotations

from kiln.ir.attrs import AddmmAttrs
from kiln.ir.ops import Op
from kiln.rewrite.law import A, C, CondKind, L, PVar
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



X, W, B = PVar("x"), PVar("w"), PVar("b")

RULES = (
    Rule("mm-add-to-addmm", On(Op.ADD, On(Op.MM, Var("x"), Var("w"), name="mm"),
                               Var("b", Rank(1, 2))),
         lambda m: m.op(Op.ADDMM, m["b"], m["x"], m["w"], attrs=AddmmAttrs(1, 1)),
         IEEE, guard=_row_bias,
         laws=(L("mm-add-to-addmm", A(Op.ADD, A(Op.MM, X, W), B),
                 A(Op.ADDMM, B, X, W, beta=1, alpha=1), IEEE, C(CondKind.GUARD, "row-bias")),)),
    # mm(x, w) + b -> addmm(b, x, w)
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
