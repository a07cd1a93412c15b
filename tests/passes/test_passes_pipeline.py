"""The pass pipeline: records, debug verification, and end-to-end results on the zoo."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kiln_test_support as support  # tests/ir/kiln_test_support.py, loaded by conftest.py
from kiln.ir import Graph, Node, VerificationError, parse_graph, print_graph, verify
from kiln.options import Options
from kiln.passes.base import Pass
from kiln.passes.pipeline import PIPELINE, PassRecord, run_pipeline

BEFORE = """\
graph(%x: f32[8, 16]) {
  %w = constant {name='fc.weight'} : f32[4, 16]
  %b = constant {name='fc.bias'} : f32[4]
  %t = permute(%w) {dims=(1, 0)} : f32[16, 4]
  %t_1 = permute(%w) {dims=(1, 0)} : f32[16, 4]
  %y = addmm(%b, %x, %t) {beta=1, alpha=1} : f32[8, 4]
  %dead = mm(%x, %t_1) : f32[8, 4]
  %r = relu(%y) : f32[8, 4]
  %r_1 = relu(%y) : f32[8, 4]
  %s = add(%r, %r_1) : f32[8, 4]
  return %s
}"""

AFTER_O0 = """\
graph(%x: f32[8, 16]) {
  %b = constant {name='fc.bias'} : f32[4]
  %t = constant {name='fold.t'} : f32[16, 4]
  %y = addmm(%b, %x, %t) {beta=1, alpha=1} : f32[8, 4]
  %r = relu(%y) : f32[8, 4]
  %s = add(%r, %r) : f32[8, 4]
  return %s
}
"""

# at the default level the rules also fuse the relu into the GEMM and turn r + r into r * 2
AFTER = """\
graph(%x: f32[8, 16]) {
  %b = constant {name='fc.bias'} : f32[4]
  %t = constant {name='fold.t'} : f32[16, 4]
  %c = scalar {value=2} : i64[]
  %y = addmm_act(%b, %x, %t) {activation=op('relu'), act_args=(), beta=1, alpha=1} : f32[8, 4]
  %s = mul(%y, %c) : f32[8, 4]
  return %s
}
"""


def _weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"fc.weight": torch.randn(4, 16), "fc.bias": torch.randn(4)}


def _optimize(graph: Graph) -> Graph:
    return run_pipeline(graph, Options(debug=True))[0]


def test_default_pipeline_before_and_after() -> None:
    support.check_pass(_optimize, BEFORE, AFTER, _weights())


def test_level_0_is_cleanup_only() -> None:
    support.check_pass(lambda g: run_pipeline(g, Options(opt_level=0, debug=True))[0],
                       BEFORE, AFTER_O0, _weights())


def test_one_record_per_pass_in_order() -> None:
    graph = parse_graph(BEFORE, _weights())
    _, records, snapshots = run_pipeline(graph, Options())
    # the pet pass runs only with Options(pet=True)
    assert [r.name for r in records] == [p.name for p in PIPELINE
                                         if p.min_level <= 2 and p.name != "pet"]
    assert all(isinstance(r, PassRecord) and r.seconds >= 0 for r in records)
    assert records[0].nodes_before == graph.num_ops()
    for earlier, later in zip(records, records[1:]):
        assert earlier.nodes_after == later.nodes_before
    # weights and numbers are not counted: fold turns the permute into a weight
    assert [(r.name, r.nodes_before, r.nodes_after) for r in records] == [
        ("dce", 7, 5), ("cse", 5, 4), ("fold", 4, 3), ("simplify", 3, 3), ("attention", 3, 3),
        ("shared.heads", 3, 3), ("conv1d", 3, 3), ("fuse.weights", 3, 3),
        ("fuse.epilogue", 3, 2), ("merge.parallel", 2, 2), ("pad.conv", 2, 2), ("layout", 2, 2),
        ("pointwise", 2, 2), ("simplify.views", 2, 2), ("fold.rewritten", 2, 2),
        ("cse.final", 2, 2), ("dce.final", 2, 2)]
    assert records[8].rules["addmm-act"].fired == 1
    assert snapshots == []


def test_snapshots_are_the_graph_after_each_pass() -> None:
    graph = parse_graph(BEFORE, _weights())
    final, records, snapshots = run_pipeline(graph, Options(), keep_snapshots=True)
    assert len(snapshots) == len(records)
    assert [s.num_ops() for s in snapshots] == [r.nodes_after for r in records]
    assert snapshots[-1] is final
    assert print_graph(final) == AFTER


def test_passes_above_the_opt_level_are_skipped() -> None:
    seen: list[str] = []

    def tracer(name: str) -> Pass:
        def run(graph: Graph, options: Options) -> Graph:
            seen.append(name)
            return graph

        return Pass(name, run, min_level=int(name[-1]))

    passes = [tracer("at0"), tracer("at2"), tracer("at3")]
    graph = parse_graph(BEFORE, _weights())
    _, records, _ = run_pipeline(graph, Options(opt_level=2), passes)
    assert seen == ["at0", "at2"]
    assert [r.name for r in records] == ["at0", "at2"]


def _breaks_the_graph(graph: Graph, options: Options) -> Graph:
    """Declares a wrong type on the last node."""
    last = graph.nodes[-1]
    wrong = dataclasses.replace(last.type, shape=(1,))
    broken = Node(last.op, last.inputs, last.attrs, (wrong,), last.name)
    return graph.replace(nodes=graph.nodes[:-1] + (broken,), outputs=[broken.out()])


def test_debug_verifies_after_every_pass() -> None:
    passes = [PIPELINE[0], Pass("broken", _breaks_the_graph), PIPELINE[1]]
    graph = parse_graph(BEFORE, _weights())
    with pytest.raises(VerificationError, match="declared type does not match"):
        run_pipeline(graph, Options(debug=True), passes)
    broken, records, _ = run_pipeline(graph, Options(debug=False), passes)
    assert [r.name for r in records] == ["dce", "broken", "cse"]
    with pytest.raises(VerificationError):
        verify(broken)


def test_zoo_pipeline_records_every_pass(zoo_case) -> None:
    optimized, records = support.optimized(zoo_case.name)  # verified after every pass
    # the pet pass runs only with Options(pet=True)
    assert [r.name for r in records] == [p.name for p in PIPELINE
                                         if p.min_level <= 2 and p.name != "pet"]
    assert records[0].nodes_before == zoo_case.graph.num_ops()
    assert records[-1].nodes_after == optimized.num_ops()
    assert len(optimized.nodes) <= len(zoo_case.graph.nodes)
    verify(optimized)


# ieee rules (batch norm folding, merged GEMMs) round differently from the original ops; the
# largest drift measured on the quick zoo is 1.2e-5 (inception: 41 folded batch norms)
TOLERANCE = {0: 1e-6, 2: 1e-4}


@pytest.mark.parametrize("level", sorted(TOLERANCE))
def test_zoo_optimized_graph_computes_the_captured_outputs(zoo_case, level) -> None:
    optimized = run_pipeline(zoo_case.graph, Options(opt_level=level))[0]
    expected = support.run_interpreter(zoo_case.graph, zoo_case.inputs)
    actual = support.run_interpreter(optimized, zoo_case.inputs)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert support.relative_error(a, e) < TOLERANCE[level]
    for a, e in zip(actual, zoo_case.expected):
        assert support.relative_error(a, e) < max(TOLERANCE[level], 1e-5)
