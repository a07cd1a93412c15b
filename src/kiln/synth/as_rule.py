"""A law as a runnable `Rule`: its source term becomes a pattern, its destination a builder.

    rule = rule_from_law(law)          # LawError where the law cannot run as a rule
    rules = runnable_rules(load_rules("gen.txt"), every_shape_only=True)

This is how generated rules reach the search (`kiln.search`). The pattern matches the source
term node by node: ops and output indices as written; an attribute the law names equals its
value (a ``?variable`` binds it, the same wherever it recurs); an attribute the law leaves out
must have its default; a commutative binary op matches either operand order (bit-exact by
`OpGroup.COMMUTATIVE`). Side conditions are tested on the bound values. The engine checks
that the replacement has the replaced value's exact type, so broadcasting or promotion that
the law's proof did not cover can never slip through.

Laws with a ``(guard NAME)`` condition, or with several roots (parallel merges), run as
their hand-written rules, not from here: `rule_from_law` refuses them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kiln.ir.attrs import Attrs, attrs_class_of, canonical
from kiln.ir.graph import Value
from kiln.ir.ops import Op, OpGroup
from kiln.rewrite.law import (
    App,
    AttrFn,
    AttrFnKind,
    CondKind,
    Law,
    Lit,
    PVar,
    Term,
    term_ops,
    term_variables,
)
from kiln.rewrite.pattern import MatchContext, Pattern
from kiln.rewrite.rule import Match, Rule
from kiln.synth.instance import NUMBER_CONDITIONS, LawError, apply_attr_fn, apply_type_fn
from kiln.synth.prune import drop_instances

__all__ = ["LawPattern", "rule_from_law", "runnable_rules"]

_ATTR = "attr:"  # bindings of attribute variables are kept under this prefix


@dataclass(frozen=True)
class LawPattern(Pattern):
    """Matches a law's source term (see the module docstring)."""

    term: App

    def root_ops(self) -> frozenset[Op] | None:
        return frozenset({self.term.op})

    def match(self, value: Value, ctx: MatchContext, b: dict[str, Any]) -> str | None:
        if not _ops_fit(self.term, value):  # most tries end here: no bindings made, no text
            return f"the ops at {value.node.name} are not the source term's"
        return _match(self.term, value, ctx, b)

    def never_matches(self, value: Value) -> bool:
        return not _ops_fit(self.term, value)


def _ops_fit(term: Term, value: Value) -> bool:
    """Whether the graph has the term's ops, output indices and operand counts (either order
    of a commutative binary op): a necessary condition of `_match`, tested without its
    bindings. A search tries every generated rule at every node of every graph it expands
    (ResNeXt-50: 150,000 tries in 21 expansions, 4.5 of the search's 8 s in `_match`)."""
    if not isinstance(term, App):
        return True
    node = value.node
    args = term.args
    if node.op is not term.op or value.index != term.output or len(node.inputs) != len(args):
        return False
    inputs = node.inputs
    if all(_ops_fit(arg, v) for arg, v in zip(args, inputs)):
        return True
    return (len(args) == 2 and node.op.is_a(OpGroup.COMMUTATIVE)
            and _ops_fit(args[0], inputs[1]) and _ops_fit(args[1], inputs[0]))


def _match(term: Term, value: Value, ctx: MatchContext, b: dict[str, Any]) -> str | None:
    if isinstance(term, PVar):
        if term.name in b and b[term.name] != value:
            return f"?{term.name} must be the same value in both places"
        b[term.name] = value
        return None
    if isinstance(term, Lit):
        got = ctx.uniform_value(value)
        if got is None or canonical(got) != canonical(term.value):
            return f"expected the number {term.value!r}"
        return None
    if not isinstance(term, App):
        return f"{term} cannot appear in a source term"
    node = value.node
    if node.op is not term.op or value.index != term.output:
        return f"expected {term.op.text}, got {node.op.text} at {node.name}"
    if len(node.inputs) != len(term.args):
        return f"{node.name}: expected {len(term.args)} operands, got {len(node.inputs)}"
    orders = [tuple(range(len(term.args)))]
    if node.op.is_a(OpGroup.COMMUTATIVE) and len(term.args) == 2:
        orders.append((1, 0))
    first = ""
    for order in orders:
        trial = dict(b)
        trial["_interior"] = list(b.get("_interior", []))
        reason = next((r for slot, arg in zip(order, term.args)
                       if (r := _match(arg, node.inputs[slot], ctx, trial))), None)
        if reason is None:  # attributes last: one may be computed from an operand's type
            reason = _match_attrs(term, node.attrs, trial)
            reason = f"{node.name}: {reason}" if reason else None
        if reason is None:
            b.clear()
            b.update(trial)
            b["_interior"].append((node, False))
            return None
        first = first or reason
    return first


