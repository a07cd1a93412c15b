"""The rule passes as one search (Options(search="backtrack")): results equal the captured
outputs on every zoo model, the record says what the search did, greedy is a seed."""

from __future__ import annotations

import pytest
import torch

import kiln_test_support as support  # loaded by tests/conftest.py
from kiln.cost.analytic import narrow_groups
from kiln.options import Options
from kiln.passes import search as search_pass
from kiln.passes.pipeline import PIPELINE, run_pipeline
from kiln.passes.search import SearchPass, with_search
from kiln.rewrite.passes import RulePass
from kiln.search.backtrack import Limits
from kiln.search.rules import search_rules
from kiln.search.saturate import SatLimits


@pytest.fixture(autouse=True)
def short_search(monkeypatch):
    """Two seconds a model keeps the suite short; the defaults are in kiln.passes.search."""
    monkeypatch.setattr(search_pass, "LIMITS", Limits(seconds=2.0))
    monkeypatch.setattr(search_pass, "SAT_LIMITS", SatLimits(iterations=4, seconds=2.0))
    monkeypatch.setattr(search_pass, "ILP_SECONDS", 1.0)


def test_the_rule_passes_become_one_search_pass_where_the_first_stood() -> None:
    assert with_search(PIPELINE, Options()) is PIPELINE
    searched = with_search(PIPELINE, Options(search="backtrack"))
    names = [p.name for p in searched]
    first_rule_pass = next(i for i, p in enumerate(PIPELINE) if isinstance(p, RulePass))
    assert names.index("search") == first_rule_pass
    (search,) = [p for p in searched if isinstance(p, SearchPass)]
    assert search.rule_passes == tuple(p for p in PIPELINE
                                       if isinstance(p, RulePass) and p.searched)
    # the views' clean-up after layout and pointwise still runs, after them
    left = [p.name for p in searched if isinstance(p, RulePass)]
    assert left == ["simplify.views"]
    assert names.index("simplify.views") > names.index("pointwise")


def test_an_unknown_strategy_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="Options.search must be one of greedy, backtrack, sat"):
        Options(search="anneal")
    assert Options.from_env({"KILN_SEARCH": "Backtrack"}).search == "backtrack"


@pytest.mark.parametrize("strategy", ["backtrack", "saturate"])
def test_the_zoo_computes_the_captured_outputs_after_the_search(zoo_case, strategy,
                                                                tmp_path) -> None:
    options = Options(search=strategy, debug=True, kernel_cache_dir=str(tmp_path))
    optimized, records, _ = run_pipeline(zoo_case.graph, options)
    (record,) = [r for r in records if r.search is not None]
    summary = record.search
    assert summary.cost_chosen <= summary.cost_greedy * 1.0000001
    if not any(narrow_groups(n) for n in zoo_case.graph.nodes):  # else some costs are timings
        assert summary.cost_greedy <= summary.cost_input
    assert summary.chosen in ("greedy", "search", "input")
    if strategy == "backtrack":  # the rule passes' rules and the exact generated ones
        hand = [r for p in PIPELINE if isinstance(p, RulePass) for r in p.rules]
        assert summary.rules == len(search_rules(hand, generated=True)) > 100
        assert summary.explored >= 1
    else:
        assert summary.classes > 0 and summary.stopped in ("saturated", "iterations", "nodes",
                                                           "seconds")
    for rule in {rule for rule, _ in summary.path}:  # the report counts the path's rewrites
        assert record.rules[rule].fired >= sum(1 for r, _ in summary.path if r == rule)
    if summary.seed == "greedy":  # and the greedy passes' it grew from
        assert sum(s.fired for s in record.rules.values()) > len(summary.path)
    actual = support.run_interpreter(optimized, zoo_case.inputs)
    for a, e in zip(actual, zoo_case.expected):
        assert support.relative_error(a, e) < 1e-4


def _weight_chain():
    import torch

    from kiln.ir.builder import GraphBuilder
    from kiln.ir.ops import Op
    from kiln.ir.types import DType, TensorType

    b = GraphBuilder("cpu")
    x = b.input("x", TensorType((4, 64), DType.F32))
    w1, w2 = b.constant("w1", torch.randn(64, 64)), b.constant("w2", torch.randn(64, 64))
    return b.build(b.node(Op.MM, b.node(Op.MM, x, w1).out(), w2).out())


