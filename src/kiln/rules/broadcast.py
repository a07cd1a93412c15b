"""Broadcast minimization: add the small operands to each other before the big ones.

    (M1 + s1) + (M2 + s2) -> (M1 + M2) + (s1 + s2)      s1, s2 broadcast up to M's shape

Three full-size additions become two, and the third works on the small shape. It
reassociates, so it is fast_math only.
"""

from __future__ import annotations

from kiln.ir.ops import Op
from kiln.rewrite.law import A, C, CondKind, L, PVar
from kiln.rewrite.pattern import On, Var
from kiln.rewrite.rule import FAST_MATH, Match, Rule
from kiln.rules.support import numel


def _small_ones_broadcast(m: Match) -> str | None:
    full = numel(m.root.out())
    if m["m1"].type.shape != m.root.type.shape or m["m2"].type.shape != m.root.type.shape:
        return "m1 and m2 must have the result's shape"
    if numel(m["s1"]) >= full or numel(m["s2"]) >= full:
        return "s1 and s2 must be smaller than the result (broadcast)"
    return None


M1, S1, M2, S2 = PVar("m1"), PVar("s1"), PVar("m2"), PVar("s2")

RULES = (
    Rule("broadcast-regroup",
         On(Op.ADD, On(Op.ADD, Var("m1"), Var("s1")), On(Op.ADD, Var("m2"), Var("s2"))),
         lambda m: m.op(Op.ADD, m.op(Op.ADD, m["m1"], m["m2"]), m.op(Op.ADD, m["s1"], m["s2"])),
         FAST_MATH, guard=_small_ones_broadcast,
         laws=(L("broadcast-regroup", A(Op.ADD, A(Op.ADD, M1, S1), A(Op.ADD, M2, S2)),
                 A(Op.ADD, A(Op.ADD, M1, M2), A(Op.ADD, S1, S2)), FAST_MATH,
                 C(CondKind.GUARD, "small-ones-broadcast")),)),
    # (M1+s1)+(M2+s2) -> (M1+M2)+(s1+s2)
)
