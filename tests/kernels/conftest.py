"""Kernel tests compile into a per-session temporary kernel cache, never ~/.cache."""

from __future__ import annotations

import dataclasses

import pytest

from kiln.codegen.build import CompilerUnavailable, toolchain
from kiln.options import Options


@pytest.fixture(scope="session")
def options(tmp_path_factory: pytest.TempPathFactory) -> Options:
    """A fresh session cache dir, every checked kernel used (no timing: the tests check what
    the kernels compute); skips the test when there is no C compiler."""
    opts = Options(kernel_cache_dir=str(tmp_path_factory.mktemp("kernels")),
                   measure_kernels=False)
    chain = toolchain(opts)
    if isinstance(chain, CompilerUnavailable):
        pytest.skip(f"no C compiler: {chain.reason}")
    return opts


@pytest.fixture(scope="session")
def kernel_options(options: Options) -> Options:
    return dataclasses.replace(options, generated_kernels=True)
