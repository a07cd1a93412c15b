"""Tests for the ``kiln`` command line, through ``main(argv)`` on quick models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import kiln
from kiln.cli import main
from kiln.passes.pipeline import PIPELINE


def test_bench_prints_table_and_writes_json(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    assert main(["bench", "--models", "mlp", "--quick", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].startswith("| model ") and "| speedup " in lines[0]
    assert any(line.startswith("| mlp ") for line in lines)
    assert "mlp: done" in captured.err  # the progress bar
    document = json.loads(out.read_text())
    assert document["quick"] is True and document["opt_levels"] == [2]
    (result,) = document["results"]
    assert result["model"] == "mlp"
    assert [c["name"] for c in result["contenders"]] == ["eager", "kiln-O2"]


def test_bench_kernel_modes_are_contenders(tmp_path: Path, capsys,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kernels"))
    out = tmp_path / "bench.json"
    argv = ["bench", "--models", "bert", "--quick", "--kernels", "library", "generated",
            "--json", str(out)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("| bert -O2-library ") for line in lines)
    document = json.loads(out.read_text())
    assert document["kernels"] == ["library", "generated"]
    contenders = {c["name"]: c for c in document["results"][0]["contenders"]}
    assert list(contenders) == ["eager", "kiln-O2-library", "kiln-O2"]  # kiln-O2: the default
    assert contenders["kiln-O2"]["rel_err"] < 1e-4
    if shutil.which("cc") or shutil.which("gcc"):  # the kernels were built into the cache
        assert any((tmp_path / "kernels").rglob("*.so"))


@pytest.mark.parametrize("argv, known", [
    (["bench", "--models", "mlp,no_such_model", "--quick"], "resnet18"),
    (["bench", "--models", "mlp", "--peers", "tvm"], "inductor"),
    (["bench", "--models", "mlp", "--json", "/no/such/dir/x.json"], "no such directory"),
    (["explain", "no_such_model"], "resnet18"),
    (["explain", "mlp", "--quick", "--after", "no_such_pass"], "dce.final"),
])
def test_user_mistakes_exit_2_naming_the_known_ones(argv: list[str], known: str,
                                                    capsys) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("kiln: error: ") and known in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_explain_prints_captured_ir_and_every_pass(capsys) -> None:
    assert main(["explain", "mlp", "--quick"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("== captured: ") and "graph(" in out and "addmm" in out
    default_passes = [p for p in PIPELINE if p.min_level <= 2 and p.name != "pet"]
    for p in default_passes:
        assert f"== after {p.name}: " in out
    assert out.count("graph(") == len(default_passes) + 1


def test_explain_pet_shows_what_the_pet_pass_tried(capsys) -> None:
    assert main(["explain", "mlp", "--quick", "--pet", "--after", "pet", "--counts-only"]) == 0
    out = capsys.readouterr().out
    assert "== after pet: " in out and "pet: 3 subprograms (3 distinct)" in out


def test_explain_after_one_pass(capsys) -> None:
    assert main(["explain", "mlp", "--quick", "--after", "fold"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("== after fold: ") and out.count("== ") == 1
    assert "graph(" in out and "permute(" not in out  # folding precomputed the transposes


def test_explain_counts_only(capsys) -> None:
    assert main(["explain", "mlp", "--quick", "--counts-only"]) == 0
    out = capsys.readouterr().out
    assert "graph(" not in out and "ops (" in out and "relu: 2" in out


def test_explain_rule_says_where_it_fired_and_why_not(capsys) -> None:
    assert main(["explain", "inception", "--quick", "--rule", "merge-parallel-conv"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("rule merge-parallel-conv (ieee; root op conv_act, convolution)")
    assert "in pass merge.parallel: fired 4 time(s) at " in out
    assert "not at convolution: convolution: only 1 matching reader(s) of %x" in out


def test_explain_rule_that_does_not_run(capsys) -> None:
    assert main(["explain", "mlp", "--quick", "--rule", "mul-zero"]) == 0
    assert "not run: it is fast_math: add --fast-math" in capsys.readouterr().out
    assert main(["explain", "mlp", "--quick", "--rule", "conv-bn", "--opt-level", "1"]) == 0
    assert "no pass at opt level 1 runs it" in capsys.readouterr().out


def test_explain_unknown_rule_is_a_usage_error(capsys) -> None:
    assert main(["explain", "mlp", "--quick", "--rule", "no-such-rule"]) == 2
    err = capsys.readouterr().err
    assert "no rule named 'no-such-rule'" in err and "conv-bn" in err


def test_explain_shows_rules_fired_per_pass(capsys) -> None:
    assert main(["explain", "mlp", "--quick", "--counts-only"]) == 0
    out = capsys.readouterr().out
    assert "after fuse.epilogue" in out and "rules fired: addmm-act x2" in out


def test_version(capsys) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kiln {kiln.__version__}"


def test_no_command_is_a_usage_error(capsys) -> None:
    assert main([]) == 2
    assert "usage: kiln" in capsys.readouterr().err
