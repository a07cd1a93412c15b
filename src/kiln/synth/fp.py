"""Float32 semantics for bit-exactness proofs: z3's floating-point theory, rounding to nearest
even, on elements of `kiln.synth.concrete` tensors.

    x + (-0.0) -> x     every x: the same bits (x = -0.0 gives -0.0 on both sides)
    x + 0.0 -> x        x = -0.0: src 0.0, dst -0.0  (refuted)

Two values are *the same* when both are NaN or their IEEE bit patterns are equal, so +0.0
and -0.0 differ and NaN payloads do not matter (SMT-LIB's ``=`` on floats is exactly this).

Numbers: ATen computes a float32 op with a Python-number operand in float32, the number
rounded to float32 first; so every number variable is a Float32 value, constrained by the
law's conditions. A number computed at compile time from others ((inverse ?c), 1/c in
double precision, then rounded to float32 by the op) is computed here in float32: for +, -,
*, / of float32 values, rounding the double result to float32 gives the correctly rounded
float32 result, so that is the same value.

Ops modelled: add, sub, mul, div (true division), neg, abs, relu (ATen keeps -0.0:
x < 0 ? +0.0 : x), maximum/minimum (NaN propagates; on equal values the first operand),
sqrt, reciprocal, floor, ceil, and every movement op (moves values, no arithmetic).
Contractions and reductions are not: their summation order is the library's choice.

Integer tensors (`IntDomain`): two's-complement bitvectors of the dtype's width; add, sub,
mul and neg wrap, relu/abs/maximum/minimum compare signed, and sums (mm, conv) are exact
in any order, so contractions are modelled. Division and comparisons are not.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import z3

from kiln.ir.ops import Op
from kiln.rewrite.law import CondKind
from kiln.synth.concrete import Domain, Unsupported

F32 = z3.Float32()
RNE = z3.RNE()


def f32(value: bool | int | float) -> z3.FPRef:
    """The float32 nearest to ``value`` (ATen's rounding of a Python number), exactly."""
    bits = struct.unpack("<I", np.float32(float(value)).tobytes())[0]
    return z3.fpBVToFP(z3.BitVecVal(bits, 32), F32)


def _zero() -> z3.FPRef:
    return z3.FPVal(0.0, F32)


def _nan_or(args: tuple[Any, ...], value: Any) -> Any:
    nan = z3.Or(*[z3.fpIsNaN(a) for a in args])
    return z3.If(nan, z3.fpNaN(F32), value)


_FLOAT_OPS: dict[Op, Any] = {
    Op.ADD: lambda a, b: z3.fpAdd(RNE, a, b),
    Op.SUB: lambda a, b: z3.fpSub(RNE, a, b),
    Op.MUL: lambda a, b: z3.fpMul(RNE, a, b),
    Op.DIV: lambda a, b: z3.fpDiv(RNE, a, b),
    Op.NEG: z3.fpNeg,
    Op.ABS: z3.fpAbs,
    Op.RELU: lambda a: z3.If(z3.fpLT(a, _zero()), _zero(), a),
    Op.MAXIMUM: lambda a, b: _nan_or((a, b), z3.If(z3.fpLT(a, b), b, a)),
    Op.MINIMUM: lambda a, b: _nan_or((a, b), z3.If(z3.fpLT(b, a), b, a)),
    Op.SQRT: lambda a: z3.fpSqrt(RNE, a),
    Op.RECIPROCAL: lambda a: z3.fpDiv(RNE, z3.FPVal(1.0, F32), a),
    Op.FLOOR: lambda a: z3.fpRoundToIntegral(z3.RTN(), a),
    Op.CEIL: lambda a: z3.fpRoundToIntegral(z3.RTP(), a),
}


def bit_blasting_solver(time_limit_s: float) -> z3.Solver:
    """Floats to bitvectors to SAT: measured 2-3x faster than z3's default solver on these
    problems, and without its occasional long runs (x/c = x*(1/c): 30 s instead of 1 s)."""
    tactic = z3.Then("simplify", "fpa2bv", "simplify", "bit-blast", "sat")
    return z3.TryFor(tactic, max(1, int(time_limit_s * 1000))).solver()


class FloatDomain(Domain):
    """Elements are z3 Float32 values (see the module docstring)."""

    name = "float32"

    def solver(self, time_limit_s: float) -> z3.Solver:
        return bit_blasting_solver(time_limit_s)

    def var(self, name: str) -> Any:
        return z3.FP(name, F32)

    def const(self, value: bool | int | float) -> Any:
        return f32(value)

    def apply(self, op: Op, attrs: Any, *args: Any) -> Any:
        if op is Op.DIV and attrs is not None and attrs.rounding_mode is not None:
            raise Unsupported(f"div with rounding_mode={attrs.rounding_mode!r}")
        if op not in _FLOAT_OPS:
            raise Unsupported(f"{op.text} is not modelled in float32 (not correctly rounded, "
                              "or not an arithmetic op on floats)")
        return _FLOAT_OPS[op](*args)

    def show(self, model: z3.ModelRef, element: Any) -> str:
        if z3.is_true(model.eval(z3.fpIsNaN(element), model_completion=True)):
            return "nan"
        bits = model.eval(z3.fpToIEEEBV(element), model_completion=True).as_long()
        return repr(struct.unpack("<f", struct.pack("<I", bits))[0])


def number_variable(name: str, conditions: set[CondKind]) -> tuple[Any, list[z3.BoolRef]]:
    """A float32 number operand meeting ``conditions``, and the constraints on it.

    pow2: ±2**k with 2**k and 2**-k normal (k in -126..126), so that 1/c is exact;
    pow2-ge-1: 2**k, k in 0..20 (c + 1 exact); finite-nonzero: finite and not ±0;
    normal-reciprocal: |c| and 1/|c| normal (2**-126 <= |c| <= 2**126).
    """
    if CondKind.POW2 in conditions or CondKind.POW2_AT_LEAST_ONE in conditions:
        sign = z3.BitVec(f"{name}_sign", 1)
        exponent = z3.BitVec(f"{name}_exponent", 8)
        value = z3.fpFP(sign, exponent, z3.BitVecVal(0, 23))
        if CondKind.POW2_AT_LEAST_ONE in conditions:
            # k <= 20, as the rule's guard says: then c + 1 is exact in float32
            return value, [sign == 0, z3.UGE(exponent, 127), z3.ULE(exponent, 147)]
        return value, [z3.UGE(exponent, 1), z3.ULE(exponent, 253)]
    value = z3.FP(name, F32)
    constraints: list[z3.BoolRef] = []
    if conditions & {CondKind.FINITE_NONZERO, CondKind.NORMAL_RECIPROCAL}:
        constraints += [z3.Not(z3.fpIsInf(value)), z3.Not(z3.fpIsNaN(value)),
                        z3.Not(z3.fpIsZero(value))]
    if CondKind.NORMAL_RECIPROCAL in conditions:
        magnitude = z3.fpAbs(value)
        constraints += [z3.fpGEQ(magnitude, f32(2.0 ** -126)),
                        z3.fpLEQ(magnitude, f32(2.0 ** 126))]
    return value, constraints


class IntDomain(Domain):
    """Elements are z3 bitvectors of ``bits`` bits: integer tensors, wrapping arithmetic."""

    def __init__(self, bits: int) -> None:
        super().__init__()
        self.bits = bits
        self.name = f"int{bits}"

    def var(self, name: str) -> Any:
        return z3.BitVec(name, self.bits)

    def const(self, value: bool | int | float) -> Any:
        if isinstance(value, float) and not value.is_integer():
            raise Unsupported(f"the number {value!r} with integer tensors (promotes to float)")
        return z3.BitVecVal(int(value), self.bits)

    def apply(self, op: Op, attrs: Any, *args: Any) -> Any:
        if op not in _INT_OPS:
            raise Unsupported(f"{op.text} is not modelled on integers")
        return _INT_OPS[op](*args)

    def sum(self, terms: Any) -> Any:
        return z3.Sum(list(terms)) if len(terms) else z3.BitVecVal(0, self.bits)

    def show(self, model: z3.ModelRef, element: Any) -> str:
        return str(model.eval(element, model_completion=True).as_signed_long())


_INT_OPS: dict[Op, Any] = {
    Op.ADD: lambda a, b: a + b,
    Op.SUB: lambda a, b: a - b,
    Op.MUL: lambda a, b: a * b,
    Op.NEG: lambda a: -a,
    Op.ABS: lambda a: z3.If(a < 0, -a, a),
    Op.RELU: lambda a: z3.If(a < 0, z3.BitVecVal(0, a.size()), a),
    Op.MAXIMUM: lambda a, b: z3.If(a < b, b, a),
    Op.MINIMUM: lambda a, b: z3.If(b < a, b, a),
}


def int_number_variable(name: str, conditions: set[CondKind], bits: int
                        ) -> tuple[Any, list[z3.BoolRef]]:
    """An integer number operand: pow2-ge-1 is 2**k (k >= 0), the others only c != 0."""
    value = z3.BitVec(name, bits)
    constraints: list[z3.BoolRef] = []
    if CondKind.POW2_AT_LEAST_ONE in conditions or CondKind.POW2 in conditions:
        constraints += [value > 0, value & (value - 1) == 0]
    elif conditions & {CondKind.FINITE_NONZERO, CondKind.NORMAL_RECIPROCAL}:
        constraints.append(value != 0)
    return value, constraints
