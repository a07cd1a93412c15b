"""1-d convolutions become 2-d ones over a row of height 1, with the same values, and then
take what was made for 2-d ones: the activation epilogue, the channels-last layout kept
from one convolution to the next, kiln's convolution kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.ir import parse_graph, verify
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.options import Options
from kiln.passes import layout
from kiln.passes.conv1d import conv1d_as_conv2d

# strided and padded with a bias; dilated and grouped with a residual and a gelu; transposed
GRAPH = """graph(%x: f32[2, 4, 9], %r: f32[2, 6, 5]) {
  %w = constant {name='w'} : f32[6, 4, 3]
  %b = constant {name='b'} : f32[6]
  %wg = constant {name='wg'} : f32[6, 3, 2]
  %wt = constant {name='wt'} : f32[4, 6, 3]
  %y = convolution(%x, %w, %b) {stride=(2,), padding=(1,), dilation=(1,), transposed=False, output_padding=(0,), groups=1} : f32[2, 6, 5]
  %z = conv_act(%y, %wg, %r) {stride=(1,), padding=(1,), dilation=(2,), groups=2, has_bias=False, has_residual=True, activation=op('gelu'), act_args=('none',)} : f32[2, 6, 5]
  %t = convolution(%x, %wt) {stride=(1,), padding=(0,), dilation=(1,), transposed=True, output_padding=(0,), groups=1} : f32[2, 6, 11]
  return %z, %t
}"""  # noqa: E501


def _graph():
    gen = torch.Generator().manual_seed(0)
    shapes = {"w": (6, 4, 3), "b": (6,), "wg": (6, 3, 2), "wt": (4, 6, 3)}
    return parse_graph(GRAPH, {k: torch.randn(s, generator=gen) for k, s in shapes.items()})


def test_a_1d_convolution_is_a_2d_one_between_views_with_the_same_values():
    graph = _graph()
    rewritten = conv1d_as_conv2d(graph)
    verify(rewritten)
    convs = [n for n in rewritten.nodes if n.op in (Op.CONVOLUTION, Op.CONV_ACT)]
    plain, fused, transposed = convs
    assert plain.type.shape == (2, 6, 1, 5) and fused.type.shape == (2, 6, 1, 5)
    assert (plain.attrs.stride, plain.attrs.padding, plain.attrs.output_padding) == \
        ((1, 2), (0, 1), (0, 0))
    assert (fused.attrs.dilation, fused.attrs.groups, fused.attrs.has_residual) == ((1, 2), 2, True)
    assert fused.inputs[2].type.shape == (2, 6, 1, 5)  # (the residual, viewed too)
    assert transposed.type.shape == (2, 6, 11)  # (left as it is)
    gen = torch.Generator().manual_seed(1)
    x, r = torch.randn(2, 4, 9, generator=gen), torch.randn(2, 6, 5, generator=gen)
    x[0, 1, 3], x[1, 2, 0], r[1, 0, 2] = float("nan"), float("inf"), float("-inf")
    for want, got in zip(interpret(graph, [x, r]), interpret(rewritten, [x, r])):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_a_graph_without_1d_convolutions_is_returned_as_is():
    graph = parse_graph("""graph(%x: f32[1, 2, 4, 4]) {
      %w = constant {name='w'} : f32[3, 2, 1, 1]
      %y = convolution(%x, %w) {stride=(1, 1), padding=(0, 0), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1} : f32[1, 3, 4, 4]
      return %y
    }""", {"w": torch.randn(3, 2, 1, 1)})  # noqa: E501
    assert conv1d_as_conv2d(graph) is graph


class _AudioFrontEnd(torch.nn.Module):
    """Whisper's input convolutions: conv, gelu, a strided conv, gelu, frames as rows."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv1d(8, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv1d(32, 32, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv1(x))
        return F.gelu(self.conv2(x)).permute(0, 2, 1)


def test_an_audio_front_end_fuses_its_gelus_and_stays_channels_last_between_its_convs(
        monkeypatch):
    monkeypatch.setattr(layout, "_measured_faster", lambda convs, options: True)  # (NHWC)
    torch.manual_seed(0)
    model = _AudioFrontEnd().eval()
    x = torch.randn(1, 8, 40)
    compiled = kiln.compile(model, (x,), options=Options(generated_kernels=False))
    (graph,) = compiled.report.graphs
    nodes = graph.details.optimized.nodes
    convs = [n for n in nodes if n.op is Op.CONV_ACT]
    assert [(len(n.type.shape), n.attrs.activation) for n in convs] == [(4, Op.GELU)] * 2
    assert not [n for n in nodes if n.op is Op.GELU]
    # one copy to channels-last, the input's: the first convolution's NHWC result, seen as
    # [N, C, L] and back, is the second's input as it is
    copies = [n for n in nodes if n.op in (Op.TO_LAYOUT, Op.CLONE)
              and n.inputs[0].node.op is not Op.CONSTANT]
    assert [n.inputs[0].type.shape for n in copies] == [(1, 8, 1, 40)]
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kernels", [True, False])
def test_an_audio_front_end_compiles_to_eager_values(kernels):
    torch.manual_seed(0)
    model = _AudioFrontEnd().eval()
    x = torch.randn(1, 8, 40)
    x[0, 3, 7] = float("nan")
    x[0, 5, 20] = float("inf")
    compiled = kiln.compile(model, (x,), options=Options(generated_kernels=kernels))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5, equal_nan=True)
