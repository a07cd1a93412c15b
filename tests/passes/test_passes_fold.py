"""Constant folding, as before/after IR text; folded graphs compute what they computed before.

`check_pass` also interprets the graph before and after folding on random inputs and requires
bit-identical outputs.
"""

from __future__ import annotations

import torch

import kiln_test_support as support  # tests/ir/kiln_test_support.py, loaded by conftest.py
from kiln.ir import parse_graph
from kiln.ir.interp import interpret
from kiln.passes.dce import eliminate_dead_code
from kiln.passes.fold import fold_constants


def _weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"fc.weight": torch.randn(4, 16), "fc.bias": torch.randn(4), "w": torch.randn(6),
            "bias": torch.randn(1024)}


def test_weight_transpose_becomes_a_new_constant() -> None:
    before = """\
graph(%x: f32[8, 16]) {
  %w = constant {name='fc.weight'} : f32[4, 16]
  %t = permute(%w) {dims=(1, 0)} : f32[16, 4]
  %y = mm(%x, %t) : f32[8, 4]
  return %y
}"""
    expected = """\
graph(%x: f32[8, 16]) {
  %w = constant {name='fc.weight'} : f32[4, 16]
  %t = constant {name='fold.t'} : f32[16, 4]
  %y = mm(%x, %t) : f32[8, 4]
  return %y
}
"""
    weights = _weights()
    after = support.check_pass(fold_constants, before, expected, weights)
    assert torch.equal(after.constants["fold.t"], weights["fc.weight"].t())
    assert set(after.constants) == {"fc.weight", "fold.t"}


def test_whole_weight_only_subgraph_folds_to_one_constant() -> None:
    before = """\
graph(%x: f32[8, 16]) {
  %w = constant {name='fc.weight'} : f32[4, 16]
  %b = constant {name='fc.bias'} : f32[4]
  %c = scalar {value=0.5} : f64[]
  %s = mul(%w, %c) : f32[4, 16]
  %t = permute(%s) {dims=(1, 0)} : f32[16, 4]
  %nb = neg(%b) : f32[4]
  %cb = call(%nb) {target=aten.cumsum.default, args=(arg(0), 0), kwargs=()} : f32[4]
  %y = addmm(%cb, %x, %t) {beta=1, alpha=1} : f32[8, 4]
  return %y
}"""
    expected = """\
graph(%x: f32[8, 16]) {
  %w = constant {name='fc.weight'} : f32[4, 16]
  %b = constant {name='fc.bias'} : f32[4]
  %c = scalar {value=0.5} : f64[]
  %s = constant {name='fold.s'} : f32[4, 16]
  %t = constant {name='fold.t'} : f32[16, 4]
  %nb = constant {name='fold.nb'} : f32[4]
  %cb = constant {name='fold.cb'} : f32[4]
  %y = addmm(%cb, %x, %t) {beta=1, alpha=1} : f32[8, 4]
  return %y
}
"""
    weights = _weights()
    folded = support.check_pass(fold_constants, before, expected, weights)
    assert torch.equal(folded.constants["fold.t"], (weights["fc.weight"] * 0.5).t())
    assert torch.equal(folded.constants["fold.cb"], torch.cumsum(-weights["fc.bias"], 0))
    cleaned = eliminate_dead_code(folded)
    assert str(cleaned) == """\
graph(%x: f32[8, 16]) {
  %t = constant {name='fold.t'} : f32[16, 4]
  %cb = constant {name='fold.cb'} : f32[4]
  %y = addmm(%cb, %x, %t) {beta=1, alpha=1} : f32[8, 4]
  return %y
}
"""


def test_multi_output_and_creation_ops_fold_but_big_results_do_not() -> None:
    before = """\
graph(%x: f32[8]) {
  %w = constant {name='w'} : f32[6]
  %s = split(%w) {sizes=(2, 4), dim=0} : (f32[2], f32[4])
  %f = full {shape=(8,), value=0.5, dtype=f32} : f32[8]
  %big = full {shape=(2048, 1024), value=0.5, dtype=f32} : f32[2048, 1024]
  %i = arange {start=0, end=8, step=1, dtype=i64} : i64[8]
  %y = add(%x, %f) : f32[8]
  %z = add(%y, %i) : f32[8]
  return %z, %s#0, %s#1, %big
}"""
    expected = """\
graph(%x: f32[8]) {
  %w = constant {name='w'} : f32[6]
  %s = constant {name='fold.s.0'} : f32[2]
  %s_1 = constant {name='fold.s.1'} : f32[4]
  %f = constant {name='fold.f'} : f32[8]
  %big = full {shape=(2048, 1024), value=0.5, dtype=f32} : f32[2048, 1024]
  %i = constant {name='fold.i'} : i64[8]
  %y = add(%x, %f) : f32[8]
  %z = add(%y, %i) : f32[8]
  return %z, %s, %s_1, %big
}
"""
    support.check_pass(fold_constants, before, expected, _weights())


def test_expand_to_a_big_shape_is_not_folded() -> None:
    before = """\
graph(%x: f32[64, 1024]) {
  %b = constant {name='bias'} : f32[1024]
  %e = expand(%b) {shape=(64, 1024)} : f32[64, 1024]
  %y = add(%x, %e) : f32[64, 1024]
  return %y
}
"""
    support.check_pass(fold_constants, before, before, _weights())


