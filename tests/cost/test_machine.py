"""kiln.cost.machine: the FMA peak probe."""

from __future__ import annotations

import pytest

from kiln.codegen.build import CompilerUnavailable, toolchain
from kiln.cost.machine import fma_probe
from kiln.options import Options


def test_the_fma_probe_reports_a_plausible_rate(tmp_path) -> None:  # noqa: ANN001
    options = Options(kernel_cache_dir=str(tmp_path))
    if isinstance(toolchain(options), CompilerUnavailable):
        pytest.skip("no C compiler")
    probe = fma_probe(options)
    assert probe is not None and probe.threads >= 1
    rate = probe.gflops(threads=1, iters=200_000)
    # between one scalar FMA per cycle at 1 GHz and 64 fp32 FMAs per cycle at 6 GHz
    assert 2 < rate < 800
