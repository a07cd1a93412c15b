"""The rule text format: S-expressions over kiln's op names (grammar in docs/rules.md).

    ; x*1 -> x
    (rule mul-one (src (mul ?x 1)) (dst ?x) (safety exact))
    (rule div-const
      (src (div ?x ?c)) (dst (mul ?x (reciprocal ?c)))
      (safety ieee) (when (finite-nonzero ?c))
      (from (origin "hand") (file "kiln/rules/arith.py")))

`parse_rules` reads a file's text into `Law`s; `print_law` writes one back, and
``parse_rules(print_law(law)) == [law]`` for every law. Errors name the line and column.
`check_types` (run by `load_rules`) instantiates each law on small shapes and refuses a law
whose sides have different types, naming the rule's line.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.ir.attrs import attrs_class_of
from kiln.ir.ops import Op
from kiln.ir.types import DType
from kiln.rewrite.law import (
    App,
    AttrFn,
    AttrFnKind,
    Cond,
    CondKind,
    Law,
    Lit,
    PVar,
    Safety,
    Term,
    term_variables,
)


class RuleTextError(ValueError):
    def __init__(self, line: int, column: int, message: str, source: str = "") -> None:
        where = f"{source}:" if source else "line "
        super().__init__(f"{where}{line}:{column}: {message}")
        self.line = line
        self.column = column
        self.message = message


# --- reading S-expressions -------------------------------------------------------------------

@dataclass(frozen=True)
class Atom:
    text: str
    line: int
    column: int
    quoted: bool = False


@dataclass(frozen=True)
class SList:
    items: tuple[Any, ...]
    line: int
    column: int


_TOKEN = re.compile(r'\s+|;[^\n]*|\(|\)|"(?:[^"\\]|\\.)*"|[^\s()";]+')


def _tokens(text: str, source: str) -> Iterator[Atom]:
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise RuleTextError(line, pos - line_start + 1, f"unexpected {text[pos]!r}", source)
        token = m.group()
        column = pos - line_start + 1
        if not token[0].isspace() and token[0] != ";":
            if token[0] == '"':
                yield Atom(bytes(token[1:-1], "utf-8").decode("unicode_escape"), line, column,
                           quoted=True)
            else:
                yield Atom(token, line, column)
        newlines = token.count("\n")
        if newlines:
            line += newlines
            line_start = pos + token.rindex("\n") + 1
        pos = m.end()


def read_sexprs(text: str, source: str = "") -> list[Any]:
    stack: list[tuple[list[Any], Atom]] = []
    top: list[Any] = []
    for tok in _tokens(text, source):
        if tok.text == "(" and not tok.quoted:
            stack.append(([], tok))
        elif tok.text == ")" and not tok.quoted:
            if not stack:
                raise RuleTextError(tok.line, tok.column, "')' without '('", source)
            items, opener = stack.pop()
            done = SList(tuple(items), opener.line, opener.column)
            (stack[-1][0] if stack else top).append(done)
        else:
            (stack[-1][0] if stack else top).append(tok)
    if stack:
        opener = stack[-1][1]
        raise RuleTextError(opener.line, opener.column, "'(' is never closed", source)
    return top


# --- S-expressions to laws ---------------------------------------------------------------------

class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, at: Atom | SList, message: str) -> RuleTextError:
        return RuleTextError(at.line, at.column, message, self.source)

    def symbol(self, item: Any, what: str) -> str:
        if not isinstance(item, Atom) or item.quoted:
            raise self.fail(item, f"expected {what}")
        return item.text

    def law(self, form: SList) -> Law:
        items = form.items
        if not items or self.symbol(items[0], "'rule'") != "rule":
            raise self.fail(form, "expected (rule NAME (src ...) (dst ...) (safety ...))")
        if len(items) < 2:
            raise self.fail(form, "a rule needs a name")
        name = self.symbol(items[1], "a rule name")
        clauses: dict[str, SList] = {}
        for clause in items[2:]:
            if not isinstance(clause, SList) or not clause.items:
                raise self.fail(clause, "expected a clause: (src ...), (dst ...), (safety ...), "
                                "(when ...) or (from ...)")
            head = self.symbol(clause.items[0], "a clause name")
            if head not in ("src", "dst", "safety", "when", "from"):
                raise self.fail(clause, f"unknown clause {head!r}; clauses: src, dst, safety, "
                                "when, from")
            if head in clauses:
                raise self.fail(clause, f"rule {name}: {head} given twice")
            clauses[head] = clause
        for needed in ("src", "dst", "safety"):
            if needed not in clauses:
                raise self.fail(form, f"rule {name}: missing ({needed} ...)")
        src = tuple(self.term(t) for t in clauses["src"].items[1:])
        dst = tuple(self.term(t) for t in clauses["dst"].items[1:])
        if not src or len(src) != len(dst):
            raise self.fail(clauses["dst"], f"rule {name}: src has {len(src)} term(s), dst "
                            f"{len(dst)}; they must have the same number")
        safety = self.safety(clauses["safety"])
        when = tuple(self.cond(c) for c in clauses["when"].items[1:]) if "when" in clauses \
            else ()
        provenance = self.provenance(clauses["from"]) if "from" in clauses else ()
        law = Law(name, src, dst, safety, when, provenance)
        self.check_variables(law, form)
        return law

    def safety(self, clause: SList) -> Safety:
        if len(clause.items) != 2:
            raise self.fail(clause, "expected (safety exact|ieee|fast_math)")
        text = self.symbol(clause.items[1], "exact, ieee or fast_math")
        try:
            return Safety(text)
        except ValueError:
            raise self.fail(clause.items[1], f"unknown safety {text!r}; use exact, ieee or "
                            "fast_math") from None

    def provenance(self, clause: SList) -> tuple[tuple[str, str], ...]:
        pairs = []
        for item in clause.items[1:]:
            if not isinstance(item, SList) or len(item.items) != 2:
                raise self.fail(item, "expected (key \"value\") in (from ...)")
            key = self.symbol(item.items[0], "a provenance key")
            value = item.items[1]
            if not isinstance(value, Atom):
                raise self.fail(value, "a provenance value is one word or a string")
            pairs.append((key, value.text))
        return tuple(pairs)

    def cond(self, item: Any) -> Cond:
        if not isinstance(item, SList) or not item.items:
            raise self.fail(item, "expected a condition such as (float ?x)")
        text = self.symbol(item.items[0], "a condition name")
        try:
            kind = CondKind.parse(text)
        except ValueError as err:
            raise self.fail(item, str(err)) from None
        args = item.items[1:]
        if len(args) != kind.arity:
            raise self.fail(item, f"({kind.text} ...) takes {kind.arity} argument(s), got "
                            f"{len(args)}")
        if kind is CondKind.GUARD:
            return Cond(kind, (self.symbol(args[0], "a guard name"),))
        return Cond(kind, tuple(self.variable(a) for a in args))

    def variable(self, item: Any) -> PVar:
        text = self.symbol(item, "a ?variable")
        if not text.startswith("?") or len(text) < 2:
            raise self.fail(item, f"expected a ?variable, got {text!r}")
        return PVar(text[1:])

    def term(self, item: Any) -> Term:
        if isinstance(item, Atom):
            if item.quoted:
                raise self.fail(item, "a string is not a term")
            if item.text.startswith("?"):
                return self.variable(item)
            number = _number(item.text)
            if number is None:
                raise self.fail(item, f"expected a term (?x, a number or (op ...)), got "
                                f"{item.text!r}")
            return Lit(number)
        if not item.items:
            raise self.fail(item, "empty term ()")
        head = self.symbol(item.items[0], "an op name")
        if head == "nth":
            return self.nth(item)
        if head in _ATTR_FNS:  # a number computed at compile time: (inverse ?c)
            return AttrFn(_ATTR_FNS[head], tuple(self.term(a) for a in item.items[1:]))
        try:
            op = Op.parse(head)
        except ValueError:
            raise self.fail(item.items[0], f"unknown op {head!r} (kiln's op names are listed "
                            "in docs/rules.md)") from None
        rest = list(item.items[1:])
        attrs: list[tuple[str, Any]] = []
        args: list[Term] = []
        while rest:
            first = rest.pop(0)
            if isinstance(first, Atom) and not first.quoted and first.text.startswith(":"):
                if not rest:
                    raise self.fail(first, f"{first.text} needs a value")
                key = first.text[1:]
                attrs.append((key, self.attr_value(op, key, rest.pop(0))))
            else:
                args.append(self.term(first))
        self.check_attributes(op, dict(attrs), item)
        return App(op, tuple(args), tuple(attrs))

    def check_attributes(self, op: Op, given: dict[str, Any], at: SList) -> None:
        cls = attrs_class_of(op)
        if not dataclasses.is_dataclass(cls):
            return
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in given
                   and f.default is dataclasses.MISSING]
        if missing:
            raise self.fail(at, f"{op.text} needs {', '.join(':' + k for k in missing)} "
                            "(a value or a ?variable)")

    def nth(self, item: SList) -> App:
        if len(item.items) != 3:
            raise self.fail(item, "expected (nth INDEX (op ...))")
        index = _number(self.symbol(item.items[1], "an output index"))
        inner = self.term(item.items[2])
        if not isinstance(index, int) or isinstance(index, bool) or not isinstance(inner, App):
            raise self.fail(item, "expected (nth INDEX (op ...)) with an integer index")
        return dataclasses.replace(inner, output=index)

    def attr_value(self, op: Op, key: str, item: Any) -> Any:
        cls = attrs_class_of(op)
        fields = {f.name: str(f.type) for f in dataclasses.fields(cls)} \
            if dataclasses.is_dataclass(cls) else {}
        if key not in fields:
            known = ", ".join(":" + k for k in fields) or "none"
            raise self.fail(item, f"{op.text} has no attribute :{key} (it has: {known})")
        return self.value(item, fields[key])

    def value(self, item: Any, annotation: str) -> Any:
        if isinstance(item, SList):
            if item.items and isinstance(item.items[0], Atom) and not item.items[0].quoted \
                    and item.items[0].text in _ATTR_FNS:
                kind = _ATTR_FNS[item.items[0].text]
                return AttrFn(kind, tuple(self.value(a, annotation) for a in item.items[1:]))
            return tuple(self.value(a, annotation) for a in item.items)
        if item.quoted:
            return item.text
        text = item.text
        if text.startswith("?"):
            return self.variable(item)
        if text == "none":
            return None
        number = _number(text)
        if number is not None:
            return number
        if "Op" in annotation:
            try:
                return Op.parse(text)
            except ValueError:
                raise self.fail(item, f"unknown op {text!r}") from None
        if "DType" in annotation:
            try:
                return DType(text)
            except ValueError:
                raise self.fail(item, f"unknown dtype {text!r}") from None
        return text

    def check_variables(self, law: Law, form: SList) -> None:
        bound = set(law.variables())
        for term in law.dst:
            for name in term_variables(term):
                if name not in bound:
                    raise self.fail(form, f"rule {law.name}: ?{name} appears in dst but not "
                                    "in src")
        for cond in law.when:
            for arg in cond.args:
                if isinstance(arg, PVar) and arg.name not in bound:
                    raise self.fail(form, f"rule {law.name}: condition ({cond.kind.text} "
                                    f"?{arg.name}) names a variable src does not bind")


_ATTR_FNS = {kind.value: kind for kind in AttrFnKind}


def _number(text: str) -> bool | int | float | None:
    if text in ("true", "false"):
        return text == "true"
    if text in ("inf", "+inf", "-inf", "nan"):
        return float(text)
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class ParsedLaw:
    law: Law
    line: int


def parse_rules(text: str, source: str = "") -> list[Law]:
    """The laws in a rule file's text, in order. RuleTextError names line and column."""
    return [p.law for p in parse_rules_at(text, source)]


