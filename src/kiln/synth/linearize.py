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
        """A product (or power) of variables as its fresh variable, times its constant."""
        power = z3.is_app_of(e, z3.Z3_OP_POWER)
        if not (z3.is_mul(e) or power):
            return None
        factors = [c for c in e.children() if not z3.is_rational_value(c)]
        if not power and len(factors) < 2:
            return None
        if any(not _polynomial(f) for f in factors):
            return None  # a product with an If inside stays as it is
        constants = [c for c in e.children() if z3.is_rational_value(c)] if not power else []
        name = "mono!" + ("*".join(sorted(map(str, factors))) if not power else str(e))
        fresh = self.monomials.setdefault(name, z3.Real(name))
        return z3.Product(*constants, fresh) if constants else fresh


def _polynomial(e: z3.ExprRef) -> bool:
    if z3.is_app_of(e, z3.Z3_OP_ITE):
        return False
    return all(_polynomial(c) for c in e.children()) if z3.is_app(e) else True


__all__ = ["Linearizer"]
