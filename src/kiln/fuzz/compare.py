"""Comparing a compiled graph's output with the reference interpreter's, NaN-aware.

Two strengths, chosen per output by what was done to the graph (`kiln.fuzz.exactness`):

* ``EXACT``: the same bits, except that a NaN may carry another payload or sign (ATen itself
  does not promise one); ``-0.0`` and ``0.0`` differ.
* ``CLOSE`` (IEEE rules, generated kernels, other layouts): NaN where the reference has NaN
  and nowhere else, ±inf where it has ±inf, zeros of the same sign where both are zero, and
  finite values equal up to rounding: ``|a - b| <= rtol * (|b| + scale) + 4 |b - t|``,
  ``scale`` the largest finite magnitude of the reference (a sum rounds relative to its
  terms, not to its result) and ``t`` the float64 twin's value (the reference's own error).
  Allowances, for what rounding itself decides: at the overflow threshold (``|finite| >=
  max/4``) a finite number or inf of the same sign; and nothing is required of an
  *ill-conditioned* element, one where the reference and its float64 twin disagree on NaN,
  inf or finite (``(a + b) - c`` overflowing in float32 only) or on a zero's existence.
* ``NEAR``: ``CLOSE`` downstream of a sum computed another way (a generated GEMM or
  reduction, a convolution in another layout), but for two things the order of a sum decides:
  the sign of an exact zero sum (a convention of the accumulator's start, on which the
  libraries themselves differ: ATen's ``mm`` gives +0.0 for ``[[-0.0]] @ [[2.0]]`` and -0.0
  for the same row in a 5x1 @ 1x2 product), and which non-finite value a sum holding +inf
  and -inf (or terms that overflow) ends in: inf, -inf or NaN. Float64 graphs have no wider
  twin to tell these apart from bugs.

Integer and boolean outputs are always compared exactly.
"""

from __future__ import annotations

import enum

import torch

from kiln.fuzz.values import bits
from kiln.ir.graph import Graph, Value


class Strength(enum.IntEnum):
    EXACT = 0
    CLOSE = 1
    NEAR = 2  # CLOSE, but a zero's sign is free: a sum computed another way
    UNCHECKED = 3  # a discontinuous op (compare, floor, argmax ...) read a rounded value


RTOL: dict[torch.dtype, float] = {
    torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2,
}


def compare(actual: object, expected: torch.Tensor, strength: Strength,
            wide: object = None, rtol: float = 0.0) -> str | None:
    """None when ``actual`` agrees with ``expected`` at ``strength``, else what differs.

    ``wide``: the float64 twin's value of the output (`kiln.fuzz.reference.widened`), which
    marks the ill-conditioned elements a CLOSE comparison leaves out. ``rtol``: at least this
    relative tolerance (`rtol_of`: a float64 output computed from float32 values rounds as
    float32 does).
    """
    if not isinstance(actual, torch.Tensor):
        return f"got a {type(actual).__name__}, expected a tensor"
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return (f"got {actual.dtype} {tuple(actual.shape)}, expected {expected.dtype} "
                f"{tuple(expected.shape)}")
    if strength is Strength.UNCHECKED or expected.numel() == 0:
        return None
    if not expected.is_floating_point():
        if torch.equal(actual, expected):
            return None
        return _first_difference(actual, expected, actual != expected)
    if strength is Strength.EXACT:
        nan_a, nan_e = actual.isnan(), expected.isnan()
        if not torch.equal(nan_a, nan_e):
            return _first_difference(actual, expected, nan_a != nan_e, "NaN positions differ")
        differ = (bits(actual) != bits(expected)) & ~nan_e
        return None if not differ.any() else _first_difference(actual, expected, differ)
    truth = wide.double() if isinstance(wide, torch.Tensor) and wide.shape == expected.shape \
        and wide.is_floating_point() else expected.double()
    return _close(actual, expected, truth, summed=strength is Strength.NEAR, rtol=rtol)


def rtol_of(graph: Graph, value: Value) -> float:
    """The tolerance of the narrowest floating-point value ``value`` is computed from."""
    worst, stack, seen = 0.0, [value.node], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        worst = max([worst] + [RTOL.get(t.dtype.torch, 0.0) for t in node.types])
        stack.extend(v.node for v in node.inputs)
    return worst


def _close(actual: torch.Tensor, expected: torch.Tensor, truth: torch.Tensor,
           summed: bool, rtol: float = 0.0) -> str | None:
    a, e = actual.double(), expected.double()
    info = torch.finfo(expected.dtype)
    rounded = truth.to(expected.dtype).double()  # float64's answer at the output's precision
    well = (_kind(e) == _kind(rounded)) & ~((e == 0) & (truth != 0))
    if summed:  # the order of a sum decides whether +inf meets -inf (or an overflow) first
        well &= ~(~a.isfinite() & ~e.isfinite())
    nan_a, nan_e = a.isnan(), e.isnan()
    if ((nan_a != nan_e) & well).any():
        return _first_difference(actual, expected, (nan_a != nan_e) & well,
                                 "NaN positions differ")
    numbers = ~nan_e & ~nan_a
    inf_a, inf_e = a.isinf(), e.isinf()
    same_sign = torch.signbit(a) == torch.signbit(e)
    near_overflow = torch.where(inf_a, e.abs(), a.abs()) >= info.max / 4
    bad_inf = (inf_a != inf_e) & numbers & well & ~(near_overflow & same_sign)
    bad_inf |= inf_a & inf_e & ~same_sign & well
    if bad_inf.any():
        return _first_difference(actual, expected, bad_inf, "inf positions differ")
    zeros = (a == 0) & (e == 0) & ~same_sign & well
    if not summed and zeros.any():
        return _first_difference(actual, expected, zeros, "zero signs differ")
    finite = numbers & ~inf_a & ~inf_e
    if not finite.any():
        return None
    rtol = max(RTOL[expected.dtype], rtol)
    scale = e[finite].abs().max()
    error = torch.where(truth.isfinite() & finite, (e - truth).abs(), 0)  # the reference's own
    tol = rtol * (e.abs() + scale) + 4 * error + info.tiny
    far = finite & ((a - e).abs() > tol)
    if far.any():
        return _first_difference(actual, expected, far, f"beyond rtol {rtol}")
    return None


def _kind(x: torch.Tensor) -> torch.Tensor:
    """0 finite, 1 NaN, 2 +inf, 3 -inf."""
    kind = torch.zeros_like(x, dtype=torch.int8)
    kind[x.isnan()] = 1
    kind[x == torch.inf] = 2
    kind[x == -torch.inf] = 3
    return kind


def _first_difference(actual: torch.Tensor, expected: torch.Tensor, where: torch.Tensor,
                      what: str = "values differ") -> str:
    count = int(where.sum())
    index = tuple(int(i) for i in where.nonzero()[0]) if where.dim() else ()
    return (f"{what} at {count} of {expected.numel()} elements, first at {list(index)}: "
            f"got {_show(actual[index])}, expected {_show(expected[index])}")


def _show(x: torch.Tensor) -> str:
    value = x.item()
    if isinstance(value, float):
        return repr(value) if value == value else "nan"
    return repr(value)
