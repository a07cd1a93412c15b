"""A rule's algebra as data: the two sides as terms, the side conditions, the safety tag.

    Law("mul-one", src=(App(Op.MUL, (X, Lit(1))),), dst=(X,), safety=EXACT)    # x*1 -> x

This is what the rule text format prints and parses (kiln.synth.text), what the prover
checks (kiln.synth.prove), and what a generated rule is before it becomes a `Rule`. A
hand-written `Rule` states its laws next to its pattern and builder; a test checks that the
builder does what its laws say.

Terms:
* `PVar("x")` is a pattern variable (``?x``): a tensor, a number, or an attribute value.
* `Lit(1)` is a number operand (an ATen wrapped scalar, or a uniform weight in a pattern).
* `AttrFn(INVERSE, (PVar("c"),))` as an operand is a number computed at compile time (1/c).
* `App(op, args, attrs, output)` applies a kiln op. ``attrs`` holds only the attributes the
  rule names, as sorted (key, value) pairs; a value is a number, a string, None, a tuple, an
  `Op` or `DType`, a `PVar` (any value, the same wherever the variable appears), or an
  `AttrFn` (an attribute computed from others, e.g. the composition of two permutations).
  An attribute left out has its default (``div`` without ``:rounding_mode`` is true
  division); an attribute without a default must be named. ``output`` picks one result of a
  multi-output op (split).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from kiln.ir.ops import Op


class Safety(enum.Enum):
    """How far a rule's result may differ from the original's, in IEEE arithmetic."""

    EXACT = "exact"  # bit-identical for every input
    IEEE = "ieee"  # same NaN/inf/zero-sign positions for every input; finite values up to rounding
    FAST_MATH = "fast_math"  # holds for real numbers; runs only with Options(fast_math=True)


EXACT, IEEE, FAST_MATH = Safety.EXACT, Safety.IEEE, Safety.FAST_MATH


@dataclass(frozen=True)
class PVar:
    name: str


@dataclass(frozen=True)
class Lit:
    value: bool | int | float

    def __eq__(self, other: object) -> bool:  # 1, 1.0 and True differ; so do 0.0 and -0.0
        return isinstance(other, Lit) and _number_key(self.value) == _number_key(other.value)

    def __hash__(self) -> int:
        return hash(_number_key(self.value))


class AttrFnKind(enum.Enum):
    """Compile-time functions a rule's right side may use (a closed set: the prover knows
    each): of attributes, or of number operands (the result is a number operand)."""

    COMPOSE = "compose"  # compose(p, q) = (p[q[0]], p[q[1]], ...): permute by p, then by q
    INVERSE = "inverse"  # 1/c of a number operand c
    PLUS_ONE = "plus-one"  # c + 1 of a number operand c
    SHAPE_OF = "shape-of"  # the shape of a tensor variable
    DTYPE_OF = "dtype-of"  # the dtype of a tensor variable
    SIZE = "size"  # (size ?x d): dimension d of a tensor variable


@dataclass(frozen=True)
class AttrFn:
    kind: AttrFnKind
    args: tuple[Any, ...]


@dataclass(frozen=True)
class App:
    op: Op
    args: tuple[Term, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()
    output: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "attrs", tuple(sorted(self.attrs)))

    def attr(self, key: str, default: Any = None) -> Any:
        return dict(self.attrs).get(key, default)


Term = PVar | Lit | App | AttrFn  # an AttrFn as an operand computes a number


class CondKind(enum.Enum):
    """Side conditions: what must hold of the bound values for the law to apply.

    Each has a fixed arity; the text format writes ``(float ?x)``, ``(pow2 ?c)``.
    """

    FLOAT = ("float", 1, "a floating-point tensor")
    INT = ("int", 1, "an integer or bool tensor")
    WEIGHT = ("weight", 1, "a weight (depends on constants only)")
    NUMBER = ("number", 1, "a Python number operand")
    FINITE_NONZERO = ("finite-nonzero", 1, "a finite nonzero number")
    POW2 = ("pow2", 1, "±2**k, so that 1/c is exact")
    POW2_AT_LEAST_ONE = ("pow2-ge-1", 1, "2**k with 0 <= k <= 20 (c + 1 is exact), or an integer "
                         "factor on integers")
    NORMAL_RECIPROCAL = ("normal-reciprocal", 1, "c and 1/c normal numbers of x's dtype")
    SAME_TYPE = ("same-type", 2, "two values of one type (shape and dtype)")
    GUARD = ("guard", 1, "the named guard of a hand-written rule (Python)")

    def __init__(self, text: str, arity: int, describe: str) -> None:
        self.text = text
        self.arity = arity
        self.describe = describe

    @staticmethod
    def parse(text: str) -> CondKind:
        for kind in CondKind:
            if kind.text == text:
                return kind
        known = ", ".join(k.text for k in CondKind)
        raise ValueError(f"unknown condition {text!r}; conditions: {known}")


@dataclass(frozen=True)
class Cond:
    kind: CondKind
    args: tuple[Any, ...]  # PVar, or a guard's name (str)


@dataclass(frozen=True)
class Law:
    """One rewrite, as algebra: every ``src`` term is replaced by the ``dst`` term at its index."""

    name: str
    src: tuple[Term, ...]
    dst: tuple[Term, ...]
    safety: Safety
    when: tuple[Cond, ...] = ()
    provenance: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.src or len(self.src) != len(self.dst):
            raise ValueError(f"law {self.name}: src and dst need the same number of terms "
                             f"(got {len(self.src)} and {len(self.dst)})")

    def variables(self) -> tuple[str, ...]:
        """Pattern variables in order of first appearance in ``src``."""
        seen: dict[str, None] = {}
        for term in self.src:
            for var in term_variables(term):
                seen.setdefault(var)
        return tuple(seen)

    def ops(self) -> frozenset[Op]:
        return frozenset(op for t in self.src + self.dst for op in term_ops(t))


def term_variables(term: Any) -> list[str]:
    """Pattern variable names in ``term`` (tensor operands and attribute values), in order."""
    if isinstance(term, PVar):
        return [term.name]
    if isinstance(term, App):
        names = [n for a in term.args for n in term_variables(a)]
        return names + [n for _, v in term.attrs for n in term_variables(v)]
    if isinstance(term, AttrFn):
        return [n for a in term.args for n in term_variables(a)]
    return []


def term_ops(term: Term) -> list[Op]:
    if isinstance(term, App):
        return [term.op] + [op for a in term.args for op in term_ops(a)]
    return []


def _number_key(value: Any) -> tuple[str, Any]:
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    return ("float", repr(float(value)))  # repr tells -0.0 from 0.0 and is equal for NaNs


# short constructors for rule tables: A(Op.MUL, X, Lit(2))
def A(op: Op, *args: Term, output: int = 0, **attrs: Any) -> App:  # noqa: N802
    return App(op, tuple(args), tuple(attrs.items()), output)


def C(kind: CondKind, *args: Any) -> Cond:  # noqa: N802
    return Cond(kind, tuple(args))


def L(name: str, src: Term | tuple[Term, ...], dst: Term | tuple[Term, ...],  # noqa: N802
      safety: Safety, *when: Cond) -> Law:
    """A law in one line of a rule table: L("mul-one", A(Op.MUL, X, Lit(1)), X, EXACT)."""
    return Law(name, _as_tuple(src), _as_tuple(dst), safety, tuple(when))


def _as_tuple(terms: Term | tuple[Term, ...]) -> tuple[Term, ...]:
    return terms if isinstance(terms, tuple) else (terms,)


def F(kind: AttrFnKind, *args: Any) -> AttrFn:  # noqa: N802
    return AttrFn(kind, tuple(args))
