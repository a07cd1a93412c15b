"""Compiled quick zoo models shared by the report tests (each compiled once per session)."""

from __future__ import annotations

import pytest

import kiln
from kiln import models
from kiln.options import Options


@pytest.fixture(scope="session")
def report_options(tmp_path_factory: pytest.TempPathFactory) -> Options:
    # every checked kernel is used, so the same kernels are generated on every machine
    return Options(kernel_cache_dir=str(tmp_path_factory.mktemp("kernels")),
                   measure_kernels=False)


@pytest.fixture(scope="session")
def compiled_bert(report_options: Options) -> kiln.CompiledModel:
    model, inputs = models.build("bert", quick=True)
    return kiln.compile(model, inputs, report_options)


@pytest.fixture(scope="session")
def compiled_resnet(report_options: Options) -> kiln.CompiledModel:
    model, inputs = models.build("resnet18", quick=True)
    return kiln.compile(model, inputs, report_options)
