"""Compiling one model again and again in one process does not grow it: every compiled graph
is freed with its model, and the resident set stays flat once capture's own caches are warm.

benchmarks/compile_memory.py measures the same on the full-size models.
"""

from __future__ import annotations

import gc
import sys

import pytest
import torch

import kiln
from kiln import models
from kiln.engine import CompiledGraph
from kiln.options import Options

WARM = 2  # compiles that fill torch.export's and kiln's bounded caches
MEASURED = 3
BOUND_MIB = 16.0  # over MEASURED compiles (torch.fx keeps each generated source: ~0.5 MiB)


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


def _live_graphs() -> int:
    return sum(type(o) is CompiledGraph for o in gc.get_objects())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_repeated_compiles_free_their_graphs_and_keep_rss_flat(tmp_path) -> None:
    model, inputs = models.build("bert", quick=True)
    options = Options(kernel_cache_dir=str(tmp_path), measure_kernels=False)
    with torch.no_grad():
        expected = model(*inputs)
    gc.collect()
    before = _live_graphs()
    rss = []
    for _ in range(WARM + MEASURED):
        compiled = kiln.compile(model, inputs, options)
        torch.testing.assert_close(compiled(*inputs), expected, rtol=1e-4, atol=1e-5)
        assert _live_graphs() > before
        del compiled
        gc.collect()
        assert _live_graphs() == before  # the compiled graph went with its model
        rss.append(_rss_mib())
    growth = rss[-1] - rss[WARM - 1]
    assert growth < BOUND_MIB, f"RSS after each compile (MiB): {[round(r, 1) for r in rss]}"
