"""The strength each output is compared at follows what was rounded differently upstream."""

from __future__ import annotations

from kiln.fuzz.compare import Strength
from kiln.fuzz.exactness import Rounding, strengths
from kiln.ir import parse_graph

TEXT = """graph(%x: f32[4], %y: f32[4]) {
  %e = exp(%x) : f32[4]
  %d = div(%e, %y) {rounding_mode=None} : f32[4]
  %g = gt(%d, %y) : bool[4]
  %s = sum(%d) {dims=None, keepdim=False} : f32[]
  %n = neg(%y) : f32[4]
  return %e, %d, %g, %s, %n
}
"""


def by_name(rounding: Rounding) -> dict[str, Strength]:
    graph = parse_graph(TEXT)
    found = strengths(graph, rounding)
    return {v.node.name: found[v] for v in graph.outputs}


def test_nothing_rounded_is_exact():
    assert set(by_name(Rounding()).values()) == {Strength.EXACT}


def test_a_rounded_node_makes_what_follows_close_and_discontinuities_unchecked():
    s = by_name(Rounding(rounded={"e"}))
    assert s == {"e": Strength.CLOSE, "d": Strength.CLOSE, "g": Strength.UNCHECKED,
                 "s": Strength.CLOSE, "n": Strength.EXACT}


def test_a_rounded_sum_leaves_zero_signs_free():
    assert by_name(Rounding(rounded={"s"}))["s"] is Strength.NEAR


def test_fast_math_nodes_are_unchecked():
    s = by_name(Rounding(fast={"d"}))
    assert s["d"] is Strength.UNCHECKED and s["e"] is Strength.EXACT


def test_layout_changes_round_only_layout_sensitive_ops():
    s = by_name(Rounding(relaid={"n"}))
    assert s["n"] is Strength.EXACT  # neg is exact in any layout
    s = by_name(Rounding(relaid={"d"}))
    assert s["d"] is Strength.EXACT and s["s"] is Strength.NEAR  # the sum reads it


def test_an_unknown_name_makes_everything_close():
    s = by_name(Rounding(rounded={"not_in_the_graph"}))
    assert s["n"] is Strength.CLOSE and s["g"] is Strength.UNCHECKED



def test_max_and_min_in_another_layout_leave_zero_signs_free():
    graph = parse_graph("""graph(%x: f32[4], %y: f32[4]) {
  %s = sub(%x, %y) : f32[4]
  %m = minimum(%y, %s) : f32[4]
  return %m
}
""")
    found = strengths(graph, Rounding(relaid={"s"}))
    assert found[graph.outputs[0]] is Strength.NEAR


def test_gelu_in_another_layout_is_not_compared():
    graph = parse_graph("""graph(%x: f32[4]) {
  %e = exp(%x) : f32[4]
  %g = gelu(%e) {approximate='none'} : f32[4]
  %t = gelu(%e) {approximate='tanh'} : f32[4]
  return %g, %t
}
""")
    found = strengths(graph, Rounding(relaid={"e"}))
    assert [found[v] for v in graph.outputs] == [Strength.UNCHECKED, Strength.CLOSE]


def test_a_norm_without_eps_is_a_pole_for_a_rounded_input():
    # var = 0 with eps = 0: rsqrt(0) = inf times the rounding of x - mean (seed 5, graph 19699)
    graph = parse_graph("""graph(%x: f32[2, 3, 4], %w: f32[3]) {
  %g = gelu(%x) {approximate='tanh'} : f32[2, 3, 4]
  %b0 = batch_norm(%g, %w, %w, %w, %w) {eps=0.0} : f32[2, 3, 4]
  %b1 = batch_norm(%g, %w, %w, %w, %w) {eps=1e-05} : f32[2, 3, 4]
  return %b0, %b1
}
""")
    found = strengths(graph, Rounding(rounded={"g"}))
    assert [found[v] for v in graph.outputs] == [Strength.UNCHECKED, Strength.CLOSE]


def test_rsqrt_in_another_layout_rounds_apart():
    # ATen's bfloat16 rsqrt is 1 ulp apart in its strided and dense loops (seed 5, graph 33973)
    graph = parse_graph("""graph(%x: bf16[5, 8]) {
  %r = rsqrt(%x) : bf16[5, 8]
  %f = floor(%r) : bf16[5, 8]
  return %f
}
""")
    found = strengths(graph, Rounding(relaid={"r"}))
    assert found[graph.outputs[0]] is Strength.UNCHECKED
