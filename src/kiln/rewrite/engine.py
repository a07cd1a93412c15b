"""The fixpoint driver: apply a rule table to a graph until no rule fires.

Each sweep walks the graph in order and, at every node, tries the rules whose pattern root
is that node's op, in table order. Matches that overlap one already taken in the sweep wait
for the next sweep; all of a sweep's rewrites are then applied at once (`substitute`), and
dead nodes dropped. The same graph and rule table always give the same result.

A match fires only if its guard agrees, its builder succeeds, and every replacement has the
type of the value it replaces. A builder that raises is a bug in the rule, not in the
user's model: the match is skipped with a warning naming the rule and node.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.ir.graph import Graph, Node, Value, substitute
from kiln.ir.ops import Op, OpGroup
from kiln.options import Options
from kiln.rewrite.pattern import MatchContext
from kiln.rewrite.rule import Match, Rule

MAX_SWEEPS = 64


@dataclass
class RuleStats:
    fired: int = 0
    seconds: float = 0.0  # matching, guarding and building, over every sweep
    errors: int = 0  # matches skipped because the builder raised


@dataclass(frozen=True)
class TraceEvent:
    """One try of a traced rule at a node: where it fired, or why not."""

    rule: str
    node: str  # the root node's name
    fired: bool
    reason: str = ""


@dataclass
class RewriteResult:
    graph: Graph
    stats: dict[str, RuleStats] = field(default_factory=dict)
    trace: list[TraceEvent] = field(default_factory=list)
    sweeps: int = 0


def rules_by_root(rules: Sequence[Rule], options: Options) -> dict[Op, list[Rule]]:
    """The enabled rules, by the ops their pattern's root may have, in table order."""
    by_root: dict[Op, list[Rule]] = {}
    for rule in rules:
        if rule.enabled(options.fast_math):
            for op in sorted(rule.pattern.root_ops() or (), key=lambda o: o.text):
                by_root.setdefault(op, []).append(rule)
    return by_root


@dataclass(frozen=True)
class Move:
    """One rule applied at one place: what a search step does."""

    rule: str
    node: str  # the root node's name
    graph: Graph  # the graph after the rewrite


def single_rewrites(graph: Graph, by_root: dict[Op, list[Rule]],
                    never: set[tuple[str, Node]] | None = None) -> Iterator[Move]:
    """Every way to rewrite ``graph`` with one rule at one node (same checks as a sweep).
    ``never``: (rule, node) pairs whose pattern cannot match the node's subgraph
    (`Pattern.never_matches`); a search passes one set for all the graphs it expands, which
    share most of their (immutable) nodes, and each pair is tested once."""
    ctx = MatchContext(graph)
    for node in graph.nodes:
        for rule in by_root.get(node.op, ()):
            if never is not None:
                if (rule.name, node) in never:
                    continue
                if rule.pattern.never_matches(node.out(getattr(rule.pattern, "output", 0))):
                    never.add((rule.name, node))
                    continue
            outcome = _try(rule, node, ctx, set())
            if isinstance(outcome, str) or outcome is None:
                continue
            match, replaced = outcome
            if replaced:
                yield Move(rule.name, node.name,
                           substitute(graph, replaced, match.new_constants))


def apply_rules(graph: Graph, rules: Sequence[Rule], options: Options,
                trace: Iterable[str] = ()) -> RewriteResult:
    """Rewrite ``graph`` with ``rules`` to a fixpoint; rules named in ``trace`` are traced."""
    active = [r for r in rules if r.enabled(options.fast_math)]
    by_root = rules_by_root(active, options)
    result = RewriteResult(graph, {r.name: RuleStats() for r in active})
    traced = set(trace)
    fired: list[TraceEvent] = []
    first_misses: list[TraceEvent] = []
    for sweep in range(MAX_SWEEPS):
        events: list[TraceEvent] = []
        new_graph = _sweep(result.graph, by_root, result.stats, traced, events)
        fired.extend(e for e in events if e.fired)
        if sweep == 0:  # misses as the pass received the graph; later sweeps see rewritten ones
            first_misses = [e for e in events if not e.fired]
        fired_at = {(e.rule, e.node) for e in fired}
        result.trace = fired + [e for e in first_misses if (e.rule, e.node) not in fired_at]
        result.sweeps = sweep + 1
        if new_graph is None:
            return result
        result.graph = new_graph
    warnings.warn(f"kiln: rewriting did not settle after {MAX_SWEEPS} sweeps; "
                  f"the graph is correct but may be less optimized", stacklevel=2)
    return result


