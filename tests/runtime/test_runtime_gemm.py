"""Generated GEMMs replace mm/addmm library calls only where they measure faster; whatever the
measurement says, results match the interpreter."""

from __future__ import annotations

import pytest
import torch

import kiln_test_support as support
from kiln.ir import Graph, parse_graph, verify
from kiln.options import Options
from kiln.passes.partition import gather, gemms
from kiln.runtime import gemm as G
from kiln.runtime.executor import build_executor
from kiln.runtime.memory import plan_memory

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
@pytest.mark.parametrize("mkn", [(1, 1, 1), (13, 37, 29), (30, 64, 100)])
def test_generated_gemm_matches_the_interpreter(kernel_options: Options,
                                                monkeypatch: pytest.MonkeyPatch,
                                                margin: float, mkn: tuple[int, int, int]) -> None:
    monkeypatch.setattr(G, "MARGIN", margin)  # fix the verdict of the measurement
    monkeypatch.setattr(G, "ROUNDS", 1)
    graph = _graph(*mkn)
    built = G.build_gemm_kernels(graph, gemms(graph), kernel_options)
    used = [k.group.last.name for k in built.kernels]
    assert used == (["y", "z"] if margin > 1 else [])
    assert all("measured library" in why for _, why in built.skipped)
    if used and min(mkn[1:]) > 1:  # the transposed weight is read in place, not copied
        z = built.kernels[1]
        assert "b_transposed=True" in z.trace
        assert "b_C_local, b_C_local_1 = sch.cache_inplace(b_C" in z.trace  # the schedule
        assert z.weight(graph, z.inputs[1]).data_ptr() == graph.constants["wt"].data_ptr()
    moved = gather(graph, [k.group for k in built.kernels])
    run, source = build_executor(moved, plan_memory(moved), [0], built.kernels)
    assert source.count("KERNEL") == len(used)
    inputs = support.random_inputs(graph, 1)
    with torch.no_grad():
        actual = run(list(inputs))
    for a, e in zip(actual, support.run_interpreter(graph, tuple(inputs)), strict=True):
        assert support.relative_error(a, e) < 1e-5
