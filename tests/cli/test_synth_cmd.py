"""kiln rules print|check and kiln synth verify, through the command line."""

from __future__ import annotations

import json

from kiln.cli import main
from kiln.rules import ALL_RULES
from kiln.synth.text import load_rules


def test_rules_print_writes_every_law_in_a_file_that_loads(tmp_path) -> None:
    path = tmp_path / "rules.txt"
    assert main(["rules", "print", "-o", str(path)]) == 0
    laws = load_rules(path)
    assert [law.name for law in laws] == [law.name for r in ALL_RULES for law in r.laws]


def test_rules_check_prints_a_verdict_per_law_and_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "verdicts.json"
    assert main(["rules", "check", "--rule", "mul-one", "add-zero", "--time-limit", "5",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "mul-one" in text and "add-zero" in text and "2 laws: 2 proven" in text
    verdicts = json.loads(out.read_text())
    assert [(v["rule"], v["tag"], v["verdict"]) for v in verdicts] == [
        ("mul-one", "exact", "proven"), ("add-zero", "fast_math", "proven")]


def test_synth_verify_refutes_a_wrong_rule_with_exit_code_1(tmp_path, capsys) -> None:
    path = tmp_path / "mine.txt"
    path.write_text("(rule relu-add (src (relu (add ?x ?y))) (dst (add (relu ?x) (relu ?y)))\n"
                    "  (safety fast_math))\n"
                    "(rule double (src (add ?x ?x)) (dst (mul ?x 2)) (safety exact))\n")
    assert main(["synth", "verify", str(path), "--time-limit", "5"]) == 1
    text = capsys.readouterr().out
    assert "relu-add" in text and "refuted" in text
    assert "double" in text and "1 proven" in text and "1 refuted" in text


def test_a_bad_rule_file_is_a_usage_error_naming_the_line(tmp_path, capsys) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("\n(rule a (src (mull ?x 1)) (dst ?x) (safety exact))\n")
    assert main(["synth", "verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2:15: unknown op 'mull'" in err
    assert "Traceback" not in err


def test_an_unknown_rule_name_is_a_usage_error(capsys) -> None:
    assert main(["rules", "check", "--rule", "no-such-rule"]) == 2
    assert "no rule named 'no-such-rule'" in capsys.readouterr().err


def test_synth_generate_writes_a_rule_file_that_loads(tmp_path, capsys) -> None:
    path = tmp_path / "gen.txt"
    assert main(["synth", "generate", "--max-ops", "2", "--ops", "add,mm,transpose",
                 "-o", str(path)]) == 0
    err = capsys.readouterr().err
    assert "prove" in err and f"written to {path}" in err
    laws = load_rules(path)
    assert laws and all(law.name.startswith("gen-") for law in laws)
    assert all(dict(law.provenance)["origin"] == "generated" for law in laws)


def test_synth_generate_refuses_an_unknown_op(tmp_path, capsys) -> None:
    assert main(["synth", "generate", "--ops", "add,fft", "-o", str(tmp_path / "x")]) == 2
    assert "unknown op 'fft'" in capsys.readouterr().err
