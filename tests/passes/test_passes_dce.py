"""Dead-code elimination, as before/after IR text."""

from __future__ import annotations

import torch

import kiln_test_support as support  # tests/ir/kiln_test_support.py, loaded by conftest.py
from kiln.ir import Op, parse_graph
from kiln.passes.dce import eliminate_dead_code


def test_drops_what_no_output_reads() -> None:
    before = """\
graph(%x: f32[4]) {
  %a = relu(%x) : f32[4]
  %b = neg(%x) : f32[4]
  return %b
}"""
    expected = """\
graph(%x: f32[4]) {
  %b = neg(%x) : f32[4]
  return %b
}
"""
    support.check_pass(eliminate_dead_code, before, expected)


def test_drops_dead_chains_scalars_and_weights_but_keeps_multi_output_nodes() -> None:
    before = """\
graph(%x: f32[4]) {
  %s = split(%x) {sizes=(1, 3), dim=0} : (f32[1], f32[3])
  %dead = exp(%x) : f32[4]
  %c = scalar {value=2.0} : f64[]
  %dead2 = mul(%dead, %c) : f32[4]
  %w = constant {name='w'} : f32[3]
  %y = neg(%s#1) : f32[3]
  return %y
}"""
    expected = """\
graph(%x: f32[4]) {
  %s = split(%x) {sizes=(1, 3), dim=0} : (f32[1], f32[3])
  %y = neg(%s#1) : f32[3]
  return %y
}
"""
    support.check_pass(eliminate_dead_code, before, expected, {"w": torch.zeros(3)})


def test_keeps_mutating_calls_and_what_they_read() -> None:
    before = """\
graph(%x: f32[4], %acc: f32[4]) {
  %t = exp(%x) : f32[4]
  %m = call(%acc, %t) {target=aten.add_.Tensor, args=(arg(0), arg(1)), kwargs=()} : f32[4]
  %dead = relu(%x) : f32[4]
  %y = neg(%x) : f32[4]
  return %y
}"""
    expected = """\
graph(%x: f32[4], %acc: f32[4]) {
  %t = exp(%x) : f32[4]
  %m = call(%acc, %t) {target=aten.add_.Tensor, args=(arg(0), arg(1)), kwargs=()} : f32[4]
  %y = neg(%x) : f32[4]
  return %y
}
"""
    support.check_pass(eliminate_dead_code, before, expected)


def test_returns_the_same_graph_when_nothing_is_dead() -> None:
    text = """\
graph(%x: f32[4]) {
  %a = relu(%x) : f32[4]
  %b = neg(%a) : f32[4]
  return %b, %a, %x
}
"""
    support.check_pass(eliminate_dead_code, text, text)


def test_dropped_weights_leave_graph_constants() -> None:
    graph = parse_graph("""\
graph(%x: f32[4]) {
  %w = constant {name='w'} : f32[4]
  %y = neg(%x) : f32[4]
  return %y
}""", {"w": torch.zeros(4)})
    after = eliminate_dead_code(graph)
    used = {n.attrs.name for n in after.nodes if n.op is Op.CONSTANT}
    assert set(after.constants) == used
