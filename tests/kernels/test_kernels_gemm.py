"""Generated GEMMs replace mm/addmm library calls only where they measure faster; whatever the
measurement says, results match the interpreter."""

from __future__ import annotations

import dataclasses
import platform
import re

import pytest
import torch

import kiln_test_support as support
from kiln.codegen.isa import Isa, target_isa
from kiln.ir import Graph, parse_graph, verify
from kiln.kernels import decide
from kiln.kernels import gemm as G
from kiln.kernels.contractions import build_contraction_kernels
from kiln.kernels.decide import Decisions
from kiln.kernels.gemm_schedule import GemmConfig, pack_b
from kiln.kernels.outcome import KernelBuild, SkipReason
from kiln.kernels.plan import Recipe
from kiln.options import Options
from kiln.passes.partition import gather, gemms
from kiln.runtime.executor import build_executor
from kiln.runtime.memory import plan_memory
from kiln.tir.printer import print_func


def gemm_kernels(graph: Graph, options: Options, decisions: Decisions) -> KernelBuild:
    """The contraction stage with kiln's generated GEMM as the only candidate."""
    only_gemm = dataclasses.replace(options, generated_gemm=True, prepacked_library=False)
    return build_contraction_kernels(graph, gemms(graph), only_gemm, decisions)


TEXT = """\
graph(%x: f32[{m}, {k}]) {{
  %w = constant {{name='w'}} : f32[{k}, {n}]
  %wt = constant {{name='wt'}} : f32[{k}, {n}]
  %b = constant {{name='b'}} : f32[{n}]
  %y = addmm(%b, %x, %w) {{beta=1, alpha=1}} : f32[{m}, {n}]
  %z = mm(%x, %wt) : f32[{m}, {n}]
  %h = addmm(%b, %x, %w) {{beta=0.5, alpha=1}} : f32[{m}, {n}]
  return %y, %z, %h
}}"""


def _graph(m: int, k: int, n: int) -> Graph:
    torch.manual_seed(0)
    weights = {"w": torch.randn(k, n), "wt": torch.randn(n, k).t(), "b": torch.randn(n)}
    graph = parse_graph(TEXT.format(m=m, k=k, n=n), weights)
    verify(graph)
    return graph


def test_gemm_candidates_are_plain_mm_and_addmm() -> None:
    assert [g.last.name for g in gemms(_graph(4, 8, 16))] == ["y", "z"]  # not beta=0.5


