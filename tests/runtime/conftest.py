"""Runtime tests that compile kernels use a per-session temporary kernel cache, never ~/.cache."""

from __future__ import annotations

import pytest

from kiln.codegen.build import CompilerUnavailable, toolchain
from kiln.options import Options


@pytest.fixture(scope="session")
def kernel_options(tmp_path_factory: pytest.TempPathFactory) -> Options:
    """Generated kernels on and used unmeasured (the tests check what they compute), a fresh
    cache dir; skips the test when there is no C compiler."""
    opts = Options(generated_kernels=True, kernel_cache_dir=str(tmp_path_factory.mktemp("k")),
                   measure_kernels=False)
    chain = toolchain(opts)
    if isinstance(chain, CompilerUnavailable):
        pytest.skip(f"no C compiler: {chain.reason}")
    return opts
