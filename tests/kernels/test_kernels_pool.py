"""The generated pooling kernel (channels-last, fp32): max and average pools against eager
torch at odd sizes, every divisor rule, NaN and +-inf inputs, the portable path; its plan;
what it refuses; and pools through the contraction stage and kiln.compile."""

from __future__ import annotations

import dataclasses
import platform

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln
from kiln.codegen.isa import Isa, target_isa
from kiln.codegen.kernel import compile_kernel, prebuild
from kiln.ir import parse_graph, verify
from kiln.kernels.contractions import build_contraction_kernels, contraction_groups
from kiln.kernels.decide import Decisions
from kiln.kernels.depthwise_schedule import DepthwiseConfig
from kiln.kernels.plan import Recipe, Serial
from kiln.kernels.pool import pool_groups
from kiln.kernels.pool_schedule import PoolShape, pool_plan
from kiln.options import Options
from kiln.passes.partition import gather
from kiln.runtime.executor import build_executor
from kiln.runtime.memory import plan_memory

CL = torch.channels_last

# (n, c, h, w, kind, kernel, stride, padding, dilation, count_include_pad, divisor_override)
CASES = [
    (1, 20, 17, 19, "max", 3, 2, 1, 1, True, None),  # ResNet's stem pool, a channel tail
    (2, 16, 15, 15, "max", 3, 2, 0, 1, True, None),  # Inception's, N = 2
    (1, 7, 9, 10, "max", 2, 1, 1, 2, True, None),  # dilation 2, fewer channels than a vector
    (1, 3, 2, 3, "max", 3, 1, 1, 1, True, None),  # H, W below the window: every tile a border
    (1, 33, 11, 13, "avg", 3, 1, 1, 1, True, None),  # Inception's 3x3/1 average, pad counted
    (1, 33, 11, 13, "avg", 3, 1, 1, 1, False, None),  # the same, pad not counted
    (1, 16, 12, 9, "avg", 2, 2, 1, 1, True, None),  # windows clipped at the far border
    (1, 17, 10, 10, "avg", 3, 2, 1, 1, True, 5),  # divisor_override
    (1, 40, 7, 7, "avg", 7, 1, 0, 1, True, None),  # a global average (mean over H, W)
]
IDS = [f"{c[4]}{c[1]}x{c[2]}x{c[3]}k{c[5]}s{c[6]}p{c[7]}d{c[8]}"
       f"{'' if c[9] else 'nopad'}{'' if c[10] is None else f'div{c[10]}'}" for c in CASES]


def _shape(case: tuple) -> PoolShape:
    n, c, h, w, kind, k, s, p, d, include, override = case
    return PoolShape(n, c, h, w, (k, k), (s, s), (p, p), (d, d), kind, include, override)


def _plan(case: tuple, lanes: int = 16):  # noqa: ANN202
    shape = _shape(case)
    name = "pool_test_" + "_".join(str(v) for v in case).replace("None", "n")
    return shape, pool_plan(shape, DepthwiseConfig.default(shape, lanes), f"{name}_{lanes}")


def _eager(shape: PoolShape, x: torch.Tensor) -> torch.Tensor:
    if shape.kind == "max":
        return F.max_pool2d(x, shape.kernel, shape.stride, shape.padding, shape.dilation)
    return F.avg_pool2d(x, shape.kernel, shape.stride, shape.padding,
                        count_include_pad=shape.count_include_pad,
                        divisor_override=shape.divisor_override)


