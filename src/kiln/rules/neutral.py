"""Neutral and absorbing elements, and ops that undo themselves.

Signed zero decides the tags: x + (-0.0) is x for every x, but x + 0.0 turns -0.0 into
+0.0, so that form holds only for real numbers (or integers). Under a softmax it is exact:
softmax reads its row through exp(x - max), and ±0 give the same difference there, so a
zero mask added to attention scores (an all-True padding mask folded to zeros: HF ViT's 12
layers) goes. The engine rejects any rewrite that would change a type, so ``x*ones(3, 4)``
with x of shape (4,) never fires.
"""

from __future__ import annotations

from kiln.ir.attrs import FullAttrs
from kiln.ir.ops import Op
from kiln.ir.types import DType
from kiln.rewrite.law import A, AttrFnKind, C, CondKind, F, L, Lit, PVar
from kiln.rewrite.pattern import FloatDType, IntDType, On, Uniform, Var
from kiln.rewrite.rule import EXACT, FAST_MATH, Match, Rule
from kiln.rules.support import true_division


def _integer_product(m: Match) -> str | None:
    # an integer x times a float zero (a bf16 fill of 1e-300) is a float: -3 * 0.0 is -0.0
    if m.root.type.dtype.is_floating:
        return "the product is a float (a float zero times a negative integer is -0.0)"
    return None


def _zeros(m: Match):
    t = m.root.type
    return m.op(Op.FULL, attrs=FullAttrs(t.shape, False if t.dtype is DType.BOOL else 0, t.dtype))



def _normalized_sum_with_zero(op: Op) -> On:
    return On(op, On(Op.ADD, Var("x", FloatDType()), Uniform(0.0), shared=True))


def _without_zero(m: Match):
    return m.op(m.root.op, m["x"], attrs=m.root.attrs)


def _law_without_zero(op: Op):
    return L(f"{op.text}-add-zero", A(op, A(Op.ADD, X, Lit(0.0)), dim=PVar("d")),
             A(op, X, dim=PVar("d")), EXACT, C(CondKind.FLOAT, X))


x = Var("x")
X = PVar("x")
ZEROS = A(Op.FULL, shape=F(AttrFnKind.SHAPE_OF, X), value=0, dtype=F(AttrFnKind.DTYPE_OF, X))

RULES = (
    Rule("mul-one", On(Op.MUL, x, Uniform(1)), lambda m: m["x"], EXACT,
         laws=(L("mul-one", A(Op.MUL, X, Lit(1)), X, EXACT),)),  # x*1 -> x
    Rule("div-one", On(Op.DIV, x, Uniform(1), where=true_division, describe="true division"),
         lambda m: m["x"], EXACT,
         laws=(L("div-one", A(Op.DIV, X, Lit(1)), X, EXACT),)),  # x/1 -> x
    Rule("pow-one", On(Op.POW, x, Uniform(1)), lambda m: m["x"], EXACT,
         laws=(L("pow-one", A(Op.POW, X, Lit(1)), X, EXACT),)),  # x**1 -> x
    Rule("add-neg-zero", On(Op.ADD, x, Uniform(-0.0)), lambda m: m["x"], EXACT,
         laws=(L("add-neg-zero", A(Op.ADD, X, Lit(-0.0)), X, EXACT),)),  # x+(-0.0) -> x
    Rule("add-zero-int", On(Op.ADD, Var("x", IntDType()), Uniform(0)),
         lambda m: m["x"], EXACT,
         laws=(L("add-zero-int", A(Op.ADD, X, Lit(0)), X, EXACT, C(CondKind.INT, X)),)),
    # x+0 -> x (integers)
    Rule("add-zero", On(Op.ADD, Var("x", FloatDType()), Uniform(0.0)),
         lambda m: m["x"], FAST_MATH,
         laws=(L("add-zero", A(Op.ADD, X, Lit(0.0)), X, FAST_MATH, C(CondKind.FLOAT, X)),)),
    # x+0.0 -> x (wrong for x = -0.0)
    Rule("softmax-add-zero", _normalized_sum_with_zero(Op.SOFTMAX), _without_zero, EXACT,
         laws=(_law_without_zero(Op.SOFTMAX),)),
    # softmax(x+0) -> softmax(x): exp(x - max) cannot tell -0 from +0
    Rule("log_softmax-add-zero", _normalized_sum_with_zero(Op.LOG_SOFTMAX), _without_zero,
         EXACT, laws=(_law_without_zero(Op.LOG_SOFTMAX),)),
    # log_softmax(x+0) -> log_softmax(x): x - max - log(sum) likewise
    Rule("sub-zero", On(Op.SUB, x, Uniform(0.0)), lambda m: m["x"], EXACT,
         laws=(L("sub-zero", A(Op.SUB, X, Lit(0.0)), X, EXACT),)),  # x-0 -> x
    Rule("mul-zero-int", On(Op.MUL, Var("x", IntDType()), Uniform(0)),
         _zeros, EXACT, guard=_integer_product,
         laws=(L("mul-zero-int", A(Op.MUL, X, Lit(0)), ZEROS, EXACT, C(CondKind.INT, X)),)),
    # x*0 -> 0 (integers)
    Rule("mul-zero", On(Op.MUL, Var("x", FloatDType()), Uniform(0.0)),
         _zeros, FAST_MATH,
         laws=(L("mul-zero", A(Op.MUL, X, Lit(0.0)), ZEROS, FAST_MATH, C(CondKind.FLOAT, X)),)),
    # x*0 -> 0 (wrong for NaN, inf, and the sign of -x*0)
    Rule("relu-relu", On(Op.RELU, On(Op.RELU, x, name="inner", shared=True)),
         lambda m: m["inner"].out(), EXACT,
         laws=(L("relu-relu", A(Op.RELU, A(Op.RELU, X)), A(Op.RELU, X), EXACT),)),
    # relu(relu(x)) -> relu(x)
    Rule("neg-neg", On(Op.NEG, On(Op.NEG, x)), lambda m: m["x"], EXACT,
         laws=(L("neg-neg", A(Op.NEG, A(Op.NEG, X)), X, EXACT),)),  # -(-x) -> x
)
