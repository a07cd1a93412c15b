"""TASO's backtracking search: cheaper graphs found, alpha lets a step get worse, seen graphs
skipped, limits respected, seeds kept."""

from __future__ import annotations

import torch

from kiln.cost.analytic import AnalyticCost, Roofline
from kiln.ir import Graph, interpret, parse_graph
from kiln.ir.ops import Op
from kiln.options import Options
from kiln.rewrite.law import EXACT, A, L, PVar
from kiln.search.backtrack import Limits, backtrack, graph_key
from kiln.search.rules import shipped_generated_rules
from kiln.synth.as_rule import rule_from_law

MODEL = AnalyticCost(Roofline())
X, Y, Z = PVar("x"), PVar("y"), PVar("z")


def test_the_search_reassociates_a_weight_product(weight_chain) -> None:
    graph = weight_chain
    outcome = backtrack(graph, shipped_generated_rules(), Options(), MODEL)
    assert outcome.cost_after < 0.6 * outcome.cost_before
    assert [rule for rule, _ in outcome.path] == ["gen-mm-3.reverse"]
    x = torch.randn(4, 64)
    torch.testing.assert_close(interpret(outcome.graph, [x])[0], interpret(graph, [x])[0],
                               rtol=1e-4, atol=1e-4)
    assert outcome.stopped == "exhausted"


def _double_negation() -> Graph:
    return parse_graph("""graph(%x: f32[256, 256]) {
  %n = neg(%x) : f32[256, 256]
  %m = neg(%n) : f32[256, 256]
  %e = exp(%m) : f32[256, 256]
  return %e
}""")


def test_alpha_lets_the_search_take_a_costlier_step_to_reach_a_cheaper_graph() -> None:
    graph = _double_negation()
    # exp(neg(neg(x))): "expand" rewrites neg(neg(x)) into neg(neg(neg(neg(x)))) (costlier);
    # "collapse" removes four negations at once. Only a search that accepts the costlier
    # graph first reaches exp(x).
    expand = rule_from_law(L("expand", A(Op.NEG, A(Op.NEG, X)),
                             A(Op.NEG, A(Op.NEG, A(Op.NEG, A(Op.NEG, X)))), EXACT))
    collapse = rule_from_law(L("collapse", A(Op.EXP, A(Op.NEG, A(Op.NEG, A(Op.NEG, A(
        Op.NEG, X))))), A(Op.EXP, X), EXACT))
    strict = backtrack(graph, [expand, collapse], Options(), MODEL, Limits(alpha=1.0))
    assert strict.path == () and strict.cost_after == strict.cost_before
    relaxed = backtrack(graph, [expand, collapse], Options(), MODEL, Limits(alpha=2.5))
    assert [rule for rule, _ in relaxed.path] == ["expand", "collapse"]
    assert relaxed.cost_after < 0.5 * relaxed.cost_before
    assert [n.op for n in relaxed.graph.nodes] == [Op.EXP]


def test_seen_graphs_are_not_costed_twice_and_the_limits_hold() -> None:
    swap = rule_from_law(L("swap", A(Op.ADD, X, Y), A(Op.ADD, Y, X), EXACT))
    graph = parse_graph("""graph(%x: f32[8], %y: f32[8]) {
  %a = sub(%x, %y) : f32[8]
  %b = add(%a, %x) : f32[8]
  return %b
}""")
    outcome = backtrack(graph, [swap], Options(), MODEL)
    # the input and its swapped twin; swapping back gives the input, already seen
    assert outcome.explored == 2 and outcome.expanded == 2 and outcome.stopped == "exhausted"
    assoc = rule_from_law(L("assoc", A(Op.ADD, A(Op.ADD, X, Y), Z), A(Op.ADD, X, A(Op.ADD, Y, Z)),
                            EXACT))
    back = rule_from_law(L("assoc.back", A(Op.ADD, X, A(Op.ADD, Y, Z)),
                           A(Op.ADD, A(Op.ADD, X, Y), Z), EXACT))
    wide = parse_graph("""graph(%a: f32[8], %b: f32[8], %c: f32[8], %d: f32[8]) {
  %s1 = add(%a, %b) : f32[8]
  %s2 = add(%s1, %c) : f32[8]
  %s3 = add(%s2, %d) : f32[8]
  return %s3
}""")
    full = backtrack(wide, [assoc, back], Options(), MODEL, Limits(alpha=1.01))
    assert full.stopped == "exhausted" and full.explored > 10  # groupings and orders of 4 terms
    capped = backtrack(wide, [assoc, back], Options(), MODEL, Limits(alpha=1.01, expansions=3))
    assert capped.stopped == "expansions" and capped.expanded == 3
    timed = backtrack(wide, [assoc, back], Options(), MODEL, Limits(alpha=1.01, seconds=0.0))
    assert timed.stopped == "time" and timed.expanded == 0


def test_the_graph_key_ignores_names_and_tells_structures_apart() -> None:
    a = parse_graph("graph(%x: f32[4]) {\n  %r = relu(%x) : f32[4]\n  return %r\n}")
    b = parse_graph("graph(%in: f32[4]) {\n  %other = relu(%in) : f32[4]\n  return %other\n}")
    c = parse_graph("graph(%x: f32[4]) {\n  %r = neg(%x) : f32[4]\n  return %r\n}")
    assert graph_key(a) == graph_key(b) != graph_key(c)


def test_a_seed_cheaper_than_anything_found_is_returned(weight_chain) -> None:
    graph = weight_chain
    seed = parse_graph("graph(%x: f32[4, 64]) {\n  %z = neg(%x) : f32[4, 64]\n  return %z\n}")
    outcome = backtrack(graph, [], Options(), MODEL, seeds=[("cheap", seed)])
    assert outcome.graph is seed and outcome.seed == "cheap" and outcome.path == ()


def test_generated_rules_that_are_not_exact_wait_for_fast_math() -> None:
    from kiln.rewrite.rule import EXACT
    from kiln.rules import ALL_RULES
    from kiln.search.rules import search_rules

    default = search_rules(ALL_RULES, generated=True)
    generated = [r for r in default if r.name.startswith("gen-")]
    assert generated and all(r.safety is EXACT for r in generated)
    assert "gen-add-1" not in {r.name for r in default}  # reassociation moves an overflow
    fast = search_rules(ALL_RULES, generated=True, fast_math=True)
    assert len(fast) > len(default) and "gen-add-1" in {r.name for r in fast}
