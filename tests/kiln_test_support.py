"""Shared by tests/ir, tests/passes and tests/runtime: captured zoo graphs and small helpers.

Capturing all eight quick zoo models takes most of the suite's time, so each model is captured
once per session. The conftest of each of those folders loads this module under the one name
``kiln_test_support`` (see `_load_support` there), so the caches below are shared by all.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from kiln import models
from kiln.frontend.export import _freeze
from kiln.frontend.importer import import_fx
from kiln.ir import Graph, Op, interpret, parse_graph, print_graph, verify
from kiln.options import Options
from kiln.passes.pipeline import PassRecord, run_pipeline

NAMES: tuple[str, ...] = tuple(models.names(models.Origin.BUILTIN))  # HF ones: tests/e2e


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
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)
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


def random_inputs(graph: Graph, seed: int = 0) -> list[torch.Tensor]:
    """Random tensors of the graph inputs' types (integers in [0, 8), for use as indices)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for node in graph.inputs:
        t = node.type
        if t.dtype.is_floating:
            x = torch.randn(t.shape, generator=generator).to(t.dtype.torch)
        elif t.dtype.torch is torch.bool:
            x = torch.randint(0, 2, t.shape, generator=generator).bool()
        else:
            x = torch.randint(0, 8, t.shape, generator=generator).to(t.dtype.torch)
        tensors.append(x)
    return tensors


def assert_identical(actual: object, expected: object) -> None:
    """Bit-for-bit equal tensors (NaN equals NaN, -0.0 differs from 0.0), or equal numbers."""
    if not isinstance(expected, torch.Tensor):
        assert type(actual) is type(expected) and actual == expected
        return
    assert isinstance(actual, torch.Tensor)
    assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
    if expected.is_floating_point():
        assert torch.equal(torch.signbit(actual), torch.signbit(expected))


def check_pass(run: Callable[[Graph], Graph], before: str, expected: str,
               constants: Mapping[str, torch.Tensor] | None = None) -> Graph:
    """Parse ``before``, run the pass, and compare the printed result with ``expected``.

    Both graphs must verify, and (unless the graph draws random numbers) compute the same
    outputs, bit for bit, on random inputs. Returns the graph the pass produced.
    """
    graph = parse_graph(before, constants)
    verify(graph)
    after = run(graph)
    verify(after)
    assert print_graph(after) == expected
    if print_graph(graph) == expected:
        assert after is graph, "a pass that changes nothing returns its input"
    if not draws_random_numbers(graph):
        for seed in range(2):
            inputs = tuple(random_inputs(graph, seed))
            for a, e in zip(run_interpreter(after, inputs), run_interpreter(graph, inputs),
                            strict=True):
                assert_identical(a, e)
    return after


def draws_random_numbers(graph: Graph) -> bool:
    return any(n.op is Op.CALL and torch.Tag.nondeterministic_seeded in n.attrs.target.tags
               for n in graph.nodes)
