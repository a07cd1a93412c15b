"""kiln.kernels.strides: a view's run-time strides, from the layout its source has."""

from __future__ import annotations

import torch

from kiln.ir import parse_graph, verify
from kiln.kernels.strides import runtime_strides

# a ConvNeXt stage's start: a downsampling convolution (NHWC in memory), its output read by
# the first block's residual add through a permute to [N, H, W, C]; and a channel slice
NHWC_SOURCE = """graph(%x: f32[1, 4, 6, 6]) {
  %w = constant {name='w'} : f32[8, 4, 2, 2]
  %xl = to_layout(%x) {channels_last=True} : f32[1, 4, 6, 6]
  %wl = to_layout(%w) {channels_last=True} : f32[8, 4, 2, 2]
  %c = convolution(%xl, %wl) {stride=(2, 2), padding=(0, 0), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1} : f32[1, 8, 3, 3]
  %p = permute(%c) {dims=(0, 2, 3, 1)} : f32[1, 3, 3, 8]
  %s = slice(%c) {dim=1, start=2, end=6, step=1} : f32[1, 4, 3, 3]
  %q = permute(%x) {dims=(0, 2, 3, 1)} : f32[1, 6, 6, 4]
  return %p, %s, %q
}"""  # noqa: E501


def test_views_of_channels_last_values_replay_on_channels_last_memory() -> None:
    """The permute of the NHWC convolution's output to [N, H, W, C] is contiguous (it was
    taken for a strided view of NCHW memory: a kernel reading it then failed its layout
    check on every call); a channel slice has NHWC's strides; a view of an input (NCHW, as
    the caller passes it) keeps NCHW's."""
    graph = parse_graph(NHWC_SOURCE, {"w": torch.randn(8, 4, 2, 2)})
    verify(graph)
    by_name = {n.name: n.out() for n in graph.nodes}
    c = torch.empty(1, 8, 3, 3).contiguous(memory_format=torch.channels_last)
    assert runtime_strides(graph, by_name["p"]) is None
    assert c.permute(0, 2, 3, 1).is_contiguous()
    assert runtime_strides(graph, by_name["s"]) == c[:, 2:6].stride() == (72, 1, 24, 8)
    assert runtime_strides(graph, by_name["q"]) == torch.empty(1, 4, 6, 6).permute(
        0, 2, 3, 1).stride()


def test_a_view_of_a_weight_replays_on_the_weights_own_strides() -> None:
    """Folding can leave a slice of a bigger tensor as a weight (Funnel's attention mask,
    rows of 128 in rows of 256): its expand has that slice's strides, not a contiguous
    tensor's (the softmax kernel reading it failed its layout check on every call)."""
    mask = torch.rand(1, 1, 4, 16) > 0.5
    sliced = mask[..., :8]
    graph = parse_graph("""graph(%x: f32[1, 3, 4, 8]) {
  %m = constant {name='m'} : bool[1, 1, 4, 8]
  %e = expand(%m) {shape=(1, 3, 4, 8)} : bool[1, 3, 4, 8]
  return %e
}""", {"m": sliced})
    (e,) = graph.outputs
    assert runtime_strides(graph, e) == sliced.expand(1, 3, 4, 8).stride() == (64, 0, 16, 1)
