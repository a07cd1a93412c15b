"""An elementwise library op's planned slot takes the layout ATen would give its result."""

import torch
import torch.nn as nn

import kiln
from kiln.ir import parse_graph
from kiln.runtime.slot_layouts import SlotLayouts

TRANSPOSED_GELU = """\
graph(%x: f32[1, 64, 32]) {
  %t = permute(%x) {dims=(0, 2, 1)} : f32[1, 32, 64]
  %g = gelu(%t) {approximate='none'} : f32[1, 32, 64]
  %e = exp(%x) : f32[1, 64, 32]
  return %g, %e
}"""


def _nodes(graph):
    return {n.name: n for n in graph.nodes}


def test_a_transposed_operand_gives_a_transposed_slot():
    graph = parse_graph(TRANSPOSED_GELU)
    nodes = _nodes(graph)
    layouts = SlotLayouts(graph, [])
    assert layouts.strides(nodes["g"], lambda v: None) == (2048, 1, 32)
    assert layouts.strides(nodes["e"], lambda v: None) is None  # dense operand: contiguous


def test_a_result_a_generated_kernel_reads_stays_contiguous():
    graph = parse_graph(TRANSPOSED_GELU)
    nodes = _nodes(graph)
    layouts = SlotLayouts(graph, [nodes["g"].out()])
    assert layouts.strides(nodes["g"], lambda v: None) is None


class FeatureLayer(nn.Module):
    """wav2vec2's layer-norm feature extractor layer: conv, norm over channels, GELU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv1d(8, 16, 3), nn.Conv1d(16, 16, 3)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        y = self.norm(self.conv1(x).transpose(-2, -1)).transpose(-2, -1)
        return self.conv2(nn.functional.gelu(y))


def test_the_feature_layer_matches_eager():
    torch.manual_seed(0)
    model, x = FeatureLayer().eval(), torch.randn(1, 8, 200)
    with torch.no_grad():
        compiled = kiln.compile(model, (x,))
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