@pytest.mark.parametrize("margin", [1e9, 0.0], ids=["always_faster", "never_faster"])
@pytest.mark.parametrize("mkn", [(1, 2, 1), (13, 37, 29), (30, 64, 100), (0, 64, 100)])
def test_generated_gemm_matches_the_interpreter(kernel_options: Options,
                                                monkeypatch: pytest.MonkeyPatch,
                                                margin: float, mkn: tuple[int, int, int]) -> None:
    # fix the verdict of the measurement
    monkeypatch.setitem(decide.MARGIN, Recipe.GEMM, margin)
    graph = _graph(*mkn)
    measured = dataclasses.replace(kernel_options, measure_kernels=True)
    built = gemm_kernels(graph, measured, Decisions(None))
    used = [k.group.last.name for k in built.kernels]
    assert used == (["y", "z"] if margin > 1 else [])
    assert all(s.reason is SkipReason.SLOWER and s.measured for s in built.skipped)
    assert all(k.measured for k in built.kernels)
    for kernel in built.kernels:  # the constant weight is packed once, at compile time
        assert print_func(kernel.plan.replayed()) == print_func(kernel.kernel.func)
        assert "b_prepacked=True" in kernel.trace
        # the schedule: C's tiles loaded per K block, or (one K block) started from the bias
        # (no rows: nothing to schedule)
        assert mkn[0] == 0 or ("b_C_local, b_C_local_1 = sch.cache_inplace(b_C" in kernel.trace
                or "b_C_local = sch.cache_write(b_C, scope='local')" in kernel.trace)
        w = kernel.inputs[1]
        packed = kernel.weight(graph, w)
        nr = GemmConfig.for_isa(target_isa(kernel_options)).nr
        nr = nr // 2 if mkn[2] <= nr // 2 else nr  # (one vector for a narrow output)
        assert packed.shape == (-(-mkn[2] // nr), mkn[1], nr)
        assert torch.equal(packed, pack_b(graph.constant(w.node), nr))
    moved = gather(graph, [k.group for k in built.kernels])
    run, source = build_executor(moved, plan_memory(moved), [0], built.kernels)
    assert source.count("KERNEL") == len(used)
    inputs = support.random_inputs(graph, 1)
    with torch.no_grad():
        actual = run(list(inputs))
    for a, e in zip(actual, support.run_interpreter(graph, tuple(inputs)), strict=True):
        assert support.relative_error(a, e) < 1e-5


def test_a_product_of_one_term_stays_the_librarys(kernel_options: Options) -> None:
    """K = 1: ATen's mm and addmm give the product itself, -0.0 included, where a sum from
    0.0 gives 0.0 (fuzz seed 57, graph 6851); the generated GEMM leaves it to them."""
    graph = _graph(4, 1, 16)
    built = gemm_kernels(graph, kernel_options, Decisions(None))
    assert not built.kernels
    assert {s.reason for s in built.skipped} == {SkipReason.NOT_LOWERABLE}
    assert all("K = 1" in s.detail for s in built.skipped)


ACT_TEXT = """\
graph(%x: f32[{m}, {k}]) {{
  %w = constant {{name='w'}} : f32[{k}, {n}]
  %b = constant {{name='b'}} : f32[{n}]
  %y = addmm_act(%b, %x, %w) {{activation=op('{act}'), act_args={args}, beta=1, alpha=1}}\
 : f32[{m}, {n}]
  return %y
}}"""
ACTIVATIONS = [("relu", ()), ("gelu", ("none",)), ("gelu", ("tanh",)), ("sigmoid", ()),
               ("tanh", ()), ("clamp", (-0.5, 0.5)), ("leaky_relu", (0.1,)), ("hardswish", ())]
ODD = [(1, 7, 15), (7, 129, 33), (15, 2, 129), (129, 15, 7), (30, 64, 1000),
       (0, 256, 300)]  # (no rows: a token-routed layer's empty share)


@pytest.mark.parametrize("act,args", ACTIVATIONS, ids=[f"{a}{b}" for a, b in ACTIVATIONS])
@pytest.mark.parametrize("mkn", ODD, ids=[f"{m}x{k}x{n}" for m, k, n in ODD])
def test_the_activation_runs_in_the_write_back(kernel_options: Options, act: str,
                                               args: tuple, mkn: tuple[int, int, int]) -> None:
    """Linear + bias + activation is one kernel; NaN and infinite rows of x come out as the
    library's (NaN through every activation, infinities saturating where they do)."""
    m, k, n = mkn
    torch.manual_seed(m + k + n)
    graph = parse_graph(ACT_TEXT.format(m=m, k=k, n=n, act=act, args=repr(args)),
                        {"w": torch.randn(n, k).t(), "b": torch.randn(n)})
    verify(graph)
    built = gemm_kernels(graph, kernel_options, Decisions(None, False))
    assert len(built.kernels) == 1, built.skipped
    kernel = built.kernels[0]
    assert f"post.epilogue('{act}'" in kernel.trace
    moved = gather(graph, [k.group for k in built.kernels])
    run, _ = build_executor(moved, plan_memory(moved), [0], built.kernels)
    x = torch.randn(m, k) * 3
    if m:
        x[0, 0] = float("nan")
    # ATen's erf-form gelu gives NaN at +inf (x * 0.5 * (1 + erf(x / sqrt 2)) is +inf there,
    # which kiln's loop form gives): infinite rows are checked for every other activation
    if m > 2 and args != ("none",):
        x[1, :] = float("inf")
        x[2, : k // 2 + 1] = -float("inf")
    with torch.no_grad():
        (actual,) = run([x])
    (expected,) = support.run_interpreter(graph, (x,))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.parametrize("mkn", [(64, 96, 200), (3, 64, 130), (29, 33, 700)])
def test_threads_split_the_columns_of_a_skinny_gemm(kernel_options: Options,
                                                    mkn: tuple[int, int, int]) -> None:
    """With B prepacked and few M tiles, the parallel loop is the N block loop."""
    m, k, n = mkn
    config = G.default_gemm_config(m, n, k, threads=2, b_prepacked=True)
    assert config.split_n and config.nc % config.nr == 0
    graph = _graph(m, k, n)
    built = gemm_kernels(graph, kernel_options, Decisions(None, False))
    assert [k.group.last.name for k in built.kernels] == ["y", "z"]
    inputs = support.random_inputs(graph, 2)
    moved = gather(graph, [k.group for k in built.kernels])
    run, _ = build_executor(moved, plan_memory(moved), [0], built.kernels)
    with torch.no_grad():
        actual = run(list(inputs))
    for a, e in zip(actual, support.run_interpreter(graph, tuple(inputs)), strict=True):
        assert support.relative_error(a, e) < 1e-5


PORTABLE = [(("-O3", "-march=x86-64-v3", "-fopenmp"), Isa.AVX2),
            (("-O3", "-march=x86-64", "-fopenmp"), Isa.VEC128)]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISA flags")
@pytest.mark.parametrize("flags,isa", PORTABLE, ids=[i.label for _, i in PORTABLE])
def test_the_portable_paths_without_avx512(kernel_options: Options, flags: tuple[str, ...],
                                           isa: Isa) -> None:
    """Compiled for AVX2 or plain SSE2 (as on a machine without AVX-512), the GEMM takes the
    register tile of that ISA and still matches, epilogue and column split included."""
    options = dataclasses.replace(kernel_options, c_flags=flags)
    assert target_isa(options) is isa
    nr = GemmConfig.for_isa(isa).nr
    for m, k, n in [(7, 33, 129), (29, 64, 70)]:
        torch.manual_seed(m)
        graph = parse_graph(ACT_TEXT.format(m=m, k=k, n=n, act="gelu", args="('tanh',)"),
                            {"w": torch.randn(n, k).t(), "b": torch.randn(n)})
        built = gemm_kernels(graph, options, Decisions(None, False))
        (kernel,) = built.kernels
        assert kernel.weight(graph, kernel.inputs[1]).shape[-1] == nr
        tile = GemmConfig.for_isa(isa)  # the register tile fits the ISA's registers
        size = int(re.search(r"float C_local\[(\d+)\]", kernel.source).group(1))
        assert size % nr == 0 and size // nr <= tile.mr
        moved = gather(graph, [k.group for k in built.kernels])
        run, _ = build_executor(moved, plan_memory(moved), [0], built.kernels)
        x = torch.randn(m, k)
        with torch.no_grad():
            (actual,) = run([x])
        (expected,) = support.run_interpreter(graph, (x,))
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISA flags")
@pytest.mark.parametrize("m,k,n", [(37, 19, 24), (5, 3, 21), (3136, 96, 24), (64, 300, 1000)])
def test_avx2_three_vector_tiles_and_split_columns_match(kernel_options: Options, m: int,
                                                         k: int, n: int) -> None:
    """Compiled for AVX2: 17..24 columns run as one 4 x 24 tile (tensorized, its padding
    columns never stored) and match; so do 64 rows (N split over 2 threads) and tails."""
    options = dataclasses.replace(kernel_options, c_flags=PORTABLE[0][0])
    torch.manual_seed(n)
    graph = parse_graph(ACT_TEXT.format(m=m, k=k, n=n, act="relu", args="()"),
                        {"w": torch.randn(n, k).t(), "b": torch.randn(n)})
    built = gemm_kernels(graph, options, Decisions(None, False))
    (kernel,) = built.kernels
    if n <= 24:
        assert kernel.weight(graph, kernel.inputs[1]).shape[-1] == 24
        assert "4 x 24 register tile" in kernel.source
    moved = gather(graph, [k.group for k in built.kernels])
    run, _ = build_executor(moved, plan_memory(moved), [0], built.kernels)
    x = torch.randn(m, k)
    x[0, 0] = float("nan")
    with torch.no_grad():
        (actual,) = run([x])
    (expected,) = support.run_interpreter(graph, (x,))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4, equal_nan=True)


RESIDUAL_TEXT = """\
graph(%x: f32[{m}, {k}], %r: f32[{m}, {n}]) {{
  %w = constant {{name='w'}} : f32[{k}, {n}]
  %b = constant {{name='b'}} : f32[{n}]
  %s = add(%r, %b) : f32[{m}, {n}]
  %y = addmm_act(%s, %x, %w) {{activation=op('relu'), act_args=(), beta=1, alpha=1}}\
 : f32[{m}, {n}]
  return %y{extra}
}}"""


def _residual_graph(m: int, k: int, n: int, extra: str = "") -> Graph:
    torch.manual_seed(0)
    graph = parse_graph(RESIDUAL_TEXT.format(m=m, k=k, n=n, extra=extra),
                        {"w": torch.randn(k, n), "b": torch.randn(n)})
    verify(graph)
    return graph


def test_a_residual_plus_bias_is_the_gemms_own_init(kernel_options: Options) -> None:
    """``addmm_act(residual + b, x, w)`` (a 1x1 convolution's residual, `passes.pointwise`)
    is one kernel: the tiles start from residual + b, read once; the sum is never written.
    NaN and infinities in the residual come through as the library's add + addmm give them."""
    graph = _residual_graph(29, 33, 40)
    (group,) = gemms(graph)
    assert [n.name for n in group.nodes] == ["s", "y"]
    assert [repr(v) for v in group.inputs] == ["%r", "%b", "%x", "%w"]
    built = gemm_kernels(graph, kernel_options, Decisions(None, False))
    (kernel,) = built.kernels
    assert [repr(v) for v in kernel.inputs] == ["%x", "%w", "%r", "%b"]
    assert "bias_row=True" in kernel.trace
    assert "bias_row[" in (kernel.source or "")
    moved = gather(graph, [kernel.group])
    run, source = build_executor(moved, plan_memory(moved), [0, 1], built.kernels)
    assert source.count("KERNEL") == 1 and "aten.add" not in source
    x, r = support.random_inputs(graph, 3)
    r[0, 0], r[3, 5], r[7, 39] = float("nan"), float("inf"), -float("inf")
    with torch.no_grad():
        (actual,) = run([x, r])
    (expected,) = support.run_interpreter(graph, (x, r))
    assert torch.equal(actual.isnan(), expected.isnan())
    finite = expected.isfinite()
    assert torch.equal(actual[~finite & ~expected.isnan()], expected[~finite & ~expected.isnan()])
    torch.testing.assert_close(actual[finite], expected[finite], rtol=1e-5, atol=1e-5)


def test_a_residual_sum_read_elsewhere_stays_outside() -> None:
    """Where the sum has another reader, it is written: the GEMM takes it as its input."""
    graph = _residual_graph(14, 8, 16, extra=", %s")
    (group,) = gemms(graph)
    assert [n.name for n in group.nodes] == ["y"]


def test_a_residual_gemm_that_loses_still_gets_the_librarys_variant(
        kernel_options: Options, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the GEMM with the residual's sum loses to ATen's add + addmm, the GEMM alone is
    still offered the library's prepacked variant (the add then stays an ATen call)."""
    import kiln
    from kiln.kernels.plan import Recipe

    monkeypatch.setattr("kiln.passes.layout._measured_faster", lambda *a, **k: True)
    margin = decide.margin  # the generated GEMM never wins (with its residual or without)
    monkeypatch.setattr(decide, "margin",
                        lambda c: 0.0 if c.recipe is Recipe.GEMM else margin(c))
    monkeypatch.setitem(decide.MARGIN, Recipe.LIBRARY, 1e9)  # a library variant always does

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.expand = torch.nn.Conv2d(8, 16, 1)
            self.project = torch.nn.Conv2d(16, 8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.project(torch.relu(self.expand(x))) + x

    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(1, 8, 10, 12)
    options = dataclasses.replace(kernel_options, measure_kernels=True)
    compiled = kiln.compile(model, (x,), options)
    kernels = compiled.report.kernels
    (residual,) = [k for k in kernels if k.ops in (("addmm",), ("add", "addmm"))]
    assert residual.ops == ("addmm",) and residual.kind == "prepacked"
    assert any(k.ops == ("add",) and k.kind == "library" for k in kernels)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("m", [1, 5, 13, 97])
def test_a_last_tile_of_rows_read_in_place_matches(kernel_options: Options, m: int) -> None:
    """M not a multiple of the tile's rows, A not packed (one K block, one N block): the last
    tile reads A in place behind its bounds checks and must not read or write past M."""
    torch.manual_seed(m)
    graph = parse_graph(ACT_TEXT.format(m=m, k=40, n=16, act="relu", args="()"),
                        {"w": torch.randn(16, 40).t(), "b": torch.randn(16)})
    built = gemm_kernels(graph, kernel_options, Decisions(None, False))
    (kernel,) = built.kernels
    assert "A_local" not in kernel.source
    moved = gather(graph, [k.group for k in built.kernels])
    run, _ = build_executor(moved, plan_memory(moved), [0], built.kernels)
    x = torch.randn(m + 3, 40)[:m]  # rows past M hold values the kernel must not use
    x[-1, -1] = float("inf")
    with torch.no_grad():
        (actual,) = run([x])
    (expected,) = support.run_interpreter(graph, (x,))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
