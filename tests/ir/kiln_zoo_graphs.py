"""Captured graphs of the quick zoo models, shared by tests/ir, tests/passes and tests/runtime.

Capturing all eight models takes most of the suite's time, so each model is captured once per
session. The conftest of each test folder loads this module under the one name
``kiln_zoo_graphs`` (see `load` there), so the cache below is shared by all of them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from kiln import models
from kiln.frontend.export import _freeze
from kiln.frontend.importer import import_fx
from kiln.ir import Graph, interpret
from kiln.options import Options
from kiln.passes.pipeline import PassRecord, run_pipeline

NAMES: tuple[str, ...] = tuple(models.names())


@dataclass(frozen=True)
class ZooCase:
    name: str
    model: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    graph: Graph  # as captured and imported
    expected: tuple[torch.Tensor, ...]  # eager outputs of model(*inputs), flattened


@functools.cache
def capture(name: str) -> ZooCase:
    model, inputs = models.build(name, quick=True, seed=0)
    with torch.no_grad():
        program = torch.export.export(model, inputs).run_decompositions()
        frozen, _ = _freeze(program)
        graph = import_fx(program.graph_module, frozen).graph
        expected, _ = torch.utils._pytree.tree_flatten(model(*inputs))
    return ZooCase(name, model, inputs, graph, tuple(expected))


@functools.cache
def optimized(name: str) -> tuple[Graph, tuple[PassRecord, ...]]:
    """The captured graph after the default pipeline, verified after every pass."""
    graph, records, _ = run_pipeline(capture(name).graph, Options(debug=True))
    return graph, tuple(records)


def run_interpreter(graph: Graph, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    with torch.no_grad():
        return interpret(graph, list(inputs))


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative L2 error; exact comparison for integer and boolean results."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    if not expected.is_floating_point():
        return 0.0 if torch.equal(actual, expected) else float("inf")
    diff = torch.linalg.vector_norm((actual - expected).double())
    scale = torch.linalg.vector_norm(expected.double()).clamp_min(1e-30)
    return float(diff / scale)
