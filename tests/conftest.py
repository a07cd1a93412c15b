"""Shared fixtures: the quick zoo models, each captured once per session."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest


def _load_support() -> ModuleType:
    """Import tests/kiln_test_support.py once, under one name, for every test folder.

    Test modules then use it with a plain ``import kiln_test_support``, and the zoo capture
    cache in it is shared by tests/ir, tests/passes and tests/runtime.
    """
    name = "kiln_test_support"
    if name not in sys.modules:
        path = Path(__file__).resolve().parent / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


SUPPORT = _load_support()

# kiln's run-time comparison with the model (kiln.frontend.agreement) would hand a test the
# model's own answer where kiln's is wrong: tests compare kiln's results themselves, so it is
# off here (processes the tests start inherit this), and on in tests/frontend/test_agreement.py
os.environ.setdefault("KILN_CHECK_OUTPUTS", "0")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (README's test command): a process per core this process may run on, at
    most 4, as each imports torch and transformers (about 1 GB) and runs kernels on an
    OpenMP thread per core. On 2 cores the suite took 1207 s in one process, 645 s in two."""
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1, 4))


@pytest.fixture(params=SUPPORT.NAMES)
def zoo_case(request: pytest.FixtureRequest):  # -> kiln_test_support.ZooCase
    """One quick zoo model with its captured graph and eager outputs."""
    return SUPPORT.capture(request.param)
