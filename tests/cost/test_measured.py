"""Measured per-op costs: timed once per signature, kept in sqlite, estimates past the budget
or where an op cannot run on random operands."""

from __future__ import annotations

import math
import sqlite3

from kiln.cost import measure, measured
from kiln.cost.analytic import AnalyticCost, Roofline
from kiln.cost.measured import MeasuredCost
from kiln.ir import parse_graph
from kiln.options import Options

GRAPH = parse_graph("""graph(%a: f32[512, 512], %b: f32[512, 512], %s: f32[16], %i: i64[4]) {
  %mm = mm(%a, %b) : f32[512, 512]
  %add = add(%s, %s) : f32[16]
  %e = embedding(%a, %i) : f32[4, 512]
  return %mm, %add, %e
}""")
NODES = {n.name: n for n in GRAPH.nodes}


def _model(tmp_path, budget_s: float = 5.0) -> MeasuredCost:
    return MeasuredCost.open(Options(kernel_cache_dir=str(tmp_path)), AnalyticCost(Roofline()),
                             budget_s)


def test_an_op_is_timed_once_and_read_back_from_disk(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(measured, "STEADY", math.inf)  # keep it, however busy the machine
    monkeypatch.setattr(measure, "WAITED_MAX", math.inf)
    model = _model(tmp_path)
    mm, add = model.node_seconds(NODES["mm"]), model.node_seconds(NODES["add"])
    assert model.sources["measured"] == 2
    assert 0 < add < mm < 1.0  # a 512^3 GEMM takes longer than adding 16 numbers
    assert model.node_seconds(NODES["mm"]) == mm and model.sources["measured"] == 2
    again = _model(tmp_path)
    assert again.node_seconds(NODES["mm"]) == mm
    assert again.sources == {"measured": 0, "cached": 1, "estimated": 0}
    rows = sqlite3.connect(tmp_path / "op_times.sqlite").execute(
        "SELECT COUNT(*) FROM op_times").fetchone()
    assert rows == (2,)


def test_a_timing_whose_threads_waited_for_a_cpu_is_not_kept(tmp_path, monkeypatch) -> None:
    """`kiln.cost.contention`: another process shared the cores while the op was timed."""
    monkeypatch.setattr(measured, "STEADY", math.inf)
    monkeypatch.setattr(measure, "WAITED_MAX", -1.0)  # every timing waited more than that
    model = _model(tmp_path)
    assert model.node_seconds(NODES["add"]) > 0 and model.sources["measured"] == 1
    again = _model(tmp_path)
    again.node_seconds(NODES["add"])
    assert again.sources["measured"] == 1  # timed again, not read back


def test_timings_an_older_kiln_kept_are_forgotten(tmp_path, monkeypatch) -> None:
    """`kiln.cost.contention.CHECKED`: they were kept without the contention check."""
    from kiln.cost.contention import CHECKED

    monkeypatch.setattr(measured, "STEADY", math.inf)
    monkeypatch.setattr(measure, "WAITED_MAX", math.inf)
    _model(tmp_path).node_seconds(NODES["add"])
    with sqlite3.connect(tmp_path / "op_times.sqlite") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == CHECKED
        db.execute("PRAGMA user_version = 0")  # as a kiln before the check wrote it
    again = _model(tmp_path)
    again.node_seconds(NODES["add"])
    assert again.sources["measured"] == 1  # timed again, not read back


def test_an_unsteady_timing_is_used_but_not_kept(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(measured, "STEADY", -0.5)  # no timing is steady enough
    model = _model(tmp_path)
    assert model.node_seconds(NODES["add"]) > 0 and model.sources["measured"] == 1
    again = _model(tmp_path)
    again.node_seconds(NODES["add"])
    assert again.sources["cached"] == 0 and again.sources["measured"] == 1


def test_past_its_budget_a_model_estimates(tmp_path) -> None:
    model = _model(tmp_path, budget_s=0.0)
    assert model.node_seconds(NODES["mm"]) == AnalyticCost(Roofline()).node_seconds(NODES["mm"])
    assert model.sources["estimated"] == 1


def test_a_broken_cache_file_costs_measurements_not_the_answer(tmp_path) -> None:
    (tmp_path / "op_times.sqlite").write_bytes(b"not a database" * 100)
    model = _model(tmp_path)
    assert model.node_seconds(NODES["add"]) > 0
    assert model.sources["measured"] == 1


def test_an_op_that_runs_on_its_operands_is_timed_with_valid_indices(tmp_path) -> None:
    model = _model(tmp_path)
    assert model.node_seconds(NODES["e"]) > 0  # embedding with zero indices runs
    assert model.sources["measured"] == 1


def test_a_model_told_what_to_time_estimates_the_rest(tmp_path, monkeypatch) -> None:
    timed = []
    monkeypatch.setattr(measured, "_time_node",
                        lambda node, graph: (timed.append(node.name), (1.0, True))[1])
    model = MeasuredCost.open(Options(kernel_cache_dir=str(tmp_path)),
                              AnalyticCost(Roofline()), measures=lambda n: n.name == "mm")
    assert model.node_seconds(NODES["mm"]) == 1.0
    assert model.node_seconds(NODES["add"]) == model.analytic.node_seconds(NODES["add"]) < 1.0
    assert timed == ["mm"]
