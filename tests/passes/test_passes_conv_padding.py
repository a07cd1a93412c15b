"""Explicit zero pads move into the convolution's padding only where the result is the same."""

from __future__ import annotations

import pytest
import torch

from kiln.ir import parse_graph, verify
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.passes.conv_padding import pads_into_convolutions

GRAPH = """graph(%x: f32[2, 4, 6, 7]) {{
  %w = constant {{name='w'}} : f32[4, 1, 3, 3]
  %p = pad(%x) {{pad={pad}, value={value}}} : f32[2, 4, {h}, {w}]
  %y = convolution(%p, %w) {{stride=(1, 1), padding=(0, 0), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=4}} : f32[2, 4, {oh}, {ow}]
  return %y
}}"""  # noqa: E501


def _graph(pad=(1, 1, 1, 1), value=0.0, weight=None):
    h, w = 6 + pad[2] + pad[3], 7 + pad[0] + pad[1]
    text = GRAPH.format(pad=pad, value=value, h=h, w=w, oh=h - 2, ow=w - 2)
    weight = torch.randn(4, 1, 3, 3, generator=torch.Generator().manual_seed(0)) \
        if weight is None else weight
    return parse_graph(text, {"w": weight})


@pytest.mark.parametrize("pad", [(1, 1, 1, 1), (2, 2, 0, 0), (0, 0, 3, 3)])
def test_a_symmetric_zero_pad_becomes_the_convolutions_padding(pad):
    graph = _graph(pad)
    folded = pads_into_convolutions(graph)
    verify(folded)
    conv = next(n for n in folded.nodes if n.op is Op.CONVOLUTION)
    assert conv.inputs[0] == folded.inputs[0].out() and conv.attrs.padding == (pad[2], pad[0])
    x = torch.randn(2, 4, 6, 7, generator=torch.Generator().manual_seed(1))
    x[0, 1, 2, 3], x[1, 3, 0, 0], x[1, 0, 5, 6] = float("nan"), float("inf"), -float("inf")
    (want,), (got,) = interpret(graph, [x]), interpret(folded, [x])
    assert torch.equal(want.isnan(), got.isnan())
    torch.testing.assert_close(got[want.isfinite()], want[want.isfinite()])


@pytest.mark.parametrize("case", ["asymmetric", "nonzero value", "infinite weight"])
def test_pads_that_are_not_the_same_stay(case):
    if case == "asymmetric":  # TF "same" at stride 2
        graph = _graph((0, 1, 0, 1))
    elif case == "nonzero value":
        graph = _graph(value=1.5)
    else:  # the explicit zeros times inf give NaN; an NHWC convolution skips its padding
        weight = torch.ones(4, 1, 3, 3)
        weight[2, 0, 0, 0] = float("inf")
        graph = _graph(weight=weight)
    assert pads_into_convolutions(graph) is graph
