"""1x1 convolutions on NHWC data become GEMMs over the pixels, with the same values (NaN and
infinities included), whether or not the data is NHWC when it runs."""

from __future__ import annotations

import pytest
import torch

from kiln.ir import parse_graph, verify
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.options import Options
from kiln.passes import layout
from kiln.passes.fold import fold_constants
from kiln.passes.pointwise import pointwise_as_gemm
from kiln.runtime.executor import build_executor

# a 3x3 convolution (stays one) feeding a 1x1 with bias + clamp, then a 1x1 with bias, a
# residual and relu, and a 1x1 with neither bias nor activation
BLOCK = """graph(%x: f32[2, 4, 5, 6]) {{
  %w3 = constant {{name='w3'}} : f32[8, 4, 3, 3]
  %b3 = constant {{name='b3'}} : f32[8]
  %w1 = constant {{name='w1'}} : f32[16, 8, 1, 1]
  %b1 = constant {{name='b1'}} : f32[16]
  %w2 = constant {{name='w2'}} : f32[8, 16, 1, 1]
  %b2 = constant {{name='b2'}} : f32[8]
  %w4 = constant {{name='w4'}} : f32[3, 8, 1, 1]
  %y = conv_act(%x, %w3, %b3) {{stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1, has_bias=True, has_residual=False, activation=op('relu'), act_args=()}} : f32[2, 8, 5, 6]
  %e = conv_act(%y, %w1, %b1) {{stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, has_bias=True, has_residual=False, activation=op('clamp'), act_args=(0.0, 6.0)}} : f32[2, 16, 5, 6]
  %p = conv_act(%e, %w2, %b2, %y) {{stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, has_bias=True, has_residual=True, activation={act}, act_args=()}} : f32[2, 8, 5, 6]
  %q = convolution(%p, %w4) {{stride=({s}, {s}), padding=(0, 0), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1}} : f32[2, 3, {h}, {w}]
  return %q, %p
}}"""  # noqa: E501


def _block(act: str = "op('relu')", stride: int = 1):
    gen = torch.Generator().manual_seed(0)
    shapes = {"w3": (8, 4, 3, 3), "b3": (8,), "w1": (16, 8, 1, 1), "b1": (16,),
              "w2": (8, 16, 1, 1), "b2": (8,), "w4": (3, 8, 1, 1)}
    weights = {k: torch.randn(s, generator=gen) for k, s in shapes.items()}
    h, w = (5, 6) if stride == 1 else (3, 3)
    return parse_graph(BLOCK.format(act=act, s=stride, h=h, w=w), weights)


def _rewritten(graph, options: Options | None = None):
    nhwc = layout.to_channels_last(graph, decide=True)
    return fold_constants(pointwise_as_gemm(nhwc, options))


LIBRARY_ONLY = Options(generated_kernels=False)


def _ops(graph) -> list[Op]:
    return [n.op for n in graph.nodes]


@pytest.mark.parametrize("act,stride", [("op('relu')", 1), ("None", 1), ("op('relu')", 2)])
def test_the_1x1_convolutions_become_gemms_with_the_same_values(act, stride):
    graph = _block(act, stride)
    gemm = _rewritten(graph, LIBRARY_ONLY)
    verify(gemm)
    ops = _ops(gemm)
    # the 3x3 stays; the three 1x1s are an addmm_act, an addmm(_act) on the residual, an mm
    assert ops.count(Op.CONV_ACT) == 1 and Op.CONVOLUTION not in ops
    assert ops.count(Op.SLICE) == (2 if stride == 2 else 0)  # every other row and column
    assert ops.count(Op.ADDMM_ACT) == (2 if act != "None" else 1)
    assert ops.count(Op.MM) == 1
    residual = [n for n in gemm.nodes if n.op in (Op.ADDMM, Op.ADDMM_ACT)
                and n.inputs[0].type.shape == (60, 8)]
    assert len(residual) == 1  # the residual (plus bias) is the GEMM's [M, N] input
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 5, 6, generator=gen)
    x[0, 1, 2, 3], x[1, 0, 0, 0], x[1, 2, 4, 5] = float("nan"), float("inf"), -float("inf")
    want = interpret(graph, [x])
    for got in (interpret(gemm, [x]),  # the reference interpreter: plain NCHW tensors
                build_executor(gemm, None, [0])[0]([x])):  # the runtime: NHWC data
        for g, e in zip(got, want, strict=True):
            assert torch.equal(g.isnan(), e.isnan())
            torch.testing.assert_close(g[e.isfinite()], e[e.isfinite()], rtol=1e-4, atol=1e-4)


