"""Arithmetic simplification: fewer, cheaper nodes for the same arithmetic.

Exactness arguments, for the rows tagged exact:
* x + x = 2x: both are the one correctly rounded value of 2x (also for NaN, inf and -0.0).
* x*c + x = x*(c+1) for c = 2**k, k >= 0: x*c is exact (or overflows, and then so does the
  sum), so both sides round the same real number once. With x + x -> 2x this turns
  x + x + x into 3x, and so on.
* x / c = x * (1/c) for c = ±2**k: 1/c is exact, so both round the same real number.
"""

from __future__ import annotations

import torch

from kiln.ir.ops import Op
from kiln.ir.types import DType
from kiln.rewrite.law import A, AttrFnKind, C, CondKind, F, L, Lit, PVar
from kiln.rewrite.pattern import FloatDType, Number, On, Var, Weight
from kiln.rewrite.rule import EXACT, FAST_MATH, IEEE, Match, Rule
from kiln.rules.support import combine, is_finite_nonzero, is_power_of_two, true_division

x = Var("x")
fx = Var("x", FloatDType())
X, CN, AV, BV = PVar("x"), PVar("c"), PVar("a"), PVar("b")



def _scaled_self_pow2(m: Match) -> str | None:
    c = m.number_of("c")
    if m["x"].type.dtype in (DType.F32, DType.F64) and is_power_of_two(c, 20) and c >= 1:
        return None
    if m["x"].type.dtype in (DType.I64, DType.I32, DType.I16, DType.I8, DType.U8) \
            and isinstance(c, int) and not isinstance(c, bool):
        return None  # integer arithmetic wraps the same way on both sides
    return f"c = {c!r} is not a power of two >= 1 (on f32/f64), nor an integer factor"


def _wide_float(m: Match) -> str | None:
    # f16/bf16 round the reciprocal to a much coarser grid; keep those divisions as they are
    return None if m["x"].type.dtype in (DType.F32, DType.F64) else "only f32/f64"


def _normal_reciprocal(m: Match) -> str | None:
    # ATen rounds c to x's dtype first: a subnormal c loses bits there, and a 1/c beyond the
    # dtype's range turns x*(1/c) into x*inf (0/1e-39 is 0 in float32; 0*(1/1e-39) is NaN)
    wide = _wide_float(m)
    if wide:
        return wide
    c = abs(m.number_of("c"))
    tiny = torch.finfo(m["x"].type.dtype.torch).smallest_normal
    if not tiny <= c <= 1 / tiny:
        return f"c = {m.number_of('c')!r} or 1/c is not a normal {m['x'].type.dtype.value}"
    return None


def _reciprocal(m: Match):
    return m.op(Op.MUL, m["x"], m.number(1.0 / m.number_of("c")))


RULES = (
    Rule("add-self", On(Op.ADD, x, x), lambda m: m.op(Op.MUL, m["x"], m.number(2)),
         EXACT, laws=(L("add-self", A(Op.ADD, X, X), A(Op.MUL, X, Lit(2)), EXACT),)),  # x+x -> x*2
    Rule("add-scaled-self-pow2", On(Op.ADD, On(Op.MUL, x, Number("c")), x),
         lambda m: m.op(Op.MUL, m["x"], m.number(m.number_of("c") + 1)), EXACT,
         guard=_scaled_self_pow2,
         laws=(L("add-scaled-self-pow2", A(Op.ADD, A(Op.MUL, X, CN), X),
                 A(Op.MUL, X, F(AttrFnKind.PLUS_ONE, CN)), EXACT,
                 C(CondKind.POW2_AT_LEAST_ONE, CN)),)),  # x*c+x -> x*(c+1), c = 2**k
    Rule("add-scaled-self", On(Op.ADD, On(Op.MUL, fx, Var("c", Weight())), fx),
         lambda m: m.op(Op.MUL, m["x"], combine(m, Op.ADD, m["c"], m.number(1))),
         FAST_MATH,
         laws=(L("add-scaled-self", A(Op.ADD, A(Op.MUL, X, CN), X),
                 A(Op.MUL, X, A(Op.ADD, CN, Lit(1))), FAST_MATH,
                 C(CondKind.FLOAT, X), C(CondKind.WEIGHT, CN)),)),  # x*c+x -> x*(c+1)
    Rule("factor-common", On(Op.ADD, On(Op.MUL, fx, Var("a")), On(Op.MUL, fx, Var("b"))),
         lambda m: m.op(Op.MUL, m["x"], m.op(Op.ADD, m["a"], m["b"])),
         FAST_MATH,
         laws=(L("factor-common", A(Op.ADD, A(Op.MUL, X, AV), A(Op.MUL, X, BV)),
                 A(Op.MUL, X, A(Op.ADD, AV, BV)), FAST_MATH, C(CondKind.FLOAT, X)),)),
    # x*a+x*b -> x*(a+b)
    Rule("div-const-pow2",
         On(Op.DIV, x, Number("c", is_power_of_two, "±2**k"), where=true_division,
            describe="true division"),
         _reciprocal, EXACT, guard=_wide_float,
         laws=(L("div-const-pow2", A(Op.DIV, X, CN), A(Op.MUL, X, F(AttrFnKind.INVERSE, CN)),
                 EXACT, C(CondKind.POW2, CN), C(CondKind.GUARD, "wide-float")),)),
    # x/c -> x*(1/c), c = ±2**k
    Rule("div-const",
         On(Op.DIV, x, Number("c", is_finite_nonzero, "a finite nonzero number"),
            where=true_division, describe="true division"),
         _reciprocal, IEEE, guard=_normal_reciprocal,
         laws=(L("div-const", A(Op.DIV, X, CN), A(Op.MUL, X, F(AttrFnKind.INVERSE, CN)),
                 IEEE, C(CondKind.NORMAL_RECIPROCAL, CN)),)),  # x/c -> x*(1/c)
)