def _run(kernel, shape: PoolShape, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    out = torch.full((shape.n, shape.c, *shape.out), float("nan")).contiguous(memory_format=CL)
    kernel(x, out)
    return out


def _input(shape: PoolShape, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape.n, shape.c, shape.h, shape.w, generator=gen).contiguous(
        memory_format=CL)


@pytest.fixture(scope="module")
def built(kernel_options: Options) -> dict:
    """Every case's kernel, compiled in parallel."""
    plans = {case: _plan(case) for case in CASES}
    prebuild([plan.build() for _, plan in plans.values()], kernel_options)
    return {case: (shape, plan, compile_kernel(plan.build(), kernel_options))
            for case, (shape, plan) in plans.items()}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_pool_matches_eager_bit_for_bit(built: dict, case: tuple) -> None:
    """The same taps in the same order and ATen's divisor: the same bits as ATen's
    channels-last pooling."""
    shape, plan, kernel = built[case]
    x = _input(shape, seed=len(IDS[CASES.index(case)]))
    got = _run(kernel, shape, x)
    want = _eager(shape, x)
    assert got.shape == want.shape
    assert torch.equal(got, want)
    assert got.is_contiguous(memory_format=CL)
    assert plan.recipe is Recipe.POOL
    assert plan.replayed() == plan.build()  # the trace is the shipped kernel


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[4], CASES[5]],
                         ids=[IDS[0], IDS[3], IDS[4], IDS[5]])