def _sweep(graph: Graph, by_root: dict[Op, list[Rule]], stats: dict[str, RuleStats],
           traced: set[str], events: list[TraceEvent]) -> Graph | None:
    ctx = MatchContext(graph)
    claimed: set[Node] = set()
    mapping: dict[Value, Value] = {}
    constants: dict[str, torch.Tensor] = {}
    for node in graph.nodes:
        for rule in by_root.get(node.op, ()):
            if node in claimed:
                break
            start = time.perf_counter()
            outcome = _try(rule, node, ctx, claimed)
            stats[rule.name].seconds += time.perf_counter() - start
            if isinstance(outcome, str):
                if rule.name in traced:
                    events.append(TraceEvent(rule.name, node.name, False, outcome))
                continue
            if outcome is None:  # the builder raised; already warned
                stats[rule.name].errors += 1
                continue
            match, replaced = outcome
            stats[rule.name].fired += 1
            if rule.name in traced:
                events.append(TraceEvent(rule.name, node.name, True))
            mapping.update(replaced)
            constants.update(match.new_constants)
            claimed.update(n for n, _ in match.bindings.get("_interior", ()))
            claimed.add(node)
    if not mapping:
        return None
    return substitute(graph, mapping, constants)


def _try(rule: Rule, node: Node, ctx: MatchContext, claimed: set[Node]
         ) -> str | tuple[Match, dict[Value, Value]] | None:
    """Why ``rule`` does not fire at ``node`` (a string), or the match and its rewrite. A
    commutative root whose match fails a check is tried once more with its operands the
    other way round (``x + conv(..)`` where x is a shared conv output: the conv that only
    the add reads is the one to fuse)."""
    outcome = _try_order(rule, node, ctx, claimed)
    if not isinstance(outcome, str) or not node.op.is_a(OpGroup.COMMUTATIVE) \
            or len(node.inputs) != 2:
        return outcome
    ctx.swapped.add(node)
    try:
        swapped = _try_order(rule, node, ctx, claimed)
    finally:
        ctx.swapped.discard(node)
    return outcome if isinstance(swapped, str) else swapped


def _try_order(rule: Rule, node: Node, ctx: MatchContext, claimed: set[Node]
               ) -> str | tuple[Match, dict[Value, Value]] | None:
    pattern = rule.pattern
    root_value = node.out(getattr(pattern, "output", 0))
    bindings: dict[str, Any] = {}
    reason = pattern.match(root_value, ctx, bindings)
    if reason:
        return reason
    interior = bindings.get("_interior", [])
    members = bindings.get("members")
    roots = [m["_root"] for m in members] if members else [node]
    matched = {n for n, _ in interior}
    reason = _check_interior(interior, roots, matched, ctx, claimed)
    if reason:
        return reason
    match = Match(bindings, ctx, node)
    if rule.guard is not None:
        reason = rule.guard(match)
        if reason:
            return f"guard: {reason}"
    try:
        built = rule.build(match)
    except Exception as err:  # a bug in the rule; the model must still compile
        warnings.warn(f"kiln: rule {rule.name} failed at node {node.name} ({node.op.text}): "
                      f"{type(err).__name__}: {err}; this match is skipped", stacklevel=4)
        return None
    replacements = [built] if isinstance(built, Value) else list(built)
    old = [r.out(_output_of(r, m)) for r, m in zip(roots, members or [bindings])]
    if len(replacements) != len(old):
        warnings.warn(f"kiln: rule {rule.name} at node {node.name} gave {len(replacements)} "
                      f"values for {len(old)} roots; this match is skipped", stacklevel=4)
        return None
    for before, after in zip(old, replacements):
        if before.type != after.type:
            return f"the result would be {after.type}, not {before.type}"
        if _depends_on(after, before, match.new_nodes):
            warnings.warn(f"kiln: rule {rule.name} at node {node.name} built a cycle; "
                          f"this match is skipped", stacklevel=4)
            return None
    return match, {b: a for b, a in zip(old, replacements) if b != a}


def _output_of(root: Node, bindings: dict[str, Any]) -> int:
    return 0 if len(root.types) == 1 else int(bindings.get("_output", 0))


def _check_interior(interior: list[tuple[Node, bool]], roots: list[Node], matched: set[Node],
                    ctx: MatchContext, claimed: set[Node]) -> str:
    for root in roots:
        if root in claimed:
            return f"{root.name} is already rewritten in this sweep"
        if len(root.types) > 1:
            return f"{root.name} has several outputs"
    for node, shared in interior:
        if node in roots:
            continue
        if node in claimed:
            return f"{node.name} is already rewritten in this sweep"
        if shared:
            continue
        outside = [u for u in ctx.users.get(node, []) if u not in matched]
        if outside:
            return (f"{node.name} is also used by {outside[0].name}; "
                    "rewriting would compute it twice")
        if any(v.node is node for v in ctx.graph.outputs):
            return f"{node.name} is a graph output"
    return ""


def _depends_on(value: Value, target: Value, new_nodes: list[Node]) -> bool:
    """Does the replacement read the value it replaces (through the new nodes)?"""
    fresh = set(new_nodes)
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if v == target:
            return True
        if v.node in fresh and v.node not in seen:
            seen.add(v.node)
            stack.extend(v.node.inputs)
    return False
