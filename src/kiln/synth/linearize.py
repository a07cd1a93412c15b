"""Products of variables as fresh variables: a linear problem whose unsatisfiability proves
the nonlinear one.

A law's sides on concrete shapes are real polynomials wrapped in ``If`` (relu): a
convolution of a variable input with a variable filter is a sum of products ``x_i * w_j``.
z3's nonlinear arithmetic stalls on dozens of such products under case splits, although
the two sides are often the same polynomials in different arrangements, e.g.
``relu(conv(x, w*s + w)) = relu(conv(x*s + x, w))``. Both sides are brought to sums of
monomials (z3's ``som`` simplification), and every monomial of two or more variables is
replaced by one fresh variable, the same on both sides. If the sides can never differ
whatever values those fresh variables take, they never differ for the monomials' actual
values either: unsat proves the law. Sat proves nothing (the fresh variables forget how
monomials relate, e.g. that ``s*s >= 0``).
"""

from __future__ import annotations

import z3


class Linearizer:
    """Rewrites expressions with each nonlinear monomial as a fresh Real (shared across
    every expression it rewrites)."""

    def __init__(self) -> None:
        self.monomials: dict[str, z3.ArithRef] = {}
        self.facts: list[z3.BoolRef] = []  # true of the products' values: m >= 0
        # by AST id; the expression is kept alive with its result so that no id is reused
        self._done: dict[int, tuple[z3.ExprRef, z3.ExprRef]] = {}

    def __call__(self, e: z3.ExprRef) -> z3.ExprRef:
        return self._rewrite(z3.simplify(e, som=True))

    def _rewrite(self, e: z3.ExprRef) -> z3.ExprRef:
        known = self._done.get(e.get_id())
        if known is not None:
            return known[1]
        out = self._monomial(e)
        if out is None:
            out = e.decl()(*[self._rewrite(c) for c in e.children()]) \
                if z3.is_app(e) and e.num_args() > 0 else e
        self._done[e.get_id()] = (e, out)
        return out

    def _monomial(self, e: z3.ExprRef) -> z3.ExprRef | None:
        """A product (or power) of variables, or of relus (If), as its fresh variable times
        its constant; a product of relus and squares is known to be >= 0."""
        power = z3.is_app_of(e, z3.Z3_OP_POWER)
        if not (z3.is_mul(e) or power):
            return None
        factors = [c for c in e.children() if not z3.is_rational_value(c)]
        if not power and len(factors) < 2:
            return None
        constants = [c for c in e.children() if z3.is_rational_value(c)] if not power else []
        name = "mono!" + ("*".join(sorted(map(str, factors))) if not power else str(e))
        if name not in self.monomials:
            self.monomials[name] = z3.Real(name)
            if not power and _nonnegative(factors):
                self.facts.append(self.monomials[name] >= 0)
        fresh = self.monomials[name]
        return z3.Product(*constants, fresh) if constants else fresh


def _nonnegative(factors: list[z3.ExprRef]) -> bool:
    """Is a product of these >= 0: each a relu, or a factor that appears an even number of
    times?"""
    counts: dict[str, int] = {}
    for f in factors:
        if not _relu(f):
            counts[str(f)] = counts.get(str(f), 0) + 1
    return all(n % 2 == 0 for n in counts.values())


def _relu(e: z3.ExprRef) -> bool:
    """If(a <= 0, 0, a) or If(a > 0, a, 0): max(a, 0), as relu is written and simplified."""
    if not z3.is_app_of(e, z3.Z3_OP_ITE):
        return False
    cond, then, other = e.children()
    if cond.num_args() != 2 or not _zero(cond.arg(1)):
        return False
    a = cond.arg(0)
    if z3.is_le(cond) or z3.is_lt(cond):
        return _zero(then) and z3.eq(other, a)
    if z3.is_gt(cond) or z3.is_ge(cond):
        return z3.eq(then, a) and _zero(other)
    return False


def _zero(e: z3.ExprRef) -> bool:
    return z3.is_rational_value(e) and e.as_fraction() == 0


__all__ = ["Linearizer"]
