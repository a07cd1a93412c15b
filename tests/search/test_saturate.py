"""Equality saturation (egglog) and extraction: equal results, laws as rewrites, greedy tree
cost against ILP DAG cost, no cycles chosen, ill-typed rewrites never trusted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kiln.cost.analytic import AnalyticCost, Roofline
from kiln.cost.graph import GraphCost
from kiln.ir import interpret, parse_graph
from kiln.ir.ops import Op
from kiln.rewrite.law import EXACT, A, C, CondKind, L, Lit, PVar
from kiln.search.equality import optimize
from kiln.search.extract import Typed, extract_greedy, extract_ilp
from kiln.search.rules import shipped_generated_rules
from kiln.search.saturate import (
    Encoding,
    ENode,
    SatLimits,
    UnsupportedLaw,
    egglog_rule,
    relevant_laws,
    saturate,
)

MODEL = AnalyticCost(Roofline())
X, Y, Z, S = PVar("x"), PVar("y"), PVar("z"), PVar("s")
GENERATED_LAWS = [r.laws[0] for r in shipped_generated_rules()]


def test_saturation_finds_the_folded_weight_product(weight_chain) -> None:
    graph = weight_chain
    outcome = optimize(graph, GENERATED_LAWS, MODEL, SatLimits(seconds=60.0))
    assert outcome.chosen in ("greedy", "ilp")
    assert outcome.cost_after < 0.6 * outcome.cost_before
    assert outcome.rejected == 0 and outcome.stopped == "saturated"
    assert [n.op for n in outcome.graph.nodes if n.op is Op.MM].count(Op.MM) == 2  # one folds
    x = torch.randn(4, 64)
    torch.testing.assert_close(interpret(outcome.graph, [x])[0], interpret(graph, [x])[0],
                               rtol=1e-4, atol=1e-4)


def test_only_laws_that_can_match_are_loaded(weight_chain) -> None:
    graph = weight_chain
    relevant = relevant_laws(graph, GENERATED_LAWS)
    assert 0 < len(relevant) < len(GENERATED_LAWS)
    ops = {op for law in relevant for app in law.src for op in _ops(app)}
    assert Op.CONVOLUTION not in ops  # no convolution here, and no mm law makes one


def _ops(term) -> set:
    from kiln.rewrite.law import term_ops
    return set(term_ops(term))


def test_laws_egglog_cannot_state_are_refused_with_a_reason() -> None:
    enc = Encoding()
    with pytest.raises(UnsupportedLaw, match="float"):
        egglog_rule(L("f", A(Op.NEG, A(Op.NEG, X)), X, EXACT, C(CondKind.FLOAT, X)), enc)
    with pytest.raises(UnsupportedLaw, match="literal"):
        egglog_rule(L("p", A(Op.PERMUTE, X, dims=PVar("d")), X, EXACT), enc)
    text = egglog_rule(L("m", A(Op.MUL, X, S), A(Op.MUL, S, X), EXACT, C(CondKind.NUMBER, S)),
                       enc)
    assert "(Num ?s)" in text and text.startswith("(rule ((= lhs (Op \"mul\"")


def test_limits_stop_a_growing_e_graph() -> None:
    graph = parse_graph("""graph(%a: f32[8], %b: f32[8], %c: f32[8], %d: f32[8], %e: f32[8]) {
  %s1 = add(%a, %b) : f32[8]
  %s2 = add(%s1, %c) : f32[8]
  %s3 = add(%s2, %d) : f32[8]
  %s4 = add(%s3, %e) : f32[8]
  return %s4
}""")
    assoc = L("assoc", A(Op.ADD, A(Op.ADD, X, Y), Z), A(Op.ADD, X, A(Op.ADD, Y, Z)), EXACT)
    back = L("assoc.back", A(Op.ADD, X, A(Op.ADD, Y, Z)), A(Op.ADD, A(Op.ADD, X, Y), Z), EXACT)
    full = saturate(graph, [assoc, back], SatLimits(iterations=50))
    assert full.stopped == "saturated" and full.matches["assoc"] > 0
    short = saturate(graph, [assoc, back], SatLimits(iterations=1))
    assert short.stopped == "iterations" and short.iterations == 1
    small = saturate(graph, [assoc, back], SatLimits(iterations=50, nodes=10))
    assert small.stopped == "nodes"


def _typed(classes: dict[str, list[tuple[ENode, float]]]) -> Typed:
    typed = Typed({c: None for c in classes}, {c: [n for n, _ in ns] for c, ns in
                                               classes.items()}, {})
    for ns in classes.values():
        for n, cost in ns:
            typed.cost[n] = cost
    return typed


def _op(name: str, *children: str) -> ENode:
    return ENode("op", (name, "a0"), children)


def test_ilp_counts_a_shared_term_once_where_greedy_counts_it_per_use() -> None:
    leaf = ENode("leaf", (0,), ())
    typed = _typed({
        "L": [(leaf, 0.0)],
        "A": [(_op("a", "L"), 10.0)],
        "B": [(_op("b", "L"), 5.0)],
        "R1": [(_op("r1", "A"), 0.0)],
        "R2": [(_op("via-b", "B"), 1.0), (_op("via-a", "A"), 2.0)],
    })
    greedy = extract_greedy(typed, ["R1", "R2"])
    assert greedy["R2"].data[0] == "via-b"  # 1 + 5 < 2 + 10 counted as a tree
    ilp = extract_ilp(typed, ["R1", "R2"], 5.0, greedy)
    assert ilp["R2"].data[0] == "via-a"  # A is needed by R1 anyway: 2 < 1 + 5


def test_no_extraction_chooses_a_cycle() -> None:
    leaf = ENode("leaf", (0,), ())
    plus_zero = _op("add-zero", "C")  # x = x + 0: the class contains itself
    typed = _typed({
        "L": [(leaf, 0.0)],
        "C": [(plus_zero, 0.0), (_op("relu", "L"), 3.0)],
        "R": [(_op("neg", "C"), 1.0)],
    })
    for choice in (extract_greedy(typed, ["R"]), extract_ilp(typed, ["R"], 5.0)):
        assert choice["C"].data[0] == "relu"


def test_an_ill_typed_rewrite_makes_the_e_graph_untrusted() -> None:
    # x + y -> x is wrong where y broadcasts x up: the union is ill-typed, and then
    # nothing derived in that e-graph is used
    graph = parse_graph("""graph(%x: f32[4], %y: f32[3, 4]) {
  %a = add(%x, %y) : f32[3, 4]
  %r = relu(%a) : f32[3, 4]
  return %r
}""")
    drop = L("drop-y", A(Op.ADD, X, Y), X, EXACT)
    outcome = optimize(graph, [drop], MODEL)
    assert outcome.rejected > 0
    assert outcome.graph is graph and outcome.chosen.startswith("input (an ill-typed")


def test_a_number_operand_law_matches_numbers_only() -> None:
    graph = parse_graph("""graph(%x: f32[4], %y: f32[4]) {
  %c = scalar {value=2.0} : f64[]
  %m = mul(%x, %c) : f32[4]
  %n = mul(%m, %y) : f32[4]
  return %n
}""")
    double = L("double", A(Op.MUL, X, Lit(2.0)), A(Op.ADD, X, X), EXACT)
    run = saturate(graph, [double], SatLimits())
    assert run.matches.get("double") == 1  # x * 2.0, not (x * 2.0) * y
    cost = GraphCost(MODEL)
    assert cost.seconds(optimize(graph, [double], MODEL).graph) <= cost.seconds(graph)


def test_the_ilp_solver_prints_nothing() -> None:
    # HiGHS prints its banner on the C stdout when a process makes its first solver:
    # only a fresh process shows it
    import subprocess
    import sys
    here = str(Path(__file__).parent)
    code = (f"import sys; sys.path[:0] = [{here!r}]\n"
            "from test_saturate import test_ilp_counts_a_shared_term_once_where_greedy_counts"
            "_it_per_use as run\nrun()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
