"""Integer index arithmetic: a small simplifier (constant folding and identities, so split and
fuse leave readable indices) and interval bounds of an index over loop ranges (for the
regions compute_at must produce)."""

from __future__ import annotations

from collections.abc import Mapping

from kiln.tir.nodes import Binary, BinOp, Const, Expr, Var, const
from kiln.tir.visit import map_expr

Interval = tuple[int, int]  # inclusive [lo, hi]


def _int(e: Expr) -> int | None:
    if isinstance(e, Const) and not e.dtype.is_floating and not isinstance(e.value, bool):
        return int(e.value)
    return None


def _fold(e: Expr) -> Expr:
    if not isinstance(e, Binary) or e.dtype.is_floating:
        return e
    a, b = _int(e.a), _int(e.b)
    op = e.op
    if a is not None and b is not None:
        value = _FOLD.get(op)
        if value is not None and not (op in (BinOp.FLOORDIV, BinOp.FLOORMOD) and b == 0):
            return const(value(a, b), e.dtype)
    if op is BinOp.ADD:
        if a == 0:
            return e.b
        if b == 0:
            return e.a
    elif op is BinOp.SUB and b == 0:
        return e.a
    elif op is BinOp.MUL:
        if a == 1:
            return e.b
        if b == 1:
            return e.a
        if a == 0 or b == 0:
            return const(0, e.dtype)
    elif op is BinOp.FLOORDIV and b == 1:
        return e.a
    elif op is BinOp.FLOORMOD and b == 1:
        return const(0, e.dtype)
    return e


_FOLD = {
    BinOp.ADD: lambda a, b: a + b,
    BinOp.SUB: lambda a, b: a - b,
    BinOp.MUL: lambda a, b: a * b,
    BinOp.FLOORDIV: lambda a, b: a // b,
    BinOp.FLOORMOD: lambda a, b: a % b,
    BinOp.MIN: min,
    BinOp.MAX: max,
}


def simplify(expr: Expr) -> Expr:
    """Fold integer constants and drop ``+0``, ``*1``, ``//1``; floats are left alone."""
    return map_expr(expr, _fold)


def bounds(expr: Expr, ranges: Mapping[Var, Interval]) -> Interval | None:
    """Inclusive integer bounds of ``expr`` when each var lies in its range, or None when
    the expression is not index arithmetic this knows (then callers must be conservative)."""
    if isinstance(expr, Var):
        return ranges.get(expr)
    c = _int(expr)
    if c is not None:
        return (c, c)
    if not isinstance(expr, Binary) or expr.dtype.is_floating:
        return None
    a, b = bounds(expr.a, ranges), bounds(expr.b, ranges)
    if a is None or b is None:
        return None
    op = expr.op
    if op is BinOp.ADD:
        return (a[0] + b[0], a[1] + b[1])
    if op is BinOp.SUB:
        return (a[0] - b[1], a[1] - b[0])
    if op is BinOp.MUL:
        products = [x * y for x in a for y in b]
        return (min(products), max(products))
    if op is BinOp.MIN:
        return (min(a[0], b[0]), min(a[1], b[1]))
    if op is BinOp.MAX:
        return (max(a[0], b[0]), max(a[1], b[1]))
    if op is BinOp.FLOORDIV and b[0] == b[1] and b[0] > 0:
        return (a[0] // b[0], a[1] // b[0])
    if op is BinOp.FLOORMOD and b[0] == b[1] and b[0] > 0:
        if a[1] - a[0] + 1 >= b[0] or a[0] // b[0] != a[1] // b[0]:
            return (0, b[0] - 1)
        return (a[0] % b[0], a[1] % b[0])
    return None


def linear(expr: Expr) -> dict[Var | None, int] | None:
    """``expr`` as integer coefficients per var (None: the constant term) when it is affine
    (sums, differences and products with constants of vars), else None."""
    if isinstance(expr, Var):
        return {expr: 1}
    c = _int(expr)
    if c is not None:
        return {None: c}
    if not isinstance(expr, Binary) or expr.dtype.is_floating:
        return None
    if expr.op in (BinOp.ADD, BinOp.SUB):
        a, b = linear(expr.a), linear(expr.b)
        if a is None or b is None:
            return None
        sign = 1 if expr.op is BinOp.ADD else -1
        out = dict(a)
        for v, k in b.items():
            out[v] = out.get(v, 0) + sign * k
        return out
    if expr.op is BinOp.MUL:
        for x, y in ((expr.a, expr.b), (expr.b, expr.a)):
            k = _int(y)
            if k is not None:
                inner = linear(x)
                return None if inner is None else {v: k * c for v, c in inner.items()}
    return None