def _match_attrs(term: App, attrs: Attrs, b: dict[str, Any]) -> str:
    named = dict(term.attrs)
    for f in dataclasses.fields(attrs) if dataclasses.is_dataclass(attrs) else ():
        got = getattr(attrs, f.name)
        if f.name not in named:
            if f.default is dataclasses.MISSING or canonical(got) != canonical(f.default):
                return f":{f.name} must have its default, got {got!r}"
            continue
        wanted = named[f.name]
        if isinstance(wanted, PVar):
            key = _ATTR + wanted.name
            if key in b and canonical(b[key]) != canonical(got):
                return f":{f.name} must equal ?{wanted.name} ({b[key]!r}), got {got!r}"
            b[key] = got
        else:
            try:
                value = attr_value(wanted, b)
            except (KeyError, LawError):
                return f":{f.name}: {wanted} cannot be computed here"
            if canonical(value) != canonical(got):
                return f":{f.name} must be {value!r}, got {got!r}"
    return ""


class _Emitter:
    """Builds a law's destination term with a Match's emitter."""

    def __init__(self, law: Law, m: Match) -> None:
        self.law = law
        self.m = m

    def term(self, term: Term) -> Value:
        if isinstance(term, PVar):
            if term.name not in self.m.bindings:  # an attribute used as a number (eps)
                return self.m.number(self.m[_ATTR + term.name])
            return self.m[term.name]
        if isinstance(term, Lit):
            return self.m.number(term.value)
        if isinstance(term, AttrFn):
            return self.m.number(apply_attr_fn(term.kind, [self.number(a) for a in term.args]))
        operands = [self.term(a) for a in term.args]
        node = self.m.node(term.op, *operands, attrs=self.attrs(term))
        return node.out(term.output)

    def number(self, term: Term) -> Any:
        if isinstance(term, Lit):
            return term.value
        if isinstance(term, PVar) and self.m[term.name].node.op is Op.SCALAR:
            return self.m.number_of(term.name)
        raise LawError(f"law {self.law.name}: {term} is not a number operand")

    def attrs(self, term: App) -> Attrs:
        cls = attrs_class_of(term.op)
        values = {key: attr_value(value, self.m.bindings) for key, value in term.attrs}
        return cls(**values)


def attr_value(value: Any, bindings: dict[str, Any]) -> Any:
    """An attribute as a law writes it, given the bound variables: a ?variable's value, a
    type function of a bound tensor, or a compile-time function of other attributes."""
    if isinstance(value, PVar):
        return bindings[_ATTR + value.name]
    if isinstance(value, AttrFn) and value.kind in (AttrFnKind.SHAPE_OF, AttrFnKind.DTYPE_OF,
                                                    AttrFnKind.SIZE):
        var, *rest = value.args
        return apply_type_fn(value.kind, bindings[var.name].type, rest)
    if isinstance(value, AttrFn):
        return apply_attr_fn(value.kind, [attr_value(a, bindings) for a in value.args])
    if isinstance(value, tuple):
        return tuple(attr_value(v, bindings) for v in value)
    return value


def _number(m: Match, name: str) -> Any:
    value = m[name]
    return value.node.attrs.value if value.node.op is Op.SCALAR else None