def test_pool_non_finite_inputs(built: dict, case: tuple) -> None:
    """NaN propagates through max (ATen: ``val > max || isnan(val)``) wherever it sits in a
    window, in the interior and on the border; +-inf as ATen gives them; a window of only
    -inf is -inf."""
    shape, _, kernel = built[case]
    x = _input(shape, seed=3)
    x[0, 0, 0, 0] = float("nan")
    x[0, 1, shape.h // 2, shape.w // 2] = float("inf")
    x[0, 2, -1, -1] = float("-inf")
    x[0, 2, 0, :] = float("-inf")
    x[0, 2, 1, :] = float("-inf")
    got = _run(kernel, shape, x)
    want = _eager(shape, x)
    assert want.isnan().any() and want.isinf().any()
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("case", [CASES[0], CASES[1]], ids=[IDS[0], IDS[1]])
def test_max_pool_keeps_the_first_of_equal_zeros(built: dict, case: tuple) -> None:
    """Signed zeros tie: the earlier tap in the window stays, as in ATen, so a window
    holding -0.0 then +0.0 pools to -0.0 and the other way round to +0.0."""
    shape, _, kernel = built[case]
    gen = torch.Generator().manual_seed(4)
    signs = torch.randint(0, 2, (shape.n, shape.c, shape.h, shape.w), generator=gen)
    x = torch.where(signs.bool(), torch.tensor(-0.0), torch.tensor(0.0)).contiguous(
        memory_format=CL)
    got, want = _run(kernel, shape, x), _eager(shape, x)
    assert torch.equal(got.signbit(), want.signbit())
    assert want.signbit().any() and not want.signbit().all()


def test_pool_plan_serial_below_grain() -> None:
    """A small pool runs on one thread; a large one keeps its threads."""
    small = PoolShape(1, 16, 8, 8, (3, 3), (2, 2), (1, 1))
    assert any(isinstance(p, Serial) for p in pool_plan(small, DepthwiseConfig(4, 16)).post)
    big = PoolShape(1, 64, 112, 112, (3, 3), (2, 2), (1, 1))
    assert not any(isinstance(p, Serial) for p in pool_plan(big, DepthwiseConfig()).post)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISA flags")
def test_pool_portable_path(kernel_options: Options) -> None:
    """Compiled for plain SSE2 (a machine without AVX-512), 4 channels a vector: the same."""
    options = dataclasses.replace(kernel_options, c_flags=("-O3", "-march=x86-64", "-fopenmp"))
    assert target_isa(options) is Isa.VEC128
    for case in (CASES[0], CASES[5]):
        shape, plan = _plan(case, lanes=Isa.VEC128.f32_lanes)
        kernel = compile_kernel(plan.build(), options)
        x = _input(shape, seed=5)
        assert torch.equal(_run(kernel, shape, x), _eager(shape, x))


GRAPH = """\
graph(%x: f32[1, 24, {h}, 11]) {{
  %xl = to_layout(%x) {{channels_last=True}} : f32[1, 24, {h}, 11]
  %x_in = {source} : f32[1, 24, {h}, 11]
  %p = max_pool2d(%x_in) {{kernel=(3, 3), stride=(2, 2), padding=(1, 1), dilation=(1, 1), \
ceil_mode={ceil}}} : (f32[1, 24, 7, 6], i64[1, 24, 7, 6])
  %a = avg_pool2d(%p#0) {{kernel=(3, 3), stride=(1, 1), padding=(1, 1), ceil_mode=False, \
count_include_pad=False, divisor_override=None}} : f32[1, 24, 7, 6]
  %m = mean(%a) {{dims=(2, 3), keepdim={keepdim}}} : {mean_type}
  return %m{indices}
}}"""


def _graph(source: str = "relu(%xl)", ceil: bool = False, keepdim: bool = True,
           indices: bool = False):  # noqa: ANN202
    mean_type = "f32[1, 24, 1, 1]" if keepdim else "f32[1, 24]"
    # (13 rows pool to 7 either way; 12 rows to 6, or to 7 in ceil mode)
    text = GRAPH.format(h=12 if ceil else 13, source=source, ceil=ceil, keepdim=keepdim,
                        mean_type=mean_type, indices=", %p#1" if indices else "")
    graph = parse_graph(text, {})
    verify(graph)
    return graph


def test_pools_in_the_contraction_stage(kernel_options: Options) -> None:
    """Max pool (indices unread), average pool and the global mean are offered, checked
    against ATen on channels-last operands, and run by the executor on an NHWC input."""
    graph = _graph()
    assert [g.last.name for g in pool_groups(graph)] == ["p", "a", "m"]
    built = build_contraction_kernels(graph, contraction_groups(graph), kernel_options,
                                      Decisions(None, False))
    assert len(built.kernels) == 3
    assert all(k.generated and k.plan.recipe is Recipe.POOL  # type: ignore[union-attr]
               for k in built.kernels)
    moved = gather(graph, [k.group for k in built.kernels])
    run, _ = build_executor(moved, plan_memory(moved), [0], built.kernels)
    x = torch.randn(1, 24, 13, 11)
    x[0, 3, 4, 4] = float("nan")
    pooled = F.max_pool2d(x.relu(), 3, 2, 1)
    want = F.avg_pool2d(pooled, 3, 1, 1, count_include_pad=False).mean((2, 3), keepdim=True)
    (got,) = run([x])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert got[0, 3].isnan().all()


@pytest.mark.parametrize("why", ["nchw", "indices", "ceil", "no_keepdim"])
def test_pool_refuses(why: str) -> None:
    """Stays with the library: an input NCHW at run time, max pool indices that are read,
    a ceil mode that changes the output size, a mean without keepdim."""
    graph = _graph(source="relu(%x)") if why == "nchw" else \
        _graph(indices=True) if why == "indices" else \
        _graph(ceil=True) if why == "ceil" else _graph(keepdim=False)
    names = [g.last.name for g in pool_groups(graph)]
    assert {"nchw": "p", "indices": "p", "ceil": "p", "no_keepdim": "m"}[why] not in names


def test_pools_through_kiln_compile(kernel_options: Options,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A small CNN with a stem max pool, an average pool and a global average, compiled at
    O2 with channels-last forced: the pools run generated and the model matches eager."""
    monkeypatch.setattr("kiln.passes.layout._measured_faster", lambda *a, **k: True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                          nn.Conv2d(32, 32, 3, 1, 1), nn.ReLU(),
                          nn.AvgPool2d(3, 1, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(32, 10)).eval()
    x = torch.randn(1, 3, 45, 41)
    options = dataclasses.replace(kernel_options, measure_kernels=False)
    compiled = kiln.compile(model, (x,), options)
    pools = [k for k in compiled.report.kernels
             if k.kind == "generated" and "pool_" in (k.source or "")]
    assert len(pools) >= 2
    with torch.no_grad():
        want = model(x)
        got = compiled(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
