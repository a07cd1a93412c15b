"""Options for the tuning tests that compile: a private kernel cache, kernels used unmeasured,
and a skip where there is no C compiler."""

from __future__ import annotations

from pathlib import Path

import pytest

import kiln
from kiln.codegen.build import CompilerUnavailable, toolchain


@pytest.fixture
def options(tmp_path: Path) -> kiln.Options:
    opts = kiln.Options(kernel_cache_dir=str(tmp_path / "kernels"), measure_kernels=False)
    if isinstance(toolchain(opts), CompilerUnavailable):
        pytest.skip("no C compiler")
    return opts
