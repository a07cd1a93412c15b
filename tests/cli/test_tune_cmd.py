"""`kiln tune` and `kiln db` through ``main(argv)``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiln.cli import main
from kiln.cli.errors import UsageError
from kiln.cli.tune_cmd import parse_duration

pytest.importorskip("lightgbm")


def test_tune_records_then_db_lists_shows_exports_imports(tmp_path: Path, capsys,
                                                          monkeypatch) -> None:
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kernels"))
    db = str(tmp_path / "t.sqlite")
    assert main(["tune", "mlp", "--quick", "--trials", "2", "--jobs", "1", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "| mlp   | gemm 8x128x128 +bias, relu, B packed" in out and "3 kernels in" in out
    assert "model with it" in out  # a schedule faster alone is checked in the model
    assert main(["db", "ls", "--db", db]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert len(listing) == 2 + 3  # header, rule, one row per workload
    workload = listing[2].split("|")[1].strip()
    assert main(["db", "show", workload[:8], "--db", db]) == 0
    assert "over default" in capsys.readouterr().out  # the confirmation's paired ratios
    assert main(["db", "export", str(tmp_path / "r.jsonl"), "--db", db]) == 0
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert len(lines) == 6 and all(json.loads(line)["kind"] == "gemm" for line in lines)
    bench_json = tmp_path / "bench.json"
    assert main(["bench", "--models", "mlp", "--quick", "--tuning-db", db, "--json",
                 str(bench_json)]) == 0
    assert "| mlp -O2-tuned " in capsys.readouterr().out
    names = [c["name"] for c in json.loads(bench_json.read_text())["results"][0]["contenders"]]
    assert names == ["eager", "kiln-O2", "kiln-O2-tuned"]
    other = str(tmp_path / "other.sqlite")
    assert main(["db", "import", str(tmp_path / "r.jsonl"), "--db", other]) == 0
    assert "6 new records" in capsys.readouterr().out


def _costs(check_s: float, compile_s: float):  # noqa: ANN202 - ModelCheck.cost_s
    def cost_s(self) -> float:  # noqa: ANN001
        self.compile_s = compile_s  # (the untuned build the checks compare with)
        return check_s
    return cost_s


@pytest.mark.parametrize("check_s, compile_s", [(7200.0, 0.0), (0.0, 7200.0)])
def test_the_time_budget_keeps_time_for_the_checks(tmp_path: Path, capsys, monkeypatch,
                                                  check_s: float, compile_s: float) -> None:
    """A kernel is tuned only where the budget left holds the checks in the model too (the
    untuned build they compare with, its own check and those of the kernels before it that
    need one): with checks that would take longer than the budget, nothing is tuned; without
    a budget, the same run tunes every kernel."""
    from kiln.tune.validate import ModelCheck

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(ModelCheck, "cost_s", _costs(check_s, compile_s))
    argv = ["tune", "mlp", "--quick", "--trials", "2", "--jobs", "1"]
    assert main([*argv, "--time-budget", "1h", "--db", str(tmp_path / "a.sqlite")]) == 0
    out = capsys.readouterr().out
    assert "\n0 kernels in" in out and "3 kernels not tuned: the time budget ran out" in out
    assert main([*argv, "--db", str(tmp_path / "b.sqlite")]) == 0
    assert "\n3 kernels in" in capsys.readouterr().out


@pytest.mark.parametrize("argv, code, says", [
    (["tune"], 2, "MODEL or --all"),
    (["tune", "no_such_model"], 2, "known models"),
    (["tune", "mlp", "--time-budget", "soon"], 2, "--time-budget"),
    (["tune", "mlp", "--patience", "-1"], 2, "--patience"),
    (["db", "show", "--db", "/no/such.sqlite"], 2, "needs a workload"),
    (["db", "ls", "--db", "/no/such.sqlite"], 1, "no such tuning database"),
])
def test_mistakes(argv: list[str], code: int, says: str, capsys) -> None:
    assert main(argv) == code
    assert says in capsys.readouterr().err


def test_a_damaged_database_is_a_user_error(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not sqlite" * 50)
    assert main(["db", "ls", "--db", str(bad)]) == 1
    assert "cannot be read" in capsys.readouterr().err


def test_parse_duration() -> None:
    assert [parse_duration(t) for t in ("90s", "10m", "1.5h", "30")] == [90, 600, 5400, 30]
    with pytest.raises(UsageError):
        parse_duration("ten minutes")
