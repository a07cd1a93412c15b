"""Library variants: convolutions and GEMMs with constant weights run oneDNN on weights
reordered once, bias, residual and activation as post-ops; results match the interpreter."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kiln_test_support as support
from kiln.ir import Graph, GraphBuilder, Op, TensorType, verify
from kiln.ir.attrs import AddmmActAttrs, AddmmAttrs, ConvActAttrs
from kiln.ir.types import DType
from kiln.kernels.contractions import build_contraction_kernels
from kiln.kernels.decide import Decisions
from kiln.kernels.library import library_groups
from kiln.kernels.outcome import KernelBuild
from kiln.options import Options
from kiln.passes.partition import gather
from kiln.runtime.executor import build_executor
from kiln.runtime.memory import plan_memory

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")

F32 = DType.F32
CONVS = [  # (cin, cout, size, kernel, stride, groups, bias, residual, activation)
    (3, 16, 15, 3, 1, 1, True, False, Op.RELU), (16, 16, 9, 1, 1, 1, True, True, Op.RELU),
    (8, 24, 7, 3, 2, 1, False, False, None), (12, 12, 10, 3, 1, 12, True, False, Op.CLAMP),
    (12, 24, 10, 3, 1, 4, True, True, None), (7, 5, 1, 1, 1, 1, True, False, Op.SIGMOID),
]


def library_kernels(graph: Graph, groups: list, options: Options,
                    decisions: Decisions) -> KernelBuild:
    """The contraction stage with oneDNN on prepacked weights as the only candidate."""
    only_library = dataclasses.replace(options, generated_gemm=False, prepacked_library=True)
    return build_contraction_kernels(graph, groups, only_library, decisions)


def _conv_graph(cin: int, cout: int, size: int, k: int, stride: int, groups: int,
                bias: bool, residual: bool, act: Op | None) -> Graph:
    torch.manual_seed(cin * cout)
    b = GraphBuilder()
    x = b.input("x", TensorType((1, cin, size, size), F32))
    out = (size + 2 * (k // 2) - k) // stride + 1
    inputs = [x, b.constant("w", torch.randn(cout, cin // groups, k, k))]
    if bias:
        inputs.append(b.constant("b", torch.randn(cout)))
    if residual:
        inputs.append(b.input("r", TensorType((1, cout, out, out), F32)))
    args = (-0.5, 0.5) if act is Op.CLAMP else ()
    attrs = ConvActAttrs((stride, stride), (k // 2, k // 2), (1, 1), groups, bias, residual,
                         act, args)
    y = b.op(Op.CONV_ACT, *inputs, attrs=attrs)
    graph = b.build(y)
    verify(graph)
    return graph


def _linear_graph(m: int, k: int, n: int, act: Op | None) -> Graph:
    torch.manual_seed(m * k)
    b = GraphBuilder()
    x = b.input("x", TensorType((m, k), F32))
    w = b.constant("w", torch.randn(n, k).t())
    bias = b.constant("b", torch.randn(n))
    if act is None:
        y = b.op(Op.ADDMM, bias, x, w, attrs=AddmmAttrs())
    else:
        y = b.op(Op.ADDMM_ACT, bias, x, w, attrs=AddmmActAttrs(act, ("tanh",)
                                                                if act is Op.GELU else ()))
    graph = b.build(y)
    verify(graph)
    return graph


def _check(graph: Graph, options: Options) -> None:
    groups = library_groups(graph)
    assert len(groups) == 1
    built = library_kernels(graph, groups, options, Decisions(None, False))
    assert len(built.kernels) == 1, built.skipped
    kernel = built.kernels[0]
    assert not kernel.generated and kernel.kernel.packed_bytes > 0
    moved = gather(graph, [k.group for k in built.kernels])
    run, source = build_executor(moved, plan_memory(moved), range(len(graph.inputs)),
                                 built.kernels)
    assert "LIB" in source
    for seed in range(2):
        inputs = support.random_inputs(graph, seed)
        inputs[0].view(-1)[0] = float("nan")
        with torch.no_grad():
            (actual,) = run(list(inputs))
        (expected,) = support.run_interpreter(graph, tuple(inputs))
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.parametrize("case", CONVS, ids=[f"conv{i}" for i in range(len(CONVS))])
def test_prepacked_convolution_matches(kernel_options: Options, case: tuple) -> None:
    _check(_conv_graph(*case), kernel_options)


@pytest.mark.parametrize("mkn_act", [(1, 7, 15, None), (7, 129, 33, Op.RELU),
                                     (129, 15, 7, Op.GELU), (30, 64, 100, None)])
def test_prepacked_linear_matches(kernel_options: Options, mkn_act: tuple) -> None:
    _check(_linear_graph(*mkn_act), kernel_options)


def test_a_variant_that_measures_slower_is_not_used(kernel_options: Options,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.kernels import decide
    from kiln.kernels.plan import Recipe

    monkeypatch.setitem(decide.MARGIN, Recipe.LIBRARY, 0.0)  # nothing can win
    graph = _conv_graph(*CONVS[1])
    built = library_kernels(graph, library_groups(graph), kernel_options, Decisions(None))
    assert built.kernels == [] and built.skipped[0].measured is not None


@pytest.mark.parametrize("act", [None, "op('relu')"])
def test_gemms_over_pixels_also_run_as_the_1x1_convolution_they_were(act) -> None:
    """A GEMM of `passes.pointwise` (A = an NHWC image's pixels as rows) gets oneDNN's 1x1
    convolution as one more library candidate, with a row bias or an [M, N] input (residual
    + bias); every candidate agrees with the node's ATen call, NaN and inf included."""
    from kiln.ir import parse_graph
    from kiln.kernels.library import library_candidates
    from kiln.passes import layout
    from kiln.passes.fold import fold_constants
    from kiln.passes.pointwise import pointwise_as_gemm

    text = f"""graph(%x: f32[2, 8, 5, 6]) {{
  %w3 = constant {{name='w3'}} : f32[8, 8, 3, 3]
  %w1 = constant {{name='w1'}} : f32[16, 8, 1, 1]
  %b1 = constant {{name='b1'}} : f32[16]
  %w2 = constant {{name='w2'}} : f32[8, 16, 1, 1]
  %b2 = constant {{name='b2'}} : f32[8]
  %y = convolution(%x, %w3) {{stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1}} : f32[2, 8, 5, 6]
  %e = conv_act(%y, %w1, %b1) {{stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, has_bias=True, has_residual=False, activation={act}, act_args=()}} : f32[2, 16, 5, 6]
  %p = conv_act(%e, %w2, %b2, %y) {{stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, has_bias=True, has_residual=True, activation={act}, act_args=()}} : f32[2, 8, 5, 6]
  return %p
}}"""  # noqa: E501
    gen = torch.Generator().manual_seed(0)
    shapes = {"w3": (8, 8, 3, 3), "w1": (16, 8, 1, 1), "b1": (16,), "w2": (8, 16, 1, 1),
              "b2": (8,)}
    graph = parse_graph(text, {k: torch.randn(s, generator=gen) for k, s in shapes.items()})
    gemm = fold_constants(pointwise_as_gemm(layout.to_channels_last(graph, decide=True)))
    groups = [g for g in library_groups(gemm) if g.last.op is not Op.CONVOLUTION]
    assert len(groups) == 2
    for group in groups:
        found = library_candidates(gemm, group)
        names = [c.kernel.name for c in found if not hasattr(c, "reason")]
        matrix = len(group.last.inputs[0].type.shape) == 2
        # the residual GEMM ([M, N] input) has no inner-product form: only the convolution
        assert names == (["onednn_pixels_conv_packed"] if matrix else
                         ["onednn_linear_packed", "onednn_pixels_conv_packed"])
        node = group.last
        env = {v: torch.randn(v.type.shape, generator=gen) for v in node.inputs
               if v.node.op is not Op.CONSTANT}
        a = node.inputs[-2]
        env[a][0, 1], env[a][3, 2], env[a][7, 0] = float("nan"), float("inf"), -float("inf")
        args = [env[v] if v in env else gemm.constant(v.node) for v in node.inputs]
        from kiln.ir.interp import evaluate_node
        (want,) = evaluate_node(node, args, gemm)
        for built in found:
            got = built.kernel.fn(*[env[v] for v in built.inputs])
            assert torch.equal(got.isnan(), want.isnan())
            torch.testing.assert_close(got[want.isfinite()], want[want.isfinite()])


def test_weights_are_reordered_on_first_use_only() -> None:
    """Building a library candidate reorders nothing; its first run (or a question of its
    packed size) does, once."""
    from kiln.kernels.library import library_candidates
    from kiln.kernels.outcome import Built

    class Kept:  # a check answered by the database: the kernel does not run
        def agrees(self, graph: Graph, built: Built) -> bool:
            return True

    graph = _linear_graph(8, 32, 24, None)
    (built,) = library_candidates(graph, library_groups(graph)[0], Kept())  # type: ignore
    assert isinstance(built, Built)
    pack = built.kernel.pack  # type: ignore[union-attr]
    assert pack.cache_info().currsize == 0
    x = torch.randn(8, 32)
    got = built.kernel.fn(x)  # type: ignore[union-attr]
    w, b = (graph.constant(n) for n in graph.nodes if n.op is Op.CONSTANT)
    torch.testing.assert_close(got, torch.addmm(b, x, w))
    assert pack.cache_info().currsize == 1 and built.kernel.packed_bytes > 0  # type: ignore
    assert pack.cache_info().misses == 1


@pytest.mark.parametrize(("variant_us", "kind"), [(75.0, "generated"), (60.0, "prepacked")])
def test_a_library_variant_must_beat_the_generated_kernel_by_its_larger_margin(
        kernel_options: Options, monkeypatch: pytest.MonkeyPatch, variant_us: float,
        kind: str) -> None:
    """ATen's call 100 us, the generated GEMM 80 (within its 0.95), the prepacked variant
    75: the variant is faster but not by its margin's worth (75 / 0.85 > 80 / 0.95), so
    the generated GEMM runs; at 60 the variant does."""
    from kiln.kernels import decide
    from kiln.kernels.gemm import gemm_candidate
    from kiln.kernels.library import library_candidates
    from kiln.kernels.outcome import Built, Measured
    from kiln.kernels.plan import Recipe

    graph = _linear_graph(30, 64, 100, None)
    (group,) = library_groups(graph)
    generated = gemm_candidate(graph, group, kernel_options)
    (variant,) = library_candidates(graph, group)
    assert isinstance(generated, Built) and isinstance(variant, Built)
    times = {Recipe.GEMM: 80e-6, Recipe.LIBRARY: variant_us * 1e-6}
    monkeypatch.setattr(decide, "measure", lambda graph, candidates, cold=False: (
        [Measured(100e-6, times[c.recipe]) for c in candidates], True))
    chosen = decide.fastest(graph, [generated, variant], Decisions(None))
    assert isinstance(chosen, Built)
    assert ("generated" if chosen.generated else "prepacked") == kind
