"""kiln.cost.machine: the FMA peak probe."""

from __future__ import annotations

import time

import pytest
import torch

from kiln.codegen.build import CompilerUnavailable, toolchain
from kiln.codegen.isa import Isa, target_isa
from kiln.cost.machine import fma_probe, full_rate_512, probe_source, width_ratio
from kiln.options import Options


def test_the_fma_probe_reports_a_plausible_rate(tmp_path) -> None:  # noqa: ANN001
    options = Options(kernel_cache_dir=str(tmp_path))
    if isinstance(toolchain(options), CompilerUnavailable):
        pytest.skip("no C compiler")
    probe = fma_probe(options)
    assert probe is not None and probe.threads >= 1
    assert probe.lanes == target_isa(options).f32_lanes
    rate = probe.gflops(threads=1, iters=200_000)
    # between one scalar FMA per cycle at 1 GHz and 64 fp32 FMAs per cycle at 6 GHz
    assert 2 < rate < 800


def _mm_gflops(n: int = 512) -> float:
    """torch's best rate on one thread for an n x n x n GEMM: a floor for the FMA peak."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.mm(a, b)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return 2 * n**3 / best / 1e9


def test_the_fma_probe_is_no_slower_than_a_library_gemm(tmp_path) -> None:  # noqa: ANN001
    """A GEMM cannot beat the FMA peak. On AVX2 the probe's old 16-lane vectors took two
    registers each: its 12 chains spilled every step and it read 8 GFLOP/s on a Zen 3 core
    whose library GEMM ran at 90."""
    options = Options(kernel_cache_dir=str(tmp_path))
    if isinstance(toolchain(options), CompilerUnavailable):
        pytest.skip("no C compiler")
    probe = fma_probe(options)
    assert probe is not None
    peak = max(probe.gflops(threads=1, iters=1_000_000) for _ in range(2))
    assert peak >= 0.8 * _mm_gflops()


@pytest.mark.parametrize("isa", list(Isa))
def test_each_chain_is_one_register_of_the_isa(isa: Isa) -> None:
    source = probe_source(isa)
    assert f"#define LANES {isa.f32_lanes}\n" in source
    assert "vector_size(LANES * 4)" in source


def test_full_rate_512_is_false_where_kernels_are_not_built_for_avx512(tmp_path) -> None:  # noqa: ANN001
    options = Options(kernel_cache_dir=str(tmp_path),
                      c_flags=("-O3", "-march=x86-64-v3", "-fopenmp"))
    if isinstance(toolchain(options), CompilerUnavailable) or target_isa(options) is Isa.AVX512:
        pytest.skip("no C compiler, or one that ignores -march")
    assert full_rate_512(options) is False
    assert not list(tmp_path.glob("fma-width-*.json"))  # (nothing measured)


@pytest.mark.parametrize("ratio", [2.0, 1.0])
def test_full_rate_512_is_measured_once_and_read_back(tmp_path, monkeypatch,  # noqa: ANN001
                                                      ratio: float) -> None:
    """The answer is recorded in the cache folder; a later process (here: the in-process
    cache cleared) reads the record, not a new measurement, so all compiles agree."""
    import json

    from kiln.cost import machine

    options = Options(kernel_cache_dir=str(tmp_path))
    if target_isa(options) is not Isa.AVX512:
        pytest.skip("the kernels here are not built for AVX-512")
    monkeypatch.setattr(machine, "width_ratio", lambda wide, narrow: ratio)
    machine._full_rate_512.cache_clear()
    first = full_rate_512(options)
    assert first is (ratio >= machine.FULL_RATE_RATIO)
    (record,) = tmp_path.glob("fma-width-*.json")
    stored = json.loads(record.read_text())
    assert stored == {"full_rate_512": first, "ratio": ratio}
    record.write_text(json.dumps({"full_rate_512": not first, "ratio": 1.0}))
    machine._full_rate_512.cache_clear()
    assert full_rate_512(options) is (not first)
    record.write_text("{not json")  # a damaged record is measured again and rewritten
    machine._full_rate_512.cache_clear()
    assert full_rate_512(options) is first
    assert json.loads(record.read_text())["full_rate_512"] is first
    machine._full_rate_512.cache_clear()


def test_an_ambiguous_width_ratio_answers_but_is_not_recorded(tmp_path, monkeypatch  # noqa: ANN001
                                                             ) -> None:
    """A ratio between the two signatures (another process took some of the runs) is this
    process's answer, but the next compile measures again rather than keep it for good."""
    from kiln.cost import machine

    options = Options(kernel_cache_dir=str(tmp_path))
    if target_isa(options) is not Isa.AVX512:
        pytest.skip("the kernels here are not built for AVX-512")
    ratios = [1.47, 1.32, 1.9]
    monkeypatch.setattr(machine, "width_ratio", lambda wide, narrow: ratios.pop(0))
    for expected in (False, False, True):
        machine._full_rate_512.cache_clear()
        assert full_rate_512(options) is expected
    assert not ratios  # (measured each time until a decisive ratio)
    assert len(list(tmp_path.glob("fma-width-*.json"))) == 1
    machine._full_rate_512.cache_clear()


def test_the_measured_width_ratio_is_one_of_the_two_signatures_or_near() -> None:
    """The real probes, each width's best rate: about 1 (split or 256-bit-only pipes) to 2."""
    from kiln.cost import machine

    options = Options()
    if target_isa(options) is not Isa.AVX512:
        pytest.skip("the kernels here are not built for AVX-512")
    chain = toolchain(options)
    if isinstance(chain, CompilerUnavailable):
        pytest.skip("no C compiler")
    wide = machine._probe(options.c_compiler, options.c_flags, options.kernel_cache_dir, 16)
    narrow = machine._probe(options.c_compiler, options.c_flags, options.kernel_cache_dir, 8)
    assert wide is not None and narrow is not None
    assert 0.5 < width_ratio(wide, narrow) < 3


class _FakeProbe:
    """A probe whose rates are given in turn: a busy machine for the first ones."""

    def __init__(self, name: str, rates: list[float], calls: list[str]) -> None:
        self.name, self.rates, self.calls = name, list(rates), calls

    def gflops(self, threads: int | None = None, iters: int = 0) -> float:
        self.calls.append(self.name)
        return self.rates.pop(0)


def test_the_widths_are_measured_in_turns_each_at_its_best() -> None:
    """Another process busy during the wide probe's first run (half its rate) must not make
    a full-rate machine look split: the widths take turns, and each keeps its best."""
    calls: list[str] = []
    wide = _FakeProbe("wide", [60.0, 120.0, 118.0, 119.0], calls)
    narrow = _FakeProbe("narrow", [61.0, 60.0, 59.0, 60.5], calls)
    assert width_ratio(wide, narrow) == 120.0 / 61.0
    assert calls == ["wide", "narrow"] * 4
