"""Channels-last layout: where conversions go, and results equal to the NCHW graph."""

from __future__ import annotations

import re

import pytest
import torch

import kiln
from kiln import models
from kiln.ir import parse_graph, print_graph, verify
from kiln.ir.interp import interpret
from kiln.passes import layout
from kiln.runtime.executor import build_executor
from kiln.runtime.memory import plan_memory

CHAIN = """graph(%x: f32[2, 3, 5, 5]) {
  %w = constant {name='w'} : f32[4, 3, 3, 3]
  %w2 = constant {name='w2'} : f32[4, 4, 1, 1]
  %y = convolution(%x, %w) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1} : f32[2, 4, 5, 5]
  %r = relu(%y) : f32[2, 4, 5, 5]
  %z = convolution(%r, %w2) {stride=(1, 1), padding=(0, 0), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1} : f32[2, 4, 5, 5]
  %f = view(%z) {shape=(2, 100)} : f32[2, 100]
  return %f, %r
}"""  # noqa: E501


def _chain():
    gen = torch.Generator().manual_seed(0)
    weights = {"w": torch.randn(4, 3, 3, 3, generator=gen),
               "w2": torch.randn(4, 4, 1, 1, generator=gen)}
    return parse_graph(CHAIN, weights)


def test_conversions_at_the_edges_of_the_conv_chain() -> None:
    graph = _chain()
    nhwc = layout.to_channels_last(graph, decide=True)
    verify(nhwc)
    text = print_graph(nhwc)
    # the input and both weights enter NHWC; the relu between the convs needs nothing
    assert text.count("to_layout(") == 3
    assert "%x_nhwc = to_layout(%x) {channels_last=True}" in text
    # the flattening view and the graph output %r each get an NCHW copy
    assert "%z_nchw = clone(%z)" in text and "view(%z_nchw)" in text
    assert "%r_nchw = clone(%r)" in text and "return %f, %r_nchw" in text


def test_results_and_output_layout_match_nchw() -> None:
    graph = _chain()
    nhwc = layout.to_channels_last(graph, decide=True)
    x = torch.randn(2, 3, 5, 5)
    expected = interpret(graph, [x])
    run, _ = build_executor(nhwc, None, [0])
    actual = run([x])
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
        assert a.is_contiguous()  # eager returns NCHW, so kiln does too


def test_no_change_when_not_faster_or_no_convolution() -> None:
    graph = _chain()
    assert layout.to_channels_last(graph, decide=False) is graph
    plain = parse_graph("graph(%x: f32[2]) {\n  %y = relu(%x) : f32[2]\n  return %y\n}")
    assert layout.to_channels_last(plain) is plain


def test_measurement_gives_times_for_both_layouts() -> None:
    node = next(n for n in _chain().nodes if n.op.text == "convolution")
    (standard, nhwc), steady = layout._conv_times(layout._signature(node))
    assert standard > 0 and nhwc > 0 and isinstance(steady, bool)


def test_layout_timings_are_kept_on_disk_for_the_next_compile(tmp_path, monkeypatch) -> None:
    """A second compile (a new process: nothing in memory) reads the timings back; an
    unsteady measurement is used once and not kept."""
    options = kiln.Options(kernel_cache_dir=str(tmp_path))
    convs = [n for n in _chain().nodes if n.op.text == "convolution"]
    calls = []

    def timed(signature, prepacked=False, steady=True):
        calls.append(signature)
        return (2e-3, 1e-3), steady
    monkeypatch.setattr(layout, "_conv_times", timed)
    assert layout._measured_faster(convs, options)
    assert layout._measured_faster(convs, options)
    assert len(calls) == len(convs)  # the second decision measured nothing
    monkeypatch.setattr(layout, "_conv_times", lambda s, p=False: timed(s, p, steady=False))
    other = kiln.Options(kernel_cache_dir=str(tmp_path / "other"))
    layout._measured_faster(convs, other)
    layout._measured_faster(convs, other)
    assert len(calls) == 3 * len(convs)  # unsteady: measured each time


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "inception"])
def test_zoo_models_in_nhwc_match_eager(name, monkeypatch) -> None:
    monkeypatch.setattr(layout, "_measured_faster", lambda convs, options: True)
    model, inputs = models.build(name, quick=True)
    compiled = kiln.compile(model, inputs, kiln.Options(opt_level=3, debug=True, strict=True))
    assert compiled.report.op_counts()["to_layout"] >= 1
    with torch.no_grad():
        actual, expected = compiled(*inputs), model(*inputs)
    assert ((actual - expected).norm() / expected.norm()).item() < 1e-4