@pytest.mark.parametrize("folded_product_s,kept", [(1.0, "search"), (3.0, "greedy")])
def test_a_searched_graph_is_kept_only_where_the_measurement_agrees(
        folded_product_s, kept, tmp_path, monkeypatch) -> None:
    from kiln.cost.measured import MeasuredCost
    from kiln.ir.ops import Op

    # greedy keeps (x W1) W2, two GEMMs; the search finds x (W1 W2), one GEMM on a folded
    # weight (a generated ieee rule: with fast math). The "measurement" says what that one
    # GEMM costs: 1 s (faster than greedy's 2 x 1 s) or 3 s (slower).
    def measured(self, node, graph=None):
        if self.measures is not None and not self.measures(node):  # the search's own model
            return self.analytic.node_seconds(node)
        reads_product = len(node.inputs) == 2 and node.inputs[1].node.op is Op.MM
        return folded_product_s if reads_product else 1.0

    monkeypatch.setattr(MeasuredCost, "node_seconds", measured)
    options = Options(search="backtrack", fast_math=True, kernel_cache_dir=str(tmp_path))
    optimized, records, _ = run_pipeline(_weight_chain(), options)
    (record,) = [r for r in records if r.search is not None]
    assert record.search.measured == (2.0, folded_product_s)
    assert record.search.chosen == kept
    assert optimized.op_counts()["mm"] == (1 if kept == "search" else 2)
    unmeasured = run_pipeline(_weight_chain(), Options(
        search="backtrack", fast_math=True, measure_kernels=False,
        kernel_cache_dir=str(tmp_path)))[1]
    (record,) = [r for r in unmeasured if r.search is not None]
    assert record.search.measured is None and record.search.chosen == "search"


@pytest.mark.parametrize("paired_s,kept", [(1.0, "search"), (3.0, "greedy")])
def test_the_search_pairs_narrow_groups_where_their_timing_says_so(
        paired_s, kept, tmp_path, monkeypatch) -> None:
    from kiln.cost.measured import MeasuredCost
    from kiln.ir.attrs import ConvAttrs
    from kiln.ir.builder import GraphBuilder
    from kiln.ir.ops import Op
    from kiln.ir.types import DType, TensorType

    b = GraphBuilder("cpu")
    x = b.input("x", TensorType((1, 32, 14, 14), DType.F32))
    w = b.constant("w", torch.randn(32, 4, 3, 3))
    attrs = ConvAttrs((1, 1), (1, 1), (1, 1), False, (0, 0), 8)
    graph = b.build(b.node(Op.CONVOLUTION, x, w, attrs=attrs).out())

    # the "timings": 8 groups of 4 channels 2 s, 4 groups of 8 paired_s, 2 groups 10 s
    def timed(self, node, graph=None):
        if node.op not in (Op.CONVOLUTION, Op.CONV_ACT):
            return self.analytic.node_seconds(node)
        return {8: 2.0, 4: paired_s}.get(node.attrs.groups, 10.0)

    monkeypatch.setattr(MeasuredCost, "node_seconds", timed)
    options = Options(search="backtrack", fast_math=True, kernel_cache_dir=str(tmp_path))
    optimized, records, _ = run_pipeline(graph, options)
    (record,) = [r for r in records if r.search is not None]
    assert record.search.chosen == kept
    (conv,) = [n for n in optimized.nodes if n.op in (Op.CONVOLUTION, Op.CONV_ACT)]
    assert conv.attrs.groups == (4 if kept == "search" else 8)
    if kept == "search":
        assert record.search.path == (("conv-regroup", conv.name),)
    exact = run_pipeline(graph, Options(search="backtrack", kernel_cache_dir=str(tmp_path)))
    (conv,) = [n for n in exact[0].nodes if n.op in (Op.CONVOLUTION, Op.CONV_ACT)]
    assert conv.attrs.groups == 8  # without fast math the rule is not searched
