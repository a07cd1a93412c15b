"""conv-regroup: narrow groups joined in pairs on a block-diagonal weight."""

from __future__ import annotations

import pytest
import torch

from kiln.ir.attrs import ConvActAttrs, ConvAttrs
from kiln.ir.builder import GraphBuilder
from kiln.ir.graph import Graph
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType
from kiln.options import Options
from kiln.passes.fold import fold_constants
from kiln.rewrite.engine import apply_rules
from kiln.rewrite.rule import FAST_MATH
from kiln.rules.regroup import RULES

(REGROUP,) = RULES


def grouped(groups: int, width: int, rows: int = 2, stride: int = 1, act: bool = False,
            transposed: bool = False) -> Graph:
    b = GraphBuilder("cpu")
    x = b.input("x", TensorType((1, groups * width, 9, 9), DType.F32))
    gen = torch.Generator().manual_seed(groups * 100 + width)
    w = b.constant("w", torch.randn(groups * rows, width, 3, 3, generator=gen))
    if act:
        bias = b.constant("b", torch.randn(groups * rows, generator=gen))
        attrs = ConvActAttrs((stride, stride), (1, 1), (1, 1), groups, True, False, Op.RELU)
        return b.build(b.node(Op.CONV_ACT, x, w, bias, attrs=attrs).out())
    attrs = ConvAttrs((stride, stride), (1, 1), (1, 1), transposed, (0, 0), groups)
    return b.build(b.node(Op.CONVOLUTION, x, w, attrs=attrs).out())


def regrouped(graph: Graph, times: int = 1) -> Graph:
    for _ in range(times):
        result = apply_rules(graph, [REGROUP], Options(fast_math=True))
        assert result.stats[REGROUP.name].fired == 1
        graph = fold_constants(result.graph, Options())
    return graph


def the_conv(graph: Graph):
    (conv,) = [n for n in graph.nodes if n.op in (Op.CONVOLUTION, Op.CONV_ACT)]
    return conv


@pytest.mark.parametrize("groups,width,stride,act,times", [
    (32, 4, 1, False, 1), (32, 4, 2, True, 1), (8, 2, 1, False, 2), (4, 8, 2, True, 1)])
def test_pairs_of_groups_compute_what_the_groups_did(groups, width, stride, act, times) -> None:
    graph = grouped(groups, width, stride=stride, act=act)
    after = regrouped(graph, times)
    conv = the_conv(after)
    assert conv.attrs.groups == groups // 2 ** times
    w = conv.inputs[1].node
    assert w.op is Op.CONSTANT  # folded: the block-diagonal weight
    assert after.constant(w).shape[1] == width * 2 ** times
    x = torch.randn(graph.inputs[0].type.shape)
    torch.testing.assert_close(interpret(after, [x])[0], interpret(graph, [x])[0],
                               rtol=1e-5, atol=1e-5)


def test_the_added_products_are_zero_only_for_finite_inputs() -> None:
    # why the rule is fast math: an infinite channel of one group reaches its pair's outputs
    graph = grouped(2, 4)
    after = regrouped(graph)
    x = torch.randn(graph.inputs[0].type.shape)
    x[0, 0, 4, 4] = float("inf")  # group 0's first channel
    before, now = interpret(graph, [x])[0], interpret(after, [x])[0]
    assert not before[0, 2:].isnan().any()  # group 1's outputs never read channel 0
    assert now[0, 2:].isnan().any()  # ... but multiply it by a zero now: inf * 0
    assert REGROUP.safety is FAST_MATH and not REGROUP.enabled(fast_math=False)


@pytest.mark.parametrize("graph,why", [
    (grouped(3, 4), "not an even count"),
    (grouped(16, 1, rows=1), "depthwise"),
    (grouped(4, 16), "fill a vector"),
    (grouped(1, 8), "not an even count"),
])
def test_groups_that_cannot_pair_or_need_not_are_left(graph, why) -> None:
    result = apply_rules(graph, [REGROUP], Options(fast_math=True), trace=[REGROUP.name])
    assert not result.stats[REGROUP.name].fired
    reasons = [event.reason for event in result.trace]
    assert any(why in reason for reason in reasons), reasons