@pytest.mark.parametrize("pad", [(0, 1, 0, 1), (1, 1, 1, 1), (0, 0, 0, 0, 1, 2)])
def test_aten_pads_keep_an_nhwc_operand_nhwc(pad) -> None:
    """KEEPS_LAYOUT holds pad: kernels after it read NHWC without a layout copy."""
    assert layout.Op.PAD in layout.KEEPS_LAYOUT
    x = torch.randn(2, 8, 5, 5).contiguous(memory_format=torch.channels_last)
    y = torch.ops.aten.constant_pad_nd(x, list(pad))
    assert y.is_contiguous(memory_format=torch.channels_last)


CAT_CHAIN = """graph(%x: f32[1, 4, 6, 6]) {
  %w = constant {name='w'} : f32[4, 4, 3, 3]
  %w2 = constant {name='w2'} : f32[4, 8, 3, 3]
  %a = convolution(%x, %w) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1} : f32[1, 4, 6, 6]
  %b = relu(%a) : f32[1, 4, 6, 6]
  %c = cat(%a, %b) {dim=1} : f32[1, 8, 6, 6]
  %p = avg_pool2d(%c) {kernel=(3, 3), stride=(1, 1), padding=(1, 1), ceil_mode=False, count_include_pad=True, divisor_override=None} : f32[1, 8, 6, 6]
  %y = convolution(%p, %w2) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1} : f32[1, 4, 6, 6]
  return %y
}"""  # noqa: E501


def test_planned_results_in_an_nhwc_chain_stay_nhwc() -> None:
    """A cat between NHWC convolutions writes its arena slot with NHWC strides: in a
    contiguous slot it made every later op read NCHW (inception's pools: 5 ms, not 0.1)."""
    gen = torch.Generator().manual_seed(0)
    graph = parse_graph(CAT_CHAIN, {"w": torch.randn(4, 4, 3, 3, generator=gen),
                                    "w2": torch.randn(4, 8, 3, 3, generator=gen)})
    nhwc = layout.to_channels_last(graph, decide=True)
    cat = next(n for n in nhwc.nodes if n.op.text == "cat")
    assert cat.out() in layout.channels_last_values(nhwc)
    plan = plan_memory(nhwc)
    assert cat.out() in plan.offsets
    run, source = build_executor(nhwc, plan, [0])
    line = next(ln for ln in source.splitlines() if "K_cat" in ln)
    slot = int(re.search(r"out=buf\[(\d+)\]", line).group(1))
    assert "as_strided" not in source  # (the arena made the view once)
    cat_buffer = run.__globals__["buffers"]()[slot]
    assert cat_buffer.stride() == (288, 1, 48, 8)
    x = torch.randn(1, 4, 6, 6, generator=gen)
    torch.testing.assert_close(run([x])[0], interpret(graph, [x])[0], rtol=1e-5, atol=1e-5)


