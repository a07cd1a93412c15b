"""Codegen tests compile into a per-session temporary kernel cache, never ~/.cache."""

from __future__ import annotations

import pytest

from kiln.codegen.build import CompilerUnavailable, toolchain
from kiln.options import Options


@pytest.fixture(scope="session")
def options(tmp_path_factory: pytest.TempPathFactory) -> Options:
    """Options with a fresh session cache dir; skips the test when there is no C compiler."""
    opts = Options(kernel_cache_dir=str(tmp_path_factory.mktemp("kernels")))
    chain = toolchain(opts)
    if isinstance(chain, CompilerUnavailable):
        pytest.skip(f"no C compiler: {chain.reason}")
    return opts
