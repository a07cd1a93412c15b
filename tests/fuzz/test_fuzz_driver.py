"""The seeded slice CI runs: 500 random graphs, every configuration, no mismatch.

Graphs 0..499 of seed 0 compile at O0-O3 and O2 with fast math; the configurations with
generated kernels run on every other graph (each new kernel is a C compiler run). On this
project's 2-core CI machine the slice takes about a minute; `kiln fuzz` runs the long ones.
"""

from __future__ import annotations

import time

import pytest
import torch

from kiln.codegen.build import CompilerUnavailable, toolchain
from kiln.fuzz.check import CONFIGS
from kiln.fuzz.driver import FuzzSettings, run_fuzz
from kiln.options import Options

SLICE = FuzzSettings(graphs=500, seed=0, jobs=0, kernel_every=2)


@pytest.fixture(scope="module")
def compiler(tmp_path_factory: pytest.TempPathFactory) -> str:
    cache = str(tmp_path_factory.mktemp("kernels"))
    chain = toolchain(Options(kernel_cache_dir=cache))
    if isinstance(chain, CompilerUnavailable):
        pytest.skip(f"no C compiler: {chain.reason}")
    return cache


def test_seeded_slice_has_no_mismatch(compiler: str, tmp_path) -> None:
    settings = FuzzSettings(**{**SLICE.__dict__, "cache_dir": compiler,
                               "out_dir": str(tmp_path / "out")})
    threads = torch.get_num_threads()
    start = time.perf_counter()
    try:
        torch.set_num_threads(1)  # tiny tensors: a second thread only adds wake-ups
        summary = run_fuzz(settings)
    finally:
        torch.set_num_threads(threads)
    elapsed = time.perf_counter() - start
    print(summary.text(), f"\nslice: {elapsed:.1f} s")
    assert summary.graphs == 500
    assert not summary.failures, summary.text()
    assert summary.invalid < 15  # the generator's types are right, and its values mostly fit
    for config in CONFIGS:
        counts = summary.configs[config.name]
        assert counts["graphs"] >= (225 if config.kernels else 475)
    kernels = summary.configs["O2+kernels"]
    assert kernels["generated"] >= 20 and kernels["close"] + kernels["near"] >= 20
    assert summary.configs["O2"]["exact"] >= 500