# a ConvNeXt block: a depthwise convolution, its channels normalized as the last dim, the
# result permuted back to NCHW and added to the block's input (another such view)
NHWC_VIEWS = """graph(%x: f32[1, 6, 7, 8]) {
  %g = constant {name='g'} : f32[8]
  %b = constant {name='b'} : f32[8]
  %w = constant {name='w'} : f32[8, 1, 3, 3]
  %n = layer_norm(%x, %g, %b) {normalized_shape=(8,), eps=1e-06} : (f32[1, 6, 7, 8], f32[1, 6, 7, 1], f32[1, 6, 7, 1])
  %v = permute(%n#0) {dims=(0, 3, 1, 2)} : f32[1, 8, 6, 7]
  %c = convolution(%v, %w) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=8} : f32[1, 8, 6, 7]
  %cl = permute(%c) {dims=(0, 2, 3, 1)} : f32[1, 6, 7, 8]
  %m = layer_norm(%cl, %g, %b) {normalized_shape=(8,), eps=1e-06} : (f32[1, 6, 7, 8], f32[1, 6, 7, 1], f32[1, 6, 7, 1])
  %u = permute(%m#0) {dims=(0, 3, 1, 2)} : f32[1, 8, 6, 7]
  %s = add(%v, %u) : f32[1, 8, 6, 7]
  %d = convolution(%s, %w) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=8} : f32[1, 8, 6, 7]
  return %d
}"""  # noqa: E501


def test_an_nchw_view_of_nhwc_memory_enters_the_chain_without_a_copy() -> None:
    """permute(x) {(0, 3, 1, 2)} of a dense [N, H, W, C] value is NHWC in memory: the
    convolutions read it as it lies (no to_layout of the data, only of the weights), and
    the add of two such views is NHWC too, its slot and the next convolution's read
    included. Before, each view was copied to NHWC ahead of its convolution, and the add
    wrote NCHW (HF ConvNeXt: 170 and 588 us at its first stage, per block)."""
    gen = torch.Generator().manual_seed(0)
    weights = {"g": torch.rand(8, generator=gen) + 0.5, "b": torch.randn(8, generator=gen),
               "w": torch.randn(8, 1, 3, 3, generator=gen)}
    graph = parse_graph(NHWC_VIEWS, weights)
    nhwc = layout.to_channels_last(graph, decide=True)
    verify(nhwc)
    text = print_graph(nhwc)
    assert text.count("to_layout(") == 1 and "to_layout(%w)" in text  # the weight's, once
    values = layout.channels_last_values(nhwc)
    by_name = {n.name: n for n in nhwc.nodes}
    assert {by_name["v"].out(), by_name["u"].out(), by_name["s"].out()} <= values
    x = torch.randn(1, 6, 7, 8, generator=gen)
    x[0, 2, 3, 4] = float("nan")
    run, _ = build_executor(nhwc, plan_memory(nhwc), [0])
    torch.testing.assert_close(run([x])[0], interpret(graph, [x])[0], rtol=1e-5, atol=1e-5,
                               equal_nan=True)


STAGE_START = """graph(%x: f32[1, 4, 6, 6], %y: f32[1, 3, 3, 8]) {
  %w = constant {name='w'} : f32[8, 4, 2, 2]
  %w2 = constant {name='w2'} : f32[8, 1, 3, 3]
  %c = convolution(%x, %w) {stride=(2, 2), padding=(0, 0), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1} : f32[1, 8, 3, 3]
  %cl = permute(%c) {dims=(0, 2, 3, 1)} : f32[1, 3, 3, 8]
  %m = clone(%y) : f32[1, 3, 3, 8]
  %s = add(%cl, %m) : f32[1, 3, 3, 8]
  %v = permute(%s) {dims=(0, 3, 1, 2)} : f32[1, 8, 3, 3]
  %d = convolution(%v, %w2) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=8} : f32[1, 8, 3, 3]
  return %d
}"""  # noqa: E501


