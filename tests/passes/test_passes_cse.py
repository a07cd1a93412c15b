"""Common-subexpression elimination, as before/after IR text.

CSE merges nodes with equal op, operands, attributes and types. Attributes compare by kind of
number and sign (1 vs 1.0, 0.0 vs -0.0 stay apart), and calls of random or mutating ATen ops
are never merged.
"""

from __future__ import annotations

import torch

import kiln_test_support as support  # tests/ir/kiln_test_support.py, loaded by conftest.py
from kiln.ir import interpret, parse_graph
from kiln.passes.cse import eliminate_common_subexpressions as cse


def test_merges_duplicates_and_then_their_users() -> None:
    before = """\
graph(%x: f32[4, 6]) {
  %a = exp(%x) : f32[4, 6]
  %b = exp(%x) : f32[4, 6]
  %sa = split(%a) {sizes=(2, 4), dim=1} : (f32[4, 2], f32[4, 4])
  %sb = split(%b) {sizes=(2, 4), dim=1} : (f32[4, 2], f32[4, 4])
  %sc = split(%b) {sizes=(3, 3), dim=1} : (f32[4, 3], f32[4, 3])
  %r = relu(%sa#1) : f32[4, 4]
  %q = relu(%sb#1) : f32[4, 4]
  %m = mul(%r, %q) : f32[4, 4]
  return %m, %sb#0, %sc#0
}"""
    expected = """\
graph(%x: f32[4, 6]) {
  %a = exp(%x) : f32[4, 6]
  %sa = split(%a) {sizes=(2, 4), dim=1} : (f32[4, 2], f32[4, 4])
  %sc = split(%a) {sizes=(3, 3), dim=1} : (f32[4, 3], f32[4, 3])
  %r = relu(%sa#1) : f32[4, 4]
  %m = mul(%r, %r) : f32[4, 4]
  return %m, %sa#0, %sc#0
}
"""
    support.check_pass(cse, before, expected)


def test_merges_weights_of_the_same_name() -> None:
    before = """\
graph(%x: f32[4]) {
  %w = constant {name='w'} : f32[4]
  %w_1 = constant {name='w'} : f32[4]
  %v = constant {name='v'} : f32[4]
  %a = add(%x, %w) : f32[4]
  %b = add(%x, %w_1) : f32[4]
  %c = add(%x, %v) : f32[4]
  return %a, %b, %c
}"""
    expected = """\
graph(%x: f32[4]) {
  %w = constant {name='w'} : f32[4]
  %v = constant {name='v'} : f32[4]
  %a = add(%x, %w) : f32[4]
  %c = add(%x, %v) : f32[4]
  return %a, %a, %c
}
"""
    w = torch.randn(4)
    support.check_pass(cse, before, expected, {"w": w, "v": w.clone()})


def test_keeps_zero_and_negative_zero_apart() -> None:
    before = """\
graph(%x: f32[4]) {
  %c = scalar {value=0.0} : f64[]
  %c_1 = scalar {value=-0.0} : f64[]
  %c_2 = scalar {value=0.0} : f64[]
  %a = add(%x, %c) : f32[4]
  %b = add(%x, %c_1) : f32[4]
  %d = add(%x, %c_2) : f32[4]
  return %a, %b, %d
}"""
    expected = """\
graph(%x: f32[4]) {
  %c = scalar {value=0.0} : f64[]
  %c_1 = scalar {value=-0.0} : f64[]
  %a = add(%x, %c) : f32[4]
  %b = add(%x, %c_1) : f32[4]
  return %a, %b, %a
}
"""
    after = support.check_pass(cse, before, expected)
    a, b, _ = interpret(after, [torch.tensor([-0.0, 0.0, 1.0, -1.0])])
    assert torch.signbit(a).tolist() == [False, False, False, True]  # -0 + 0 = +0
    assert torch.signbit(b).tolist() == [True, False, False, True]  # -0 + -0 = -0


