"""Selection and the pass: each worked example applied end to end on a model and compiled by
kiln matches eager; unforced, PET keeps only what its costs say pays, within its budget."""

from __future__ import annotations

import time
import warnings

import pytest
import torch
from torch import nn

from kiln.engine import compile_graph
from kiln.frontend.export import _freeze
from kiln.frontend.importer import import_fx
from kiln.options import Options
from kiln.passes.pipeline import run_pipeline
from kiln.pet.select import PetSettings, optimize


class _Net(nn.Module):
    """Two 3x3 convolutions (the second with a residual and ReLU), pooling, a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 13)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c1(x))
        y = torch.relu(self.c2(y) + y)
        return self.fc(y.mean((2, 3)))


def _captured(batch: int, h: int, w: int):
    torch.manual_seed(0)
    model, x = _Net().eval(), torch.randn(batch, 3, h, w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.export.export(model, (x,)).run_decompositions()
    frozen, _ = _freeze(program)
    graph = import_fx(program.graph_module, frozen).graph
    optimized, _, _ = run_pipeline(graph, Options(debug=True))
    return model, x, optimized


@pytest.mark.parametrize(("batch", "h", "w", "force", "applied"), [
    (3, 6, 5, "merge_batch(h)", 2), (2, 1, 7, "merge_batch(w)", 2),
    (1, 9, 4, "split(2, 2, naive)", 2), (1, 2, 3, "split(1, 2, exact)", 3),
    (7, 4, 4, "pad(0, 8)", 1)])
def test_each_example_end_to_end_matches_eager(batch, h, w, force, applied):
    model, x, graph = _captured(batch, h, w)
    options = Options(pet=True, measure_kernels=False, debug=True)
    mutated, summary = optimize(graph, options, PetSettings(force=(force,)))
    assert [a.mutant for a in summary.applied] == [force] * applied
    assert all(a.safety == "ieee" for a in summary.applied)
    compiled = compile_graph(mutated, Options(debug=True), [0])
    for inputs in (x, torch.randn_like(x)):
        with torch.no_grad():
            torch.testing.assert_close(compiled([inputs])[0], model(inputs), rtol=1e-4,
                                       atol=1e-4)


def test_unforced_pet_keeps_only_what_pays_and_says_so():
    _, _, graph = _captured(2, 8, 8)
    start = time.perf_counter()
    result, summary = optimize(graph, Options(pet=True, measure_kernels=False))
    assert time.perf_counter() - start < 30
    assert summary.subprograms == 3 and summary.mutants > 0
    assert summary.model == "analytic"
    # the roofline gives a mutant the same work plus its copies: none pays on it
    assert summary.applied == () and result is graph
    assert sum(n for _, n in summary.rejected) == summary.mutants
    assert "3 subprograms (3 distinct)" in summary.describe() and summary.distinct == 3


def test_the_pass_runs_only_when_asked_and_is_reported():
    _, _, graph = _captured(2, 4, 4)
    _, off, _ = run_pipeline(graph, Options())
    _, on, _ = run_pipeline(graph, Options(pet=True, measure_kernels=False))
    assert "pet" not in [r.name for r in off]
    (record,) = [r for r in on if r.name == "pet"]
    assert record.pet is not None and record.pet.subprograms > 0
