"""Verdicts and evidence: proofs, runs on special inputs, and tags that must hold."""

from __future__ import annotations

from kiln.ir.ops import Op
from kiln.rewrite.law import A, AttrFnKind, C, CondKind, F, L, Lit, PVar
from kiln.rewrite.rule import EXACT, FAST_MATH, IEEE
from kiln.rules import rule_named
from kiln.synth.check import Status, check_law

X, Y = PVar("x"), PVar("y")


def test_a_wrong_law_is_refuted_with_a_counterexample() -> None:
    verdict = check_law(L("sub-swap", A(Op.SUB, X, Y), A(Op.SUB, Y, X), FAST_MATH),
                        time_limit_s=5)
    assert verdict.status is Status.REFUTED
    assert "x" in verdict.detail and "y" in verdict.detail


def test_a_tag_stronger_than_the_evidence_is_refuted_naming_the_inputs() -> None:
    # x + 0.0 -> x holds in reals, but -0.0 + 0.0 is +0.0
    verdict = check_law(L("add-zero-exact", A(Op.ADD, X, Lit(0.0)), X, EXACT,
                          C(CondKind.FLOAT, X)), time_limit_s=5)
    assert verdict.status is Status.REFUTED
    assert verdict.evidence is FAST_MATH
    assert "tagged exact" in verdict.detail and "-0.0" in verdict.detail


def test_nan_behaviour_decides_between_ieee_and_fast_math() -> None:
    # x*0 -> 0 holds in reals, not for NaN and inf inputs
    zeros = A(Op.FULL, shape=F(AttrFnKind.SHAPE_OF, X), value=0.0,
              dtype=F(AttrFnKind.DTYPE_OF, X))
    law = L("mul-zero-ieee", A(Op.MUL, X, Lit(0.0)), zeros, IEEE, C(CondKind.FLOAT, X))
    verdict = check_law(law, time_limit_s=5)
    assert verdict.status is Status.REFUTED
    assert verdict.evidence is FAST_MATH
    assert "tagged ieee: special values differ" in verdict.detail  # -0.0*0 or NaN*0


def test_an_exact_law_is_proven_bit_identical() -> None:
    verdict = check_law(L("twice", A(Op.ADD, X, X), A(Op.MUL, X, Lit(2)), EXACT), time_limit_s=5)
    assert verdict.status is Status.PROVEN, verdict.detail
    assert verdict.evidence is EXACT and verdict.tag_ok
    assert "bit-identical" in verdict.method


def test_a_hand_rule_is_checked_on_instances_where_it_fires() -> None:
    rule = rule_named("conv-bn")
    for law in rule.laws:
        verdict = check_law(law, rule, time_limit_s=5)
        assert verdict.status in (Status.PROVEN, Status.CHECKED), verdict.detail
        assert verdict.tag_ok


def test_a_law_that_never_type_checks_is_unknown_not_proven() -> None:
    law = L("bmm-of-vectors", A(Op.BMM, X, Y), A(Op.BMM, X, Y), EXACT,
            C(CondKind.INT, X), C(CondKind.FLOAT, X))
    verdict = check_law(law, time_limit_s=2)
    assert verdict.status is Status.UNKNOWN
    assert "no small shapes" in verdict.detail