def test_keeps_one_and_one_point_zero_apart() -> None:
    before = """\
graph(%x: f32[4]) {
  %c = scalar {value=1} : i64[]
  %c_1 = scalar {value=1.0} : f64[]
  %c_2 = scalar {value=True} : bool[]
  %p = pow(%x, %c) : f32[4]
  %q = pow(%x, %c_1) : f32[4]
  %r = pow(%x, %c_2) : f32[4]
  %one = full {shape=(4,), value=1, dtype=f32} : f32[4]
  %one_f = full {shape=(4,), value=1.0, dtype=f32} : f32[4]
  %lo = clamp(%x) {min=0, max=None} : f32[4]
  %lo_f = clamp(%x) {min=0.0, max=None} : f32[4]
  %lo_f2 = clamp(%x) {min=0.0, max=None} : f32[4]
  return %p, %q, %r, %one, %one_f, %lo, %lo_f, %lo_f2
}"""
    expected = """\
graph(%x: f32[4]) {
  %c = scalar {value=1} : i64[]
  %c_1 = scalar {value=1.0} : f64[]
  %c_2 = scalar {value=True} : bool[]
  %p = pow(%x, %c) : f32[4]
  %q = pow(%x, %c_1) : f32[4]
  %r = pow(%x, %c_2) : f32[4]
  %one = full {shape=(4,), value=1, dtype=f32} : f32[4]
  %one_f = full {shape=(4,), value=1.0, dtype=f32} : f32[4]
  %lo = clamp(%x) {min=0, max=None} : f32[4]
  %lo_f = clamp(%x) {min=0.0, max=None} : f32[4]
  return %p, %q, %r, %one, %one_f, %lo, %lo_f, %lo_f
}
"""
    support.check_pass(cse, before, expected)


def test_never_merges_random_or_mutating_calls() -> None:
    before = """\
graph(%x: f32[4], %acc: f32[4]) {
  %r = call(%x) {target=aten.rand_like.default, args=(arg(0),), kwargs=()} : f32[4]
  %r_1 = call(%x) {target=aten.rand_like.default, args=(arg(0),), kwargs=()} : f32[4]
  %b = call(%x) {target=aten.bernoulli.p, args=(arg(0), 0.5), kwargs=()} : f32[4]
  %b_1 = call(%x) {target=aten.bernoulli.p, args=(arg(0), 0.5), kwargs=()} : f32[4]
  %d = call(%x) {target=aten.bernoulli.default, args=(arg(0),), kwargs=()} : f32[4]
  %d_1 = call(%x) {target=aten.bernoulli.default, args=(arg(0),), kwargs=()} : f32[4]
  %m = call(%acc, %x) {target=aten.add_.Tensor, args=(arg(0), arg(1)), kwargs=()} : f32[4]
  %m_1 = call(%acc, %x) {target=aten.add_.Tensor, args=(arg(0), arg(1)), kwargs=()} : f32[4]
  return %r, %r_1, %b, %b_1, %d, %d_1, %m, %m_1
}
"""
    support.check_pass(cse, before, before)


def test_merges_deterministic_calls() -> None:
    before = """\
graph(%x: f32[4]) {
  %r = call(%x) {target=aten.rand_like.default, args=(arg(0),), kwargs=()} : f32[4]
  %k = call(%r) {target=aten.cumsum.default, args=(arg(0), 0), kwargs=()} : f32[4]
  %k_1 = call(%r) {target=aten.cumsum.default, args=(arg(0), 0), kwargs=()} : f32[4]
  %k_2 = call(%r) {target=aten.cumsum.default, args=(arg(0), 0), kwargs=(('dtype', torch.double),)} : f64[4]
  return %k, %k_1, %k_2
}"""  # noqa: E501
    expected = """\
graph(%x: f32[4]) {
  %r = call(%x) {target=aten.rand_like.default, args=(arg(0),), kwargs=()} : f32[4]
  %k = call(%r) {target=aten.cumsum.default, args=(arg(0), 0), kwargs=()} : f32[4]
  %k_2 = call(%r) {target=aten.cumsum.default, args=(arg(0), 0), kwargs=(('dtype', torch.double),)} : f64[4]
  return %k, %k, %k_2
}
"""  # noqa: E501
    support.check_pass(cse, before, expected)


def test_does_not_merge_a_non_commutative_op_with_swapped_operands() -> None:
    text = """\
graph(%x: f32[4], %y: f32[4]) {
  %a = sub(%x, %y) : f32[4]
  %b = sub(%y, %x) : f32[4]
  return %a, %b
}
"""
    graph = parse_graph(text)
    assert cse(graph) is graph
