"""``kiln fuzz`` and ``kiln explain --ir``: exit codes, the summary, processes, reproducers."""

from __future__ import annotations

import json

import pytest
import torch
from planted_bugs import maximum_becomes_minimum, real_pipeline

import kiln.engine
from kiln import cli
from kiln.fuzz.case import Case, FuzzInput
from kiln.fuzz.repro import write_repro
from kiln.ir import parse_graph

MAXIMUM = """graph(%x0: f32[3], %x1: f32[3]) {
  %m = maximum(%x0, %x1) : f32[3]
  return %m
}
"""


def test_fuzz_runs_over_processes_and_writes_a_json_summary(tmp_path, capsys):
    summary = tmp_path / "fuzz.json"
    code = cli.main(["fuzz", "--graphs", "6", "--jobs", "2", "--seed", "4", "--configs",
                     "O0,O1", "--out", str(tmp_path / "out"), "--json", str(summary),
                     "--quiet"])
    assert code == 0
    assert "6 graphs" in capsys.readouterr().out
    data = json.loads(summary.read_text())
    assert data["graphs"] == 6 and not data["failures"] and data["settings"]["jobs"] == 2
    # which worker takes a graph is the scheduler's choice: the first one up may take all six
    # (it did once, under load), so one or two processes ran graphs
    assert data["processes"] in (1, 2)
    assert set(data["configs"]) == {"O0", "O1"}


def test_fuzz_exits_1_and_writes_a_reproducer_on_a_failure(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kiln.engine, "run_pipeline", maximum_becomes_minimum)
    out = tmp_path / "out"
    code = cli.main(["fuzz", "--graphs", "120", "--jobs", "0", "--seed", "11", "--configs",
                     "O1", "--out", str(out), "--quiet"])
    assert code == 1
    text = capsys.readouterr().out
    assert "FAIL graph" in text and "mismatch" in text
    shrunk = [p for p in out.glob("*.kir") if not p.stem.endswith("-original")]
    assert shrunk and all(p.with_suffix(".pt").exists() for p in shrunk)
    assert cli.main(["explain", "--ir", str(shrunk[0]), "--check", "--counts-only"]) == 1
    monkeypatch.setattr(kiln.engine, "run_pipeline", real_pipeline)
    assert cli.main(["explain", "--ir", str(shrunk[0]), "--check", "--counts-only"]) == 0


def test_explain_ir_shows_the_passes_and_checks(tmp_path, capsys):
    graph = parse_graph(MAXIMUM)
    case = Case(graph, (FuzzInput(torch.tensor([1.0, float("nan"), -0.0])),
                        FuzzInput(torch.tensor([2.0, 0.0, 0.0]))))
    kir = write_repro(case, tmp_path / "m", "a note")
    assert cli.main(["explain", "--ir", str(kir), "--check"]) == 0
    out = capsys.readouterr().out
    assert "a note" in out and "after dce" in out and "maximum(%x0, %x1)" in out
    assert "O3+kernels" in out and "agrees" in out
    bare = tmp_path / "bare.kir"  # no data file: random inputs
    bare.write_text(MAXIMUM)
    assert cli.main(["explain", "--ir", str(bare), "--check"]) == 0


@pytest.mark.parametrize("argv", [
    ["explain"],
    ["explain", "mlp", "--ir", "x.kir"],
    ["explain", "mlp", "--check"],
    ["explain", "--ir", "/nonexistent/x.kir"],
    ["fuzz", "--configs", "O9"],
    ["fuzz", "--kernel-every", "0"],
    ["fuzz", "--ops", "frobnicate"],
    ["fuzz", "--ops", "call,input"],  # (a source: made as an operand, never chosen)
])
def test_usage_errors_exit_2(argv, capsys):
    assert cli.main(argv) == 2
    assert "kiln: error:" in capsys.readouterr().err


def test_explain_ir_rejects_text_that_is_not_a_graph(tmp_path, capsys):
    bad = tmp_path / "bad.kir"
    bad.write_text("graph(%x: f32[2]) {\n  %y = frobnicate(%x) : f32[2]\n  return %y\n}\n")
    assert cli.main(["explain", "--ir", str(bad)]) == 2
    assert "not a valid kiln graph" in capsys.readouterr().err


def test_fuzz_help_has_an_example(capsys):
    assert cli.main(["fuzz", "--help"]) == 0
    assert "example: kiln fuzz" in capsys.readouterr().out


def test_the_time_limit_stops_handing_out_graphs(tmp_path, capsys):
    summary = tmp_path / "fuzz.json"
    code = cli.main(["fuzz", "--graphs", "100000", "--jobs", "1", "--time-limit", "2",
                     "--configs", "O0", "--out", str(tmp_path), "--json", str(summary),
                     "--quiet"])
    assert code == 0
    data = json.loads(summary.read_text())
    assert 0 < data["graphs"] < 100000 and data["seconds"] < 60
