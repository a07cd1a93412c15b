"""The analytic cost model: FLOPs and bytes per op, a roofline, weight-only nodes free."""

from __future__ import annotations

import torch

from kiln.cost.analytic import AnalyticCost, Roofline, narrow_groups, node_bytes, node_flops
from kiln.cost.graph import GraphCost
from kiln.ir import parse_graph
from kiln.options import Options

ROOF = Roofline(peak_flops=200e9, bandwidth=40e9, call_s=5e-6, contraction_efficiency=0.5)


def _nodes(text: str) -> dict:
    graph = parse_graph(text)
    return graph, {n.name: n for n in graph.nodes}


def test_flops_of_contractions_follow_their_shapes() -> None:
    _, n = _nodes("""graph(%x: f32[8, 32], %w: f32[32, 16], %b: f32[16], %i: f32[1, 3, 10, 10], \
%k: f32[4, 3, 3, 3], %g: f32[6, 2, 3, 3]) {
  %mm = mm(%x, %w) : f32[8, 16]
  %am = addmm(%b, %x, %w) : f32[8, 16]
  %conv = convolution(%i, %k) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), \
transposed=False, output_padding=(0, 0), groups=1} : f32[1, 4, 10, 10]
  %i6 = cat(%i, %i) {dim=1} : f32[1, 6, 10, 10]
  %gconv = convolution(%i6, %g) {stride=(1, 1), padding=(0, 0), dilation=(1, 1), \
transposed=False, output_padding=(0, 0), groups=3} : f32[1, 6, 8, 8]
  return %mm, %am, %conv, %gconv
}""")
    assert node_flops(n["mm"]) == 2 * 8 * 16 * 32
    assert node_flops(n["am"]) == 2 * 8 * 16 * 32 + 8 * 16  # the bias add
    assert node_flops(n["conv"]) == 2 * (4 * 10 * 10) * 3 * 9
    assert node_flops(n["gconv"]) == 2 * (6 * 8 * 8) * 2 * 9  # 2 input channels per group
    assert node_bytes(n["mm"]) == 4 * (8 * 32 + 32 * 16 + 8 * 16)


def test_views_move_no_bytes_and_cost_a_fraction_of_a_call() -> None:
    _, n = _nodes("""graph(%x: f32[64, 64]) {
  %t = permute(%x) {dims=(1, 0)} : f32[64, 64]
  %c = clone(%t) : f32[64, 64]
  return %c
}""")
    model = AnalyticCost(ROOF)
    assert node_bytes(n["t"]) == 0 and model.node_seconds(n["t"]) < ROOF.call_s
    assert node_bytes(n["c"]) == 2 * 64 * 64 * 4
    assert model.node_seconds(n["c"]) == ROOF.call_s + 2 * 64 * 64 * 4 / ROOF.bandwidth


def test_a_large_gemm_is_compute_bound_and_a_large_add_memory_bound() -> None:
    _, n = _nodes("""graph(%a: f32[512, 512], %b: f32[512, 512]) {
  %mm = mm(%a, %b) : f32[512, 512]
  %add = add(%a, %b) : f32[512, 512]
  return %mm, %add
}""")
    model = AnalyticCost(ROOF)
    gemm = 2 * 512**3 / (ROOF.peak_flops * ROOF.contraction_efficiency)
    assert abs(model.node_seconds(n["mm"]) - (ROOF.call_s + gemm)) < 1e-12
    assert abs(model.node_seconds(n["add"]) - (ROOF.call_s + 3 * 512 * 512 * 4 / 40e9)) < 1e-12


def test_a_fused_epilogue_costs_less_than_the_separate_ops() -> None:
    separate = parse_graph("""graph(%x: f32[64, 256], %w: f32[256, 256], %b: f32[256]) {
  %am = addmm(%b, %x, %w) : f32[64, 256]
  %r = relu(%am) : f32[64, 256]
  return %r
}""")
    fused = parse_graph("""graph(%x: f32[64, 256], %w: f32[256, 256], %b: f32[256]) {
  %am = addmm_act(%b, %x, %w) {activation=op('relu'), act_args=(), beta=1, alpha=1} : f32[64, 256]
  return %am
}""")
    cost = GraphCost(AnalyticCost(ROOF))
    assert cost.seconds(fused) < cost.seconds(separate)


def test_nodes_that_depend_on_weights_only_cost_nothing() -> None:
    from kiln.ir.builder import GraphBuilder
    from kiln.ir.ops import Op
    from kiln.ir.types import DType, TensorType

    b = GraphBuilder("cpu")
    x = b.input("x", TensorType((4, 32), DType.F32))
    w = b.constant("w", torch.randn(32, 32))
    wt = b.node(Op.PERMUTE, w, attrs=__import__("kiln.ir.attrs", fromlist=["PermuteAttrs"])
                .PermuteAttrs((1, 0))).out()
    doubled = b.node(Op.ADD, wt, wt).out()
    y = b.node(Op.MM, x, doubled).out()
    graph = b.build(y)
    model = AnalyticCost(ROOF)
    mm = next(n for n in graph.nodes if n.op is Op.MM)
    assert GraphCost(model).seconds(graph) == model.node_seconds(mm)


def test_the_roofline_is_measured_once_and_kept_on_disk(tmp_path) -> None:
    options = Options(kernel_cache_dir=str(tmp_path))
    first = Roofline.of_machine(options)
    assert first.measured and first.peak_flops > 1e9 and first.bandwidth > 1e8
    assert 0 < first.call_s < 1e-3
    assert (tmp_path / "roofline.json").exists()
    assert Roofline.of_machine(options) == first  # read back, not measured again
    (tmp_path / "roofline.json").write_text("{not json")
    assert Roofline.of_machine(options).measured  # a corrupt cache costs a measurement


def test_narrow_groups_are_the_grouped_convolutions_a_vector_is_wider_than() -> None:
    _, n = _nodes("""graph(%i: f32[1, 32, 10, 10], %dense: f32[8, 32, 3, 3], \
%g4: f32[32, 4, 3, 3], %g16: f32[32, 16, 1, 1], %g32: f32[32, 32, 1, 1], %dw: f32[32, 1, 3, 3]) {
  %dense_conv = convolution(%i, %dense) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), \
transposed=False, output_padding=(0, 0), groups=1} : f32[1, 8, 10, 10]
  %narrow = convolution(%i, %g4) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), \
transposed=False, output_padding=(0, 0), groups=8} : f32[1, 32, 10, 10]
  %two = convolution(%i, %g16) {stride=(1, 1), padding=(0, 0), dilation=(1, 1), \
transposed=False, output_padding=(0, 0), groups=2} : f32[1, 32, 10, 10]
  %depthwise = convolution(%i, %dw) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), \
transposed=False, output_padding=(0, 0), groups=32} : f32[1, 32, 10, 10]
  return %dense_conv, %narrow, %two, %depthwise
}""")
    assert narrow_groups(n["narrow"]) and narrow_groups(n["two"])
    assert not narrow_groups(n["dense_conv"]) and not narrow_groups(n["depthwise"])
