"""Shared by the loop-IR tests: the small lowered programs of tir_cases (importable from
here), and Options that compile into a kernel cache of the test module's own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kiln.codegen.build import CompilerUnavailable, toolchain
from kiln.options import Options

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="module")
def options(tmp_path_factory: pytest.TempPathFactory) -> Options:
    """Options compiling into the module's own kernel cache (skips without a C compiler)."""
    opts = Options(kernel_cache_dir=str(tmp_path_factory.mktemp("kernels")))
    if isinstance(toolchain(opts), CompilerUnavailable):
        pytest.skip("no C compiler")
    return opts
