"""Constant propagation through chains: two constants that meet an operand one after the
other are combined first, so the chain costs one op at run time.

All of these reassociate, and reassociation is not IEEE arithmetic: (x + 1e30) - 1e30 is 0
for x = 1, while x + (1e30 - 1e30) is 1. So they run only with fast_math.
"""

from __future__ import annotations

from kiln.ir.ops import Op
from kiln.rewrite.law import A, C, CondKind, L, Law, PVar
from kiln.rewrite.pattern import FloatDType, On, Var, Weight
from kiln.rewrite.rule import FAST_MATH, Match, Rule
from kiln.rules.support import combine, true_division

x = Var("x", FloatDType())
c1, c2 = Var("c1", Weight()), Var("c2", Weight())



def _chain(outer: Op, inner: Op, merge: Op):
    """(x inner c2) outer c1 -> x outer (c1 merge c2)."""
    def build(m: Match):
        return m.op(outer, m["x"], combine(m, merge, m["c1"], m["c2"]), attrs=m.root.attrs)
    return build


X, C1, C2 = PVar("x"), PVar("c1"), PVar("c2")


def _chain_law(name: str, outer: Op, inner: Op, merge: Op) -> Law:
    return L(name, A(outer, A(inner, X, C2), C1), A(outer, X, A(merge, C1, C2)), FAST_MATH,
             C(CondKind.FLOAT, X), C(CondKind.WEIGHT, C1), C(CondKind.WEIGHT, C2))


RULES = (
    Rule("add-add-const", On(Op.ADD, On(Op.ADD, x, c2), c1),
         _chain(Op.ADD, Op.ADD, Op.ADD), FAST_MATH,
         laws=(_chain_law("add-add-const", Op.ADD, Op.ADD, Op.ADD),)),  # (x+c2)+c1 -> x+(c1+c2)
    Rule("mul-mul-const", On(Op.MUL, On(Op.MUL, x, c2), c1),
         _chain(Op.MUL, Op.MUL, Op.MUL), FAST_MATH,
         laws=(_chain_law("mul-mul-const", Op.MUL, Op.MUL, Op.MUL),)),  # (x*c2)*c1 -> x*(c1*c2)
    Rule("sub-sub-const", On(Op.SUB, On(Op.SUB, x, c2), c1),
         _chain(Op.SUB, Op.SUB, Op.ADD), FAST_MATH,
         laws=(_chain_law("sub-sub-const", Op.SUB, Op.SUB, Op.ADD),)),  # (x-c2)-c1 -> x-(c1+c2)
    Rule("div-div-const", On(Op.DIV, On(Op.DIV, x, c2, where=true_division), c1,
                             where=true_division),
         _chain(Op.DIV, Op.DIV, Op.MUL), FAST_MATH,
         laws=(_chain_law("div-div-const", Op.DIV, Op.DIV, Op.MUL),)),  # (x/c2)/c1 -> x/(c1*c2)
)
