"""The rule text format: every law round-trips, and bad files get one clear error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kiln.ir.ops import Op
from kiln.rewrite.law import A, AttrFnKind, C, CondKind, F, L, Lit, PVar
from kiln.rewrite.rule import EXACT, IEEE
from kiln.rules import ALL_RULES
from kiln.synth.text import RuleTextError, load_rules, parse_rules, print_law, print_rules

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules.md"


@pytest.mark.parametrize("law", [law for rule in ALL_RULES for law in rule.laws],
                         ids=lambda law: law.name)
def test_every_hand_written_law_round_trips(law) -> None:
    text = print_law(law)
    assert parse_rules(text) == [law]


def test_every_rule_states_its_laws_and_their_tags_agree() -> None:
    for rule in ALL_RULES:
        assert rule.laws, f"{rule.name} states no law"
        # a law may be stronger than its rule's tag (a family member), never weaker
        order = {"fast_math": 0, "ieee": 1, "exact": 2}
        assert all(order[law.safety.value] >= order[rule.safety.value] for law in rule.laws)


def test_a_whole_file_round_trips_with_comments_numbers_and_provenance() -> None:
    laws = [
        L("signed", A(Op.ADD, PVar("x"), Lit(-0.0)), PVar("x"), EXACT),
        L("numbers", A(Op.MUL, PVar("x"), Lit(1)), A(Op.MUL, PVar("x"), Lit(1.0)), EXACT),
        L("fn", A(Op.DIV, PVar("x"), PVar("c")), A(Op.MUL, PVar("x"),
                                                      F(AttrFnKind.INVERSE, PVar("c"))),
          IEEE, C(CondKind.FINITE_NONZERO, PVar("c"))),
    ]
    laws[0] = type(laws[0])(**{**laws[0].__dict__, "provenance": (("origin", 'say "hi"'),)})
    text = print_rules(laws, "a header\nof two lines")
    assert text.startswith("; a header\n; of two lines\n")
    back = parse_rules(text)
    assert back == laws
    assert back[1].src[0].args[1] != back[1].dst[0].args[1]  # 1 and 1.0 stay apart
    assert back[0].provenance == (("origin", 'say "hi"'),)


def test_the_documented_examples_parse_and_type_check(tmp_path) -> None:
    blocks = re.findall(r"```lisp\n(.*?)```", DOCS.read_text(), re.S)
    assert blocks
    path = tmp_path / "doc.txt"
    path.write_text(blocks[0])
    laws = load_rules(path)
    assert [law.name for law in laws] == ["mul-one", "div-const", "merge-parallel-addmm"]


@pytest.mark.parametrize("text,where,message", [
    ("(rule a (src (mull ?x 1)) (dst ?x) (safety exact))", "1:15", "unknown op 'mull'"),
    ("(rule a\n  (src (mul ?x 1)) (dst ?y) (safety exact))", "1:1",
     "?y appears in dst but not in src"),
    ("(rule a (src (mul ?x 1))\n (dst ?x) (safety exactly))", "2:19", "unknown safety"),
    ("(rule a (src (mul ?x 1)) (dst ?x) (safety exact)", "1:1", "never closed"),
    ("(rule a (src (permute :dimz (0 1) ?x)) (dst ?x) (safety exact))", "1:29",
     "permute has no attribute :dimz"),
    ("(rule a (src (mul ?x 1)) (dst ?x ?x) (safety exact))", "1:26", "same number"),
    ("(rule a (src (mul ?x 1)) (dst ?x) (safety exact) (when (prime ?x)))", "1:56",
     "unknown condition 'prime'"),
    ("(rule a (src ?x) (dst ?x) (safety exact))\n(rule a (src ?x) (dst ?x) (safety exact))",
     "2:1", "already defined on line 1"),
    ("(rule a (src (mul ?x 1)) (safety exact))", "1:1", "missing (dst ...)"),
])
def test_syntax_errors_name_line_and_column(text: str, where: str, message: str) -> None:
    with pytest.raises(RuleTextError) as err:
        parse_rules(text)
    assert f"line {where}:" in str(err.value)
    assert message in str(err.value)


def test_a_rule_whose_sides_have_different_types_is_refused_naming_its_line(tmp_path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("; ok\n(rule fine (src (relu (relu ?x))) (dst (relu ?x)) (safety exact))\n"
                    "(rule mm-swap (src (mm ?x ?w)) (dst (mm ?w ?x)) (safety fast_math))\n")
    with pytest.raises(RuleTextError) as err:
        load_rules(path)
    text = str(err.value)
    assert text.startswith(f"{path}:3:1: rule mm-swap: its sides have different types")
    assert "src gives" in text and "dst gives" in text


def test_an_attribute_without_a_default_must_be_written(tmp_path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("(rule p (src (permute ?x)) (dst ?x) (safety exact))\n")
    with pytest.raises(RuleTextError, match=r"1:14: permute needs :dims"):
        load_rules(path)


def test_a_missing_file_is_one_clear_error(tmp_path) -> None:
    with pytest.raises(RuleTextError, match="cannot read the rule file"):
        load_rules(tmp_path / "nope.txt")
