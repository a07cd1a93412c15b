"""The compile's heap freeze (`kiln.engine.heap_frozen`): the objects that exist when a compile
starts are frozen while it runs and unfrozen after it, also when it fails; a nested compile,
a caller's own freeze and a disabled collector are left as they are."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

import kiln
from kiln import engine
from kiln.engine import heap_frozen


@pytest.fixture(autouse=True)
def _nothing_frozen():
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.enable()


def test_objects_are_frozen_while_compiling_and_unfrozen_after() -> None:
    before = [object()]
    with heap_frozen():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with heap_frozen():  # (a nested compile)
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    assert gc.get_freeze_count() == 0
    with pytest.raises(ValueError), heap_frozen():
        raise ValueError("a failed compile")
    assert gc.get_freeze_count() == 0 and before


def test_a_callers_freeze_and_a_disabled_collector_are_left_alone() -> None:
    gc.freeze()
    theirs = gc.get_freeze_count()
    with heap_frozen():
        pass
    assert gc.get_freeze_count() == theirs
    gc.unfreeze()
    gc.disable()
    with heap_frozen():
        assert gc.get_freeze_count() == 0
    assert not gc.isenabled()


@pytest.mark.parametrize("how", ["kiln.compile", "torch.compile"])
def test_a_compile_runs_frozen_and_leaves_the_collector_as_it_found_it(how: str,
                                                                       monkeypatch) -> None:
    seen = []
    original = engine.run_pipeline

    def spy(*args, **kwargs):
        seen.append(gc.get_freeze_count())
        return original(*args, **kwargs)
    monkeypatch.setattr(engine, "run_pipeline", spy)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU()).eval()
    x = torch.randn(3, 6)
    compiled = kiln.compile(model, (x,)) if how == "kiln.compile" else \
        torch.compile(model, backend="kiln")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert seen and all(count > 0 for count in seen)
    assert gc.get_freeze_count() == 0 and gc.isenabled()