def test_an_add_read_through_a_permute_of_nhwc_memory_stays_dense() -> None:
    """A ConvNeXt stage's first residual add, as rule permute-hoist leaves it: the
    downsampling convolution's NHWC output read as [N, H, W, C] is dense, so is the add, and
    its NCHW view enters the next convolution without a copy."""
    gen = torch.Generator().manual_seed(0)
    weights = {"w": torch.randn(8, 4, 2, 2, generator=gen),
               "w2": torch.randn(8, 1, 3, 3, generator=gen)}
    graph = parse_graph(STAGE_START, weights)
    nhwc = layout.to_channels_last(graph, decide=True)
    verify(nhwc)
    text = print_graph(nhwc)
    assert "to_layout(%x)" in text and "to_layout(%v)" not in text and "to_layout(%s)" \
        not in text
    by_name = {n.name: n.out() for n in nhwc.nodes}
    assert {by_name["c"], by_name["v"]} <= layout.channels_last_values(nhwc)
    x, y = torch.randn(1, 4, 6, 6, generator=gen), torch.randn(1, 3, 3, 8, generator=gen)
    run, _ = build_executor(nhwc, plan_memory(nhwc), [0, 1])
    torch.testing.assert_close(run([x, y])[0], interpret(graph, [x, y])[0], rtol=1e-5,
                               atol=1e-5)


class _Unfold(torch.nn.Module):
    """MobileViT's unfolding of a conv chain's output into patches: a view that NHWC memory
    cannot give."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c2(torch.relu(self.c1(x)))
        patches = y.reshape(8 * 4, 2, 4, 2).transpose(1, 2)
        return torch.tanh(patches).sum(dim=(2, 3))


def test_a_view_nhwc_cannot_give_reads_a_copy_under_dynamo() -> None:
    """Under Dynamo the probe's meta view raises ValueError, not RuntimeError: the layout pass
    failed on it, and MobileViT's torch.compile ran eagerly."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = _Unfold().eval(), torch.randn(1, 3, 8, 8)
    fast = torch.compile(model, backend="kiln", options={"strict": True})
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)


class _UpsampledHead(torch.nn.Module):
    """ViTPose's head (an NCHW view of tokens, upsampled 4x, a 3x3 convolution) and a
    U-Net-like step (a convolution, upsampled, another)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Conv2d(8, 4, 3, padding=1)
        self.down = torch.nn.Conv2d(4, 6, 3, padding=1, stride=2)
        self.up = torch.nn.Conv2d(6, 5, 3, padding=1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        image = tokens.transpose(1, 2).reshape(1, 8, 6, 6).relu()
        y = self.head(torch.nn.functional.interpolate(image, scale_factor=4, mode="bilinear"))
        z = self.down(y)
        return self.up(torch.nn.functional.interpolate(z, scale_factor=2, mode="nearest"))


def test_an_upsampling_before_convolutions_runs_nhwc(monkeypatch) -> None:
    """The upsampling reads an NHWC copy of its input and gives NHWC: no copy of its (16x
    larger) result before the convolution; one after another convolution reads its NHWC
    result as it is."""
    monkeypatch.setattr(layout, "_measured_faster", lambda convs, options: True)
    model, tokens = _UpsampledHead().eval(), torch.randn(1, 36, 8)
    tokens[0, 3, 2], tokens[0, 7, 1] = float("nan"), float("inf")
    compiled = kiln.compile(model, (tokens,), kiln.Options(opt_level=3, strict=True))
    graph = compiled.report.graphs[0].details.optimized
    upsamplings = [n for n in graph.nodes if n.op is layout.Op.CALL
                   and n.attrs.target in layout.RELAYOUT_CALLS]
    assert len(upsamplings) == 2
    nhwc = layout.channels_last_values(graph)
    assert all(n.out() in nhwc for n in upsamplings)
    converted = {n.inputs[0].node.op for n in graph.nodes if n.op is layout.Op.TO_LAYOUT}
    assert layout.Op.CALL not in converted  # (no upsampled result copied)
    with torch.no_grad():
        torch.testing.assert_close(compiled(tokens), model(tokens), equal_nan=True)
