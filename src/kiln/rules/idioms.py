"""Activations a model writes out in arithmetic, recognized as the one op they compute.

    0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))  ->  gelu(x, approximate='tanh')
    x * clamp(x + 3, 0, 6) / 6                                 ->  hardswish(x)

The left side is HF transformers' ``gelu_new`` (GPT-2, GPT-J, CodeGen, ...): seven nodes and
two kernels where the op is one, and one the GEMM before it runs in its write-back (the
epilogue rules then make ``addmm_act{gelu}``). ATen's tanh GELU evaluates the same formula
with the same constants in float32, in a different order, so the rewrite is ieee, not exact:
NaN, ±inf and ±0 land in the same places (gelu(-inf) is NaN on both sides, -inf * 0), and
finite values differ by rounding.

Hardswish (MobileNetV3, LeViT) comes from capture as its formula (`kiln.frontend.aten`); as
one op it is an epilogue activation, so the contraction before it writes it back (HF
LeViT: 17 of its 31, after 14 GEMMs and 3 convolutions). ATen's kernel computes the same
formula in the same order, so the rewrite is exact. It must see the division: `kiln.rules`
puts these rules before `arith`'s div-const, which would make it a product by 1/6 (a
constant no real number identity ties to the op).
"""

from __future__ import annotations

import math

from kiln.ir.attrs import GeluAttrs
from kiln.ir.ops import Op
from kiln.rewrite.law import A, L, Lit, PVar
from kiln.rewrite.pattern import FloatDType, Number, On, Uniform, Var
from kiln.rewrite.rule import EXACT, IEEE, Match, Rule

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
KAPPA = 0.044715


def _near(value: float) -> tuple:
    """Number(...) arguments: a Python number equal to ``value`` up to float32 rounding (a
    model may write the constant with fewer digits)."""
    return (lambda n: isinstance(n, float) and abs(n - value) <= 1e-7 * value,
            f"{value!r} (to float32 precision)")


x = Var("x", FloatDType())
_inner = On(Op.ADD, x, On(Op.MUL, On(Op.POW, x, Uniform(3)), Number("kappa", *_near(KAPPA))))
_tanh = On(Op.TANH, On(Op.MUL, _inner, Number("beta", *_near(SQRT_2_OVER_PI))))
GELU_TANH = On(Op.MUL, On(Op.MUL, x, Uniform(0.5)), On(Op.ADD, _tanh, Uniform(1)))

X = PVar("x")
_SRC = A(Op.MUL, A(Op.MUL, X, Lit(0.5)),
         A(Op.ADD, A(Op.TANH, A(Op.MUL, A(Op.ADD, X, A(Op.MUL, A(Op.POW, X, Lit(3.0)),
                                                          Lit(KAPPA))),
                                 Lit(SQRT_2_OVER_PI))),
           Lit(1.0)))


_gated = On(Op.MUL, x, On(Op.CLAMP, On(Op.ADD, x, Uniform(3)),
                         where=lambda a: a.min == 0 and a.max == 6, describe="clamp to [0, 6]"))
HARDSWISH_OVER_SIX = On(Op.DIV, _gated, Uniform(6), where=lambda a: a.rounding_mode is None,
                        describe="true division")
_GATED = A(Op.MUL, X, A(Op.CLAMP, A(Op.ADD, X, Lit(3)), min=0, max=6))


def _hardswish(m: Match):
    return m.op(Op.HARDSWISH, m["x"], name=m.root.name)


def _gelu_tanh(m: Match):
    return m.op(Op.GELU, m["x"], attrs=GeluAttrs("tanh"), name=m.root.name)


RULES = (
    Rule("gelu-tanh-idiom", GELU_TANH, _gelu_tanh, IEEE,
         laws=(L("gelu-tanh-idiom", _SRC, A(Op.GELU, X, approximate="tanh"), IEEE),)),
    # 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))) -> gelu(x, 'tanh')
    Rule("hardswish-idiom", HARDSWISH_OVER_SIX, _hardswish, EXACT,
         laws=(L("hardswish-idiom", A(Op.DIV, _GATED, Lit(6), rounding_mode=None),
                 A(Op.HARDSWISH, X), EXACT),)),
    # x * clamp(x + 3, 0, 6) / 6 -> hardswish(x)
)