def test_expand_to_a_small_shape_is_folded() -> None:
    before = """\
graph(%x: f32[4, 1024]) {
  %b = constant {name='bias'} : f32[1024]
  %e = expand(%b) {shape=(4, 1024)} : f32[4, 1024]
  %y = add(%x, %e) : f32[4, 1024]
  return %y
}"""
    expected = """\
graph(%x: f32[4, 1024]) {
  %b = constant {name='bias'} : f32[1024]
  %e = constant {name='fold.e'} : f32[4, 1024]
  %y = add(%x, %e) : f32[4, 1024]
  return %y
}
"""
    support.check_pass(fold_constants, before, expected, _weights())


def test_a_computed_result_larger_than_its_sources_still_folds() -> None:
    """T5's relative positions: a broadcast subtraction of two position vectors (2 KB) into
    a [128, 128] matrix (128 KB) and what follows it are computed on every call unless they
    fold; they do, up to `_MAX_COMPUTED_BYTES`, where a view (an expand) would not."""
    positions = {"q": torch.arange(128).view(128, 1), "k": torch.arange(128).view(1, 128)}
    before = """\
graph(%x: f32[128, 128]) {
  %q = constant {name='q'} : i64[128, 1]
  %k = constant {name='k'} : i64[1, 128]
  %zero = scalar {value=0} : i64[]
  %d = sub(%k, %q) : i64[128, 128]
  %g = gt(%d, %zero) : bool[128, 128]
  %y = add(%x, %g) : f32[128, 128]
  return %y
}"""
    expected = """\
graph(%x: f32[128, 128]) {
  %g = constant {name='fold.g'} : bool[128, 128]
  %y = add(%x, %g) : f32[128, 128]
  return %y
}
"""
    support.check_pass(lambda g: eliminate_dead_code(fold_constants(g)), before, expected,
                       positions)


def test_random_and_mutating_ops_are_not_folded() -> None:
    before = """\
graph(%x: f32[6]) {
  %w = constant {name='w'} : f32[6]
  %r = call(%w) {target=aten.rand_like.default, args=(arg(0),), kwargs=()} : f32[6]
  %d = call(%w) {target=aten.bernoulli.p, args=(arg(0), 0.5), kwargs=()} : f32[6]
  %y = add(%x, %r) : f32[6]
  %z = add(%y, %d) : f32[6]
  return %z
}
"""
    support.check_pass(fold_constants, before, before, _weights())
    mutating = """\
graph(%x: f32[6]) {
  %w = constant {name='w'} : f32[6]
  %m = call(%w, %w) {target=aten.add_.Tensor, args=(arg(0), arg(1)), kwargs=()} : f32[6]
  %y = add(%x, %w) : f32[6]
  return %y
}
"""
    graph = parse_graph(mutating, _weights())
    assert fold_constants(graph) is graph


def test_numbers_alone_are_not_folded() -> None:
    before = """\
graph(%x: f32[6]) {
  %c = scalar {value=2.0} : f64[]
  %y = mul(%x, %c) : f32[6]
  return %y
}
"""
    support.check_pass(fold_constants, before, before)


def test_weight_only_output_becomes_a_constant_output() -> None:
    before = """\
graph(%x: f32[6]) {
  %w = constant {name='w'} : f32[6]
  %n = neg(%w) : f32[6]
  return %x, %n
}"""
    expected = """\
graph(%x: f32[6]) {
  %w = constant {name='w'} : f32[6]
  %n = constant {name='fold.n'} : f32[6]
  return %x, %n
}
"""
    support.check_pass(fold_constants, before, expected, _weights())


def test_folded_names_do_not_clash_with_existing_weights() -> None:
    before = """\
graph(%x: f32[6]) {
  %w = constant {name='w'} : f32[6]
  %n = neg(%w) : f32[6]
  %taken = constant {name='fold.n'} : f32[6]
  %y = add(%n, %taken) : f32[6]
  %z = add(%x, %y) : f32[6]
  return %z
}"""
    weights = _weights()
    weights["fold.n"] = torch.ones(6)
    graph = parse_graph(before, weights)
    folded = fold_constants(graph)
    assert {"fold.n", "fold.n_1"} <= set(folded.constants)
    assert torch.equal(folded.constants["fold.n"], torch.ones(6))
    x = torch.randn(6)
    support.assert_identical(support.run_interpreter(folded, (x,))[0],
                             support.run_interpreter(graph, (x,))[0])


def test_an_op_reading_an_unfolded_expand_of_weights_folds() -> None:
    """BEiT's relative position index: a where over an expand too big to fold as a view, a
    mask and a weight. The where's result is known at compile time and folds; the expand is
    left to DCE (the chain of 22 such ops ran on every call)."""
    weights = {"m": torch.tensor([[[True, False]]]), "c": torch.arange(32.0).reshape(32, 1),
               "d": torch.zeros(32, 1024, 2)}
    graph = parse_graph("""graph(%x: f32[32, 1024, 2]) {
  %m = constant {name='m'} : bool[1, 1, 2]
  %c = constant {name='c'} : f32[32, 1]
  %d = constant {name='d'} : f32[32, 1024, 2]
  %u = unsqueeze(%c) {dim=2} : f32[32, 1, 1]
  %e = expand(%u) {shape=(32, 1024, 2)} : f32[32, 1024, 2]
  %w = where(%m, %e, %d) : f32[32, 1024, 2]
  %y = add(%x, %w) : f32[32, 1024, 2]
  return %y
}""", weights)
    folded = eliminate_dead_code(fold_constants(graph))
    assert [n.op.text for n in folded.nodes if n.op.text != "constant"] == ["add"]
    x = torch.randn(32, 1024, 2)
    expected = x + torch.where(weights["m"], weights["c"][:, :, None].expand(32, 1024, 2),
                               weights["d"])
    torch.testing.assert_close(interpret(folded, [x])[0], expected)
