"""Small helpers the rule files share: number tests and combining operands at compile time."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

from kiln.ir.graph import Value
from kiln.ir.ops import Op
from kiln.rewrite.rule import Match

_PYTHON_OP: dict[Op, Callable[[Any, Any], Any]] = {
    Op.ADD: operator.add, Op.SUB: operator.sub, Op.MUL: operator.mul,
}


def is_power_of_two(c: Any, max_exponent: int = 100) -> bool:
    """c = ±2**k with |k| <= max_exponent: multiplying by it, or by 1/c, is exact."""
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c == 0:
        return False
    mantissa, exponent = math.frexp(c)
    return abs(mantissa) == 0.5 and abs(exponent - 1) <= max_exponent


def is_finite_nonzero(c: Any) -> bool:
    return (isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c)
            and c != 0)


def combine(m: Match, op: Op, a: Value, b: Value) -> Value:
    """op(a, b) for weights or numbers: numbers are combined now (ATen has no op on two
    Python numbers), anything else becomes a node that constant folding computes."""
    if a.node.op is Op.SCALAR and b.node.op is Op.SCALAR:
        return m.number(_PYTHON_OP[op](a.node.attrs.value, b.node.attrs.value))
    if a.node.op is Op.SCALAR:  # put the tensor first: ATen's forms take the number second
        if op is Op.SUB:
            return m.op(Op.ADD, m.op(Op.NEG, b), a)
        a, b = b, a
    return m.op(op, a, b)


def numel(value: Value) -> int:
    return math.prod(value.type.shape)


def true_division(attrs: Any) -> bool:
    """div without rounding (rounding_mode None), the only form x/c = x*(1/c) holds for."""
    return attrs.rounding_mode is None


def plain_gemm(attrs: Any) -> bool:
    """addmm/addmm_act with beta = alpha = 1: bias + x @ w, nothing scaled."""
    return attrs.beta == 1 and attrs.alpha == 1