def test_the_pixel_view_is_free_on_nhwc_data_and_a_copy_otherwise():
    from kiln.ir.semantics import lower_node, run_call

    gemm = _rewritten(_block())
    pixels = next(n for n in gemm.nodes if n.op is Op.VIEW and n.type.shape == (60, 8))
    permute = pixels.inputs[0].node
    assert permute.op is Op.PERMUTE
    y = torch.randn(2, 8, 5, 6)
    for data, shared in ((y.contiguous(memory_format=torch.channels_last), True), (y, False)):
        (rows,) = run_call(lower_node(permute), [data], data.device)
        (a,) = run_call(lower_node(pixels), [rows], data.device)
        assert (a.data_ptr() == data.data_ptr()) is shared
        torch.testing.assert_close(a, y.permute(0, 2, 3, 1).reshape(60, 8))


def test_a_strided_1x1_stays_a_convolution_for_the_generated_kernel():
    """With generated kernels the direct convolution reads every other pixel in place; the
    stride-1 ones still become GEMMs."""
    graph = _block(stride=2)
    ops = _ops(_rewritten(graph))
    assert Op.SLICE not in ops and ops.count(Op.CONVOLUTION) == 1
    assert ops.count(Op.ADDMM_ACT) == 2
    assert Op.CONVOLUTION not in _ops(_rewritten(graph, LIBRARY_ONLY))


def test_what_stays_a_convolution():
    graph = _block()
    # a graph the layout pass left NCHW: nothing is NHWC, nothing changes
    assert pointwise_as_gemm(graph) is graph
    # a grouped 1x1 stays a convolution (the 3x3 one is checked above)
    text = BLOCK.format(act="None", s=1, h=5, w=6).replace(
        "%w4 = constant {name='w4'} : f32[3, 8, 1, 1]",
        "%w4 = constant {name='w4'} : f32[4, 4, 1, 1]").replace(
        "groups=1} : f32[2, 3, 5, 6]", "groups=2} : f32[2, 4, 5, 6]")
    gen = torch.Generator().manual_seed(0)
    weights = {name: torch.randn(n.type.shape, generator=gen)
               for name, n in ((n.attrs.name, n) for n in _block().nodes
                               if n.op is Op.CONSTANT)}
    weights["w4"] = torch.randn(4, 4, 1, 1, generator=gen)
    grouped = _rewritten(parse_graph(text, weights))
    assert sum(op is Op.CONVOLUTION for op in _ops(grouped)) == 1


def test_nhwc_values_follow_the_gemm_back_to_pixels():
    gemm = _rewritten(_block())
    nhwc = layout.channels_last_values(gemm)
    back = [n.out() for n in gemm.nodes if n.op is Op.PERMUTE
            and tuple(n.attrs.dims) == (0, 3, 1, 2)]
    assert back and all(v in nhwc for v in back)