def parse_rules_at(text: str, source: str = "") -> list[ParsedLaw]:
    reader = _Reader(source)
    parsed, names = [], {}
    for form in read_sexprs(text, source):
        if not isinstance(form, SList):
            raise reader.fail(form, f"expected (rule ...), got {form.text!r}")
        law = reader.law(form)
        if law.name in names:
            raise reader.fail(form, f"rule {law.name} is already defined on line "
                              f"{names[law.name]}")
        names[law.name] = form.line
        parsed.append(ParsedLaw(law, form.line))
    return parsed


def load_rules(path: str | Path) -> list[Law]:
    """Parse a rule file and check that each rule's sides have one type (on small shapes)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise RuleTextError(0, 0, f"cannot read the rule file: {err.strerror}", str(path)) \
            from None
    parsed = parse_rules_at(text, str(path))
    for item in parsed:
        check_types(item, str(path))
    return [p.law for p in parsed]


def check_types(item: ParsedLaw, source: str = "") -> None:
    from kiln.synth.instance import LawError, find_instances, type_errors

    law = item.law
    try:
        builts = find_instances(law, count=8, accept=guard_of(law, item.line, source))
    except LawError as err:
        raise RuleTextError(item.line, 1, str(err), source) from None
    if not builts:
        raise RuleTextError(item.line, 1, f"rule {law.name}: no small shapes were found on "
                            "which its src type-checks", source)
    errors = type_errors(law, builts)
    if errors:
        raise RuleTextError(item.line, 1, f"rule {law.name}: its sides have different types "
                            f"{errors[0]}", source)


# --- laws to text ------------------------------------------------------------------------------

def print_law(law: Law) -> str:
    lines = [f"(rule {law.name}",
             f"  (src {' '.join(print_term(t) for t in law.src)})",
             f"  (dst {' '.join(print_term(t) for t in law.dst)})",
             f"  (safety {law.safety.value})"]
    if law.when:
        lines.append(f"  (when {' '.join(_print_cond(c) for c in law.when)})")
    if law.provenance:
        pairs = " ".join(f"({k} {_quote(v)})" for k, v in law.provenance)
        lines.append(f"  (from {pairs})")
    return "\n".join(lines) + ")"


def print_rules(laws: list[Law], header: str = "") -> str:
    comment = "".join(f"; {line}\n" for line in header.splitlines())
    return comment + "\n\n".join(print_law(law) for law in laws) + "\n"


def print_term(term: Term) -> str:
    if isinstance(term, PVar):
        return f"?{term.name}"
    if isinstance(term, Lit):
        return _print_number(term.value)
    if isinstance(term, AttrFn):
        return _print_value(term)
    parts = [term.op.text]
    parts += [f":{k} {_print_value(v)}" for k, v in term.attrs]
    parts += [print_term(a) for a in term.args]
    text = f"({' '.join(parts)})"
    return f"(nth {term.output} {text})" if term.output else text


def _print_cond(cond: Cond) -> str:
    args = [a if isinstance(a, str) else f"?{a.name}" for a in cond.args]
    return f"({' '.join([cond.kind.text] + args)})"


def _print_value(value: Any) -> str:
    if isinstance(value, PVar):
        return f"?{value.name}"
    if isinstance(value, Lit):
        return _print_number(value.value)
    if isinstance(value, AttrFn):
        return f"({' '.join([value.kind.value] + [_print_value(a) for a in value.args])})"
    if isinstance(value, tuple):
        return f"({' '.join(_print_value(v) for v in value)})"
    if value is None:
        return "none"
    if isinstance(value, Op):
        return value.text
    if isinstance(value, DType):
        return value.value
    if isinstance(value, str):
        return _quote(value)
    return _print_number(value)


def _print_number(value: bool | int | float) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "nan"
    return repr(value)  # 1.0, -0.0, inf, -inf, 1e-05


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def guard_of(law: Law, line: int = 0, source: str = "") -> Callable[[Any], bool] | None:
    """For a law with ``(guard NAME)`` conditions: a test that the hand-written rule stating
    the law fires on an instance (its pattern and Python guards). None without guards."""
    from kiln.rules import rule_of_law
    from kiln.synth.instance import rule_fires

    guards = [c.args[0] for c in law.when if c.kind is CondKind.GUARD]
    if not guards:
        return None
    rule = rule_of_law(law.name)
    if rule is None:
        raise RuleTextError(line, 1, f"rule {law.name}: (guard {guards[0]}) names a guard of a "
                            "hand-written rule, and no hand-written rule states a law of this "
                            "name", source)
    return lambda built: rule_fires(rule, built)
