"""The generated batched GEMM (bmm): A and B read with the strides of the views attention
gives them, against torch.bmm at odd sizes; the strides predicted from the IR; the contraction
stage and the executor, including the fallback where the run time's strides differ."""

from __future__ import annotations

import dataclasses
import platform
import re
import warnings

import pytest
import torch
from torch import nn

import kiln
from kiln.codegen.isa import Isa
from kiln.codegen.kernel import compile_kernel
from kiln.ir import parse_graph, verify
from kiln.kernels.contractions import build_contraction_kernels
from kiln.kernels.decide import Decisions
from kiln.kernels.gemm_schedule import GemmConfig, gemm_plan
from kiln.kernels.strides import runtime_strides
from kiln.options import Options
from kiln.passes.partition import gather, gemms
from kiln.runtime.executor import KernelFallbackWarning, build_executor
from kiln.runtime.memory import plan_memory
from kiln.tune.space import GemmSpace

TINY = GemmConfig(mr=4, nr=8, kc=5, mc=8, nc=16)  # several blocks and tails in every loop


def _heads(batch: int, rows: int, cols: int, seed: int, transposed: bool = False
           ) -> torch.Tensor:
    """[batch, rows, cols] as attention has it: a head's slice of a [rows, 2 * batch * cols]
    projection, split, viewed by heads, permuted (and transposed for a key)."""
    gen = torch.Generator().manual_seed(seed)
    proj = torch.randn(1, rows, 2 * batch * cols, generator=gen)
    piece = proj.split(batch * cols, dim=2)[1].view(1, rows, batch, cols)
    order = (0, 2, 3, 1) if transposed else (0, 2, 1, 3)
    heads = piece.permute(order)
    return heads.reshape(batch, *heads.shape[2:])


CASES = [(3, 7, 33, 15, TINY), (2, 13, 16, 40, TINY), (4, 1, 9, 5, TINY),
         (3, 29, 31, 64, None)]