def test_a_gemm_feeding_the_next_gemm_reads_its_matrix_directly(monkeypatch):
    """%e's GEMM result goes back to NCHW and then to pixels for %p's GEMM: after the
    pipeline's view pass, %p's GEMM reads %e's [60, 16] matrix, with no view between. (The
    layout pass's timed choice is pinned to NHWC, as this test is about what follows it:
    timed on a busy machine, NCHW won once, was kept on disk, and the GEMMs never formed.)"""
    from kiln.options import Options
    from kiln.passes.pipeline import run_pipeline

    monkeypatch.setattr("kiln.passes.layout._measured_faster", lambda *a, **k: True)
    graph = _block()
    optimized, records, _ = run_pipeline(graph, Options(opt_level=2, measure_kernels=False))
    assert "simplify.views" in [r.name for r in records]
    gemms = [n for n in optimized.nodes if n.op in (Op.ADDMM, Op.ADDMM_ACT, Op.MM)]
    first = next(n for n in gemms if n.out().type.shape == (60, 16))
    second = next(n for n in gemms if first.out() in n.inputs)
    assert second.op in (Op.ADDMM, Op.ADDMM_ACT)
    x = torch.randn(2, 4, 5, 6, generator=torch.Generator().manual_seed(2))
    for got, want in zip(interpret(optimized, [x]), interpret(graph, [x]), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_silu_after_a_pointwise_gemm_runs_on_the_gemms_result_as_it_lies(monkeypatch):
    """SiLU, captured as x * sigmoid(x), after a 1x1 convolution made a GEMM: its sigmoid
    read an NCHW view of the GEMM's NHWC result, apart from its multiply, which the views
    pass had moved onto the NHWC values (EfficientNet: 0.37 ms a layer in ATen). With the
    permute sunk below the sigmoid, both read the GEMM's matrix, and the two are one kernel
    group."""
    from kiln.passes.partition import partition
    from kiln.passes.pipeline import run_pipeline

    monkeypatch.setattr("kiln.passes.layout._measured_faster", lambda *a, **k: True)
    text = """graph(%x: f32[1, 8, 6, 6]) {
  %w3 = constant {name='w3'} : f32[8, 8, 3, 3]
  %w1 = constant {name='w1'} : f32[16, 8, 1, 1]
  %b1 = constant {name='b1'} : f32[16]
  %w2 = constant {name='w2'} : f32[8, 16, 3, 3]
  %y = convolution(%x, %w3) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1} : f32[1, 8, 6, 6]
  %e = convolution(%y, %w1, %b1) {stride=(1, 1), padding=(0, 0), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1} : f32[1, 16, 6, 6]
  %s = sigmoid(%e) : f32[1, 16, 6, 6]
  %a = mul(%e, %s) : f32[1, 16, 6, 6]
  %z = convolution(%a, %w2) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1} : f32[1, 8, 6, 6]
  return %z
}"""  # noqa: E501
    gen = torch.Generator().manual_seed(0)
    shapes = {"w3": (8, 8, 3, 3), "w1": (16, 8, 1, 1), "b1": (16,), "w2": (8, 16, 3, 3)}
    graph = parse_graph(text, {k: torch.randn(s, generator=gen) for k, s in shapes.items()})
    optimized, _, _ = run_pipeline(graph, Options(opt_level=2, measure_kernels=False))
    gemm = next(n for n in optimized.nodes if n.op in (Op.ADDMM, Op.ADDMM_ACT))
    sigmoid = next(n for n in optimized.nodes if n.op is Op.SIGMOID)
    assert sigmoid.inputs[0].node.op is not Op.PERMUTE
    assert gemm in {v.node for v in _sources(sigmoid.inputs[0])}
    assert any({Op.SIGMOID, Op.MUL} <= {n.op for n in g.nodes} for g in partition(optimized))
    x = torch.randn(1, 8, 6, 6, generator=gen)
    x[0, 1, 2, 3], x[0, 4, 0, 0] = float("nan"), float("inf")
    for got, want in zip(interpret(optimized, [x]), interpret(graph, [x]), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)


def _sources(value):
    """``value`` and what it is a view of."""
    while True:
        yield value
        if value.node.op not in (Op.VIEW, Op.PERMUTE):
            return
        value = value.node.inputs[0]
