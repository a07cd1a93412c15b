"""A fused group's space works on the group as a graph of its own."""

from __future__ import annotations

import torch

from kiln.ir import parse_graph
from kiln.passes.partition import partition
from kiln.tune.space_groups import GroupSpace

TWO_LAYERS = """\
graph(%x: f32[4, 64]) {
  %g1 = constant {name='layer0.gamma'} : f32[64]
  %g2 = constant {name='layer1.gamma'} : f32[64]
  %w = constant {name='between'} : f32[64, 64]
  %a = relu(%x) : f32[4, 64]
  %b = mul(%a, %g1) : f32[4, 64]
  %c = exp(%b) : f32[4, 64]
  %m = mm(%c, %w) : f32[4, 64]
  %d = relu(%m) : f32[4, 64]
  %e = mul(%d, %g2) : f32[4, 64]
  %f = exp(%e) : f32[4, 64]
  return %c, %f
}"""


def test_repeated_layers_give_one_program() -> None:
    """Values are named by position, not after the model's nodes and weights, so two layers
    of one structure plan equal programs (built once), each mapped back to its own values."""
    graph = parse_graph(TWO_LAYERS, {"layer0.gamma": torch.randn(64),
                                     "layer1.gamma": torch.randn(64),
                                     "between": torch.randn(64, 64)})
    first, second = [GroupSpace.of(graph, g) for g in partition(graph)]
    (plan1, ins1, outs1), (plan2, ins2, outs2) = [
        s.planned_in_source(s.default(), record=False) for s in (first, second)]
    assert plan1.program == plan2.program and plan1.build() is plan2.build()
    assert [v.node.name for v in ins1] == ["x", "g1"] and [v.node.name for v in outs1] == ["c"]
    assert [v.node.name for v in ins2] == ["m", "g2"] and [v.node.name for v in outs2] == ["f"]