def _condition_fails(law: Law, m: Match) -> str | None:
    for cond in law.when:
        names = [a.name for a in cond.args if isinstance(a, PVar)]
        kind = cond.kind
        if kind is CondKind.SAME_TYPE:
            if len({m[n].type for n in names}) != 1:
                return f"{' and '.join('?' + n for n in names)} must have one type"
            continue
        value, name = m[names[0]], names[0]
        if kind is CondKind.FLOAT and not value.type.dtype.is_floating:
            return f"?{name} must be a floating-point tensor"
        if kind is CondKind.INT and value.type.dtype.is_floating:
            return f"?{name} must be an integer or bool tensor"
        if kind is CondKind.WEIGHT and not m.ctx.is_weight_only(value):
            return f"?{name} must be a weight"
        if kind in NUMBER_CONDITIONS:
            number = _number(m, name)
            if number is None or isinstance(number, bool) or not _number_holds(kind, number):
                return f"?{name} must be {kind.describe}"
    return None


def _number_holds(kind: CondKind, c: int | float) -> bool:
    if kind is CondKind.NUMBER:
        return True
    if not math.isfinite(c) or c == 0:
        return False
    if kind is CondKind.FINITE_NONZERO:
        return True
    mantissa, exponent = math.frexp(abs(c))
    pow2 = mantissa == 0.5
    if kind is CondKind.POW2:
        return pow2
    if kind is CondKind.POW2_AT_LEAST_ONE:
        return pow2 and 1 <= abs(c) <= 2**20 and c > 0
    return 2.0**-126 <= abs(c) <= 2.0**126  # NORMAL_RECIPROCAL, for f32 (the narrowest kiln
    # compiles such rules for; f16/bf16 operands are refused below)


def rule_from_law(law: Law) -> Rule:
    """The law as a rule for the engine; LawError where it cannot run as one."""
    if len(law.src) != 1:
        raise LawError(f"law {law.name}: {len(law.src)} roots; merges run as hand-written rules")
    if not isinstance(law.src[0], App):
        raise LawError(f"law {law.name}: the source must be an op application")
    if any(c.kind is CondKind.GUARD for c in law.when):
        raise LawError(f"law {law.name}: a (guard ...) condition runs as its hand-written rule")
    narrow = any(c.kind is CondKind.NORMAL_RECIPROCAL for c in law.when)

    def guard(m: Match) -> str | None:
        if narrow and any(isinstance(v, Value) and v.type.dtype.itemsize < 4
                          for v in m.bindings.values()):
            return "1/c is checked for f32 and f64 only"
        return _condition_fails(law, m)

    def build(m: Match) -> Value:
        return _Emitter(law, m).term(law.dst[0])

    return Rule(law.name, LawPattern(law.src[0]), build, law.safety, guard, laws=(law,))


def runnable_rules(laws: Iterable[Law], every_shape_only: bool = True) -> tuple[Rule, ...]:
    """The laws that run as rules, each instance of a more general law left out
    (`kiln.synth.prune`), plus the reverse of each law that keeps the op count (a search
    must be able to undo a rewrite of equal size). ``every_shape_only``: only laws whose
    proof holds for every shape (the axioms), not only on the shapes the prover tried."""
    usable = []
    for law in laws:
        proof = dict(law.provenance).get("proof", "")
        if not every_shape_only or not proof or "every shape" in proof:
            usable.append(law)
    rules = []
    for law in drop_instances(usable):
        candidates = [law]
        back = reverse(law)
        if back is not None and _op_count(law.src) == _op_count(law.dst):
            candidates.append(back)
        for candidate in candidates:
            try:
                rules.append(rule_from_law(candidate))
            except LawError:
                continue
    return tuple(rules)


def reverse(law: Law) -> Law | None:
    """The law read right to left, where that is a law: its right side is an op
    application that binds every variable and computes nothing at compile time."""
    if len(law.dst) != 1 or not isinstance(law.dst[0], App):
        return None
    if _has_fn(law.dst[0]) or set(law.variables()) - set(term_variables(law.dst[0])):
        return None
    return dataclasses.replace(law, name=law.name + ".reverse", src=law.dst, dst=law.src)


def _has_fn(term: Any) -> bool:
    if isinstance(term, AttrFn):
        return True
    if isinstance(term, App):
        return any(_has_fn(a) for a in term.args) or any(_has_fn(v) for _, v in term.attrs)
    if isinstance(term, tuple):
        return any(_has_fn(v) for v in term)
    return False


def _op_count(terms: tuple[Term, ...]) -> int:
    return sum(len(term_ops(t)) for t in terms)