@pytest.mark.parametrize("transposed_b", [False, True], ids=["B", "Kt"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}x{c[2]}x{c[3]}" for c in CASES])
def test_strided_bmm_matches_torch(options: Options, case: tuple, transposed_b: bool) -> None:
    batch, m, n, k, config = case
    a = _heads(batch, m, k, seed=1)
    b = _heads(batch, n, k, seed=2, transposed=True) if transposed_b else \
        _heads(batch, k, n, seed=2)
    assert not b.is_contiguous() and (m == 1 or not a.is_contiguous())
    config = config or GemmConfig(mr=14, nr=32, kc=512, mc=28, nc=512)
    plan = gemm_plan(m, n, k, config, name=f"bmm_test_{batch}_{m}_{n}_{k}_{transposed_b}",
                     batch=batch, a_strides=a.stride(), b_strides=b.stride())
    kernel = compile_kernel(plan.build(), options)
    out = torch.full((batch, m, n), float("nan"))
    kernel(a, b, out)
    torch.testing.assert_close(out, torch.bmm(a, b), rtol=1e-5, atol=1e-5)
    assert plan.replayed() == plan.build()
    assert "#pragma omp parallel" in kernel.source  # the batch on the threads


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISA flags")
def test_strided_bmm_portable_path(options: Options) -> None:
    """Compiled for plain SSE2 (a machine without AVX-512): the same."""
    sse = dataclasses.replace(options, c_flags=("-O3", "-march=x86-64", "-fopenmp"))
    a, b = _heads(3, 9, 7, seed=3), _heads(3, 11, 7, seed=4, transposed=True)
    plan = gemm_plan(9, 11, 7, GemmConfig(mr=6, nr=8, kc=4, mc=6, nc=8), name="bmm_sse",
                     batch=3, a_strides=a.stride(), b_strides=b.stride())
    out = torch.empty(3, 9, 11)
    compile_kernel(plan.build(), sse)(a, b, out)
    torch.testing.assert_close(out, torch.bmm(a, b), rtol=1e-5, atol=1e-5)


GRAPH = """\
graph(%x: f32[1, 6, 48]) {
  %w = constant {name='w'} : f32[48, 96]
  %xm = view(%x) {shape=(6, 48)} : f32[6, 48]
  %p = mm(%xm, %w) : f32[6, 96]
  %p3 = view(%p) {shape=(1, 6, 96)} : f32[1, 6, 96]
  %qk = split(%p3) {sizes=(48, 48), dim=2} : (f32[1, 6, 48], f32[1, 6, 48])
  %q4 = view(%qk#0) {shape=(1, 6, 4, 12)} : f32[1, 6, 4, 12]
  %k4 = view(%qk#1) {shape=(1, 6, 4, 12)} : f32[1, 6, 4, 12]
  %qh = permute(%q4) {dims=(0, 2, 1, 3)} : f32[1, 4, 6, 12]
  %kh = permute(%k4) {dims=(0, 2, 3, 1)} : f32[1, 4, 12, 6]
  %q3 = view(%qh) {shape=(4, 6, 12)} : f32[4, 6, 12]
  %k3 = view(%kh) {shape=(4, 12, 6)} : f32[4, 12, 6]
  %s = bmm(%q3, %k3) : f32[4, 6, 6]
  return %s
}"""


def _graph():  # noqa: ANN202
    torch.manual_seed(0)
    graph = parse_graph(GRAPH, {"w": torch.randn(48, 96)})
    verify(graph)
    return graph


def _scores(graph, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """What GRAPH computes, in eager torch."""
    w = next(graph.constant(n) for n in graph.nodes if n.name == "w")
    q, k = (x.view(6, 48) @ w).view(1, 6, 96).split([48, 48], dim=2)
    return q.reshape(1, 6, 4, 12).permute(0, 2, 1, 3).reshape(4, 6, 12) @ \
        k.reshape(1, 6, 4, 12).permute(0, 2, 3, 1).reshape(4, 12, 6)


def test_runtime_strides_follow_the_view_chain() -> None:
    """The strides the executor's views give (a head of the projection, a transposed key),
    replayed on meta tensors; None for a value that is not a view."""
    graph = _graph()
    node = next(n for n in graph.nodes if n.name == "s")
    q3, k3 = node.inputs
    x = torch.randn(6, 96).view(1, 6, 96).split([48, 48], dim=2)
    want_q = x[0].view(1, 6, 4, 12).permute(0, 2, 1, 3).reshape(4, 6, 12).stride()
    want_k = x[1].view(1, 6, 4, 12).permute(0, 2, 3, 1).reshape(4, 12, 6).stride()
    assert runtime_strides(graph, q3) == want_q == (12, 96, 1)
    assert runtime_strides(graph, k3) == want_k == (12, 1, 96)
    assert runtime_strides(graph, graph.inputs[0].out()) is None


def test_bmm_in_the_contraction_stage_and_the_executor(kernel_options: Options) -> None:
    """Offered, checked against torch on operands with the predicted strides, and run by the
    executor on the views the run time makes (copied only where their strides differ)."""
    graph = _graph()
    assert [g.last.name for g in gemms(graph)] == ["p", "s"]
    only_gemm = dataclasses.replace(kernel_options, prepacked_library=False)
    built = build_contraction_kernels(graph, gemms(graph), only_gemm, Decisions(None, False))
    bmm = next(k for k in built.kernels if k.group.last.name == "s")
    assert bmm.generated and "batch=4" in bmm.trace
    moved = gather(graph, [k.group for k in built.kernels])
    run, source = build_executor(moved, plan_memory(moved), [0], built.kernels)
    assert "RELAID" in source  # the strides are checked, not assumed
    x = torch.randn(1, 6, 48)
    (got,) = run([x])
    torch.testing.assert_close(got, _scores(graph, x), rtol=1e-4, atol=1e-4)


def test_bmm_with_other_strides_at_run_time_reads_dense_copies(
        kernel_options: Options, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong guess of the strides (here: the kernel built for contiguous operands while the
    views are strided) costs a copy, not the answer: the kernel reads dense copies."""
    monkeypatch.setattr("kiln.kernels.gemm.runtime_strides", lambda graph, value: None)
    graph = _graph()
    only_gemm = dataclasses.replace(kernel_options, prepacked_library=False)
    built = build_contraction_kernels(graph, gemms(graph), only_gemm, Decisions(None, False))
    moved = gather(graph, [k.group for k in built.kernels])
    run, source = build_executor(moved, plan_memory(moved), [0], built.kernels)
    assert re.search(r"_dense = v\d+_\w+\.contiguous\(\)", source), source
    x = torch.randn(1, 6, 48)
    (got,) = run([x])
    torch.testing.assert_close(got, _scores(graph, x), rtol=1e-4, atol=1e-4)


class _HeadsProduct(nn.Module):
    """Attention's two batched products around a tanh (softmax would make it kiln's fused
    attention op)."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, d = x.shape[1], x.shape[2]
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (y.view(1, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        s = torch.tanh(q @ k.transpose(2, 3))  # (not softmax: that would fuse into attention)
        return (s @ v).transpose(1, 2).reshape(1, t, d)


def _compiled(model: nn.Module, options: Options) -> tuple[kiln.CompiledModel, torch.Tensor,
                                                          int]:
    """``model`` compiled on a [1, 10, 32] input; that input and its generated bmms' count."""
    x = torch.randn(1, 10, 32)
    compiled = kiln.compile(model.eval(), (x,), options)
    bmms = sum(k.kind == "generated" and "kiln_bmm" in (k.source or "")
               for k in compiled.report.kernels)
    return compiled, x, bmms


def test_batched_products_through_kiln_compile(kernel_options: Options) -> None:
    """Scores and weighted values as generated batched GEMMs, matching eager."""
    torch.manual_seed(0)
    model = _HeadsProduct()
    compiled, x, bmms = _compiled(model, kernel_options)
    assert bmms >= 1
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


class _LongProduct(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


def test_bmm_with_a_long_reduction_compiles(kernel_options: Options) -> None:
    """K above the GEMM's KC (512): a batched GEMM takes one K block, so its heuristic must
    say so (it once chose KC = K/3, which its space refused, and the whole compile fell back
    to eager)."""
    torch.manual_seed(0)
    a, b = torch.randn(2, 9, 1100), torch.randn(2, 1100, 17)
    compiled = kiln.compile(_LongProduct(), (a, b), kernel_options)
    assert not compiled.report.fallbacks
    assert any(k.kind == "generated" and "kiln_bmm" in (k.source or "")
               for k in compiled.report.kernels)
    torch.testing.assert_close(compiled(a, b), torch.bmm(a, b), rtol=1e-4, atol=1e-4)


def test_tail_tiles_of_a_bmm_run_without_bounds_checks_in_their_k_loop() -> None:
    """Attention's 197 x 197 scores: the last tiles of rows and of columns compute over
    their packed (padded) panels without a guard per multiply-add, as an unbatched GEMM's
    do (the tile's accumulator carries the batch as a dim of extent 1); only their
    write-back is guarded. A guard per FMA made the 12 x 197 x 197 x 64 product 6x slower
    than the library."""
    from kiln.codegen.c import render_c

    config = GemmConfig(mr=12, nr=32, kc=64, mc=24, nc=224)
    func = gemm_plan(197, 197, 64, config, name="bmm_tails", batch=3).build()
    source = render_c(func)
    updates = source.split("/* block C */")[1:]
    assert len(updates) >= 3  # the full tile and the tails (rows, columns)
    assert all("if (" not in u[:u.index("}")] for u in updates)
    stores = source.split("/* block C_local */")[1:]
    assert any("if (" in s[:s.index("}")] for s in stores)  # (the tails' write-back)


def test_a_bmm_takes_a_tile_of_rows_that_divides_m() -> None:
    """A batch's last tile of rows, when short, makes the bmm pack A and keep that tile's
    guards in every batch: its default MR divides M where a tile of 4 rows or more does.
    An unbatched GEMM keeps its taller tile."""
    from kiln.kernels.gemm_schedule import BATCHED_MIN_MR, default_gemm_config

    avx2 = GemmConfig.for_isa(Isa.AVX2)  # 6 x 16 tiles
    for m, want in [(128, 4), (64, 4), (96, 6), (197, 6), (120, 6), (125, 5)]:
        config = default_gemm_config(m, 128, 64, threads=1, base=avx2, one_k_block=True,
                                     batched=True)
        assert config.mr == want, m
        assert config.mr >= BATCHED_MIN_MR and (m % config.mr == 0 or want == 6)
    assert default_gemm_config(128, 128, 64, threads=1, base=avx2, one_k_block=True).mr == 6
    avx512 = GemmConfig.for_isa(Isa.AVX512)
    assert default_gemm_config(128, 128, 64, threads=1, base=avx512, one_k_block=True,
                               batched=True).mr == 8
    space = GemmSpace(128, 128, 64, Isa.AVX2, 2, batch=8)
    assert space.default()["mr"] == 4


class _SharedKeyProduct(nn.Module):
    """Multi-query attention's products (Falcon, Gemma): one key and value head expanded over
    the query heads, so the bmm reads K and V with a 0 stride along the heads."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.head = heads, dim // heads
        self.q, self.kv = nn.Linear(dim, dim), nn.Linear(dim, 2 * self.head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        q = self.q(x).view(1, t, self.heads, self.head).transpose(1, 2)
        k, v = (y.view(1, t, 1, self.head).transpose(1, 2).expand(1, self.heads, t, self.head)
                for y in self.kv(x).split(self.head, dim=2))
        s = torch.tanh(q @ k.transpose(2, 3))
        return (s @ v).transpose(1, 2).reshape(1, t, self.heads * self.head)


@pytest.mark.parametrize("per_shared_head", [False, True])
def test_a_key_shared_by_the_heads_gets_the_generated_bmm(kernel_options: Options,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          per_shared_head: bool) -> None:
    """The check's random operands share values where the run time's expanded view shares
    memory (a copy into a 0-stride layout is refused: that once cost these products their
    kernels, and failed the compile under strict). With the pipeline's ``shared.heads``
    pass (the default) the one shared head is no expanded operand at all: each product is
    one generated GEMM over the heads' stacked rows (the scores' with their tanh)."""
    from kiln.passes import pipeline

    if not per_shared_head:
        passes = tuple(p for p in pipeline.PIPELINE if p.name != "shared.heads")
        monkeypatch.setattr(pipeline.run_pipeline, "__defaults__",
                            (passes, *pipeline.run_pipeline.__defaults__[1:]))
    torch.manual_seed(0)
    model = _SharedKeyProduct()
    compiled, x, bmms = _compiled(model, dataclasses.replace(kernel_options, strict=True))
    gemms = sum(k.kind == "generated" and k.ops in (("mm",), ("addmm_act",))  # (tanh fused)
                for k in compiled.report.kernels)
    assert (bmms, gemms) == ((0, 2) if per_shared_head else (2, 0))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert compiled.report.graphs[0].details.fallbacks == {}


class _ScaledKeyProduct(nn.Module):
    """DeBERTa's scores: the transposed key divided by a tensor scale before the product. The
    library's division keeps its operand's transposed layout unless written into a slot."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.head = heads, dim // heads
        self.qk = nn.Linear(dim, 2 * dim)
        self.register_buffer("scale", torch.tensor(float(self.head)).sqrt())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        q, k = (y.view(1, t, self.heads, self.head).transpose(1, 2).reshape(-1, t, self.head)
                for y in self.qk(x).split(self.heads * self.head, dim=2))
        return torch.tanh(torch.bmm(q, k.transpose(-1, -2) / self.scale))


def test_a_divided_transposed_key_reaches_the_bmm_contiguous(kernel_options: Options) -> None:
    """The division writes into its planned slot (div.out), so the generated bmm gets the
    layout it was compiled for; it used to fall back to the library's bmm on every call."""
    torch.manual_seed(0)
    model = _ScaledKeyProduct()
    compiled, x, bmms = _compiled(model, kernel_options)
    assert bmms >= 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert compiled.report.graphs[0].details.fallbacks == {}
