"""Laws run as rules (`kiln.synth.as_rule`): a compiled law fires where its source matches and
builds what its destination computes; attributes it leaves out must have their defaults;
conditions and the engine's type check refuse what the law does not cover."""

from __future__ import annotations

import pytest
import torch

from kiln.ir import parse_graph
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.options import Options
from kiln.rewrite.engine import apply_rules, rules_by_root, single_rewrites
from kiln.rewrite.law import EXACT, A, C, CondKind, L, Lit, PVar
from kiln.rules import ALL_RULES
from kiln.search.rules import shipped_generated_rules
from kiln.synth.as_rule import reverse, rule_from_law
from kiln.synth.instance import LawError, build, find_instances, sample_weights

X, Y, S = PVar("x"), PVar("y"), PVar("s")
HAND = [law for rule in ALL_RULES for law in rule.laws
        if len(law.src) == 1 and not any(c.kind is CondKind.GUARD for c in law.when)]
GENERATED = shipped_generated_rules()


def _fires_and_agrees(rule, law) -> None:
    builts = find_instances(law, count=2)
    assert builts, f"{law.name}: no instance"
    gen = torch.Generator().manual_seed(0)
    for built in builts:
        full = build(law, built.instance, weights=sample_weights(law, built.instance, gen))
        # one rewrite (a commuting rule applied to a fixpoint would never settle)
        moves = list(single_rewrites(full.src, rules_by_root([rule], Options(fast_math=True))))
        if not moves:  # a condition this instance misses is fine,
            continue  # but some instance must fire (checked below)
        inputs = [torch.randn(n.type.shape, generator=gen).to(n.type.dtype.torch)
                  for n in full.src.inputs]
        for got, want in zip(interpret(moves[0].graph, inputs), interpret(full.dst, inputs)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)
        return
    pytest.fail(f"{law.name}: the compiled rule fired on none of {len(builts)} instances")


@pytest.mark.parametrize("law", HAND, ids=lambda law: law.name)
def test_a_hand_written_law_compiled_as_a_rule_does_what_the_law_says(law) -> None:
    _fires_and_agrees(rule_from_law(law), law)


@pytest.mark.parametrize("rule", GENERATED[::9], ids=lambda rule: rule.name)
def test_shipped_generated_rules_fire_and_agree_with_their_laws(rule) -> None:
    _fires_and_agrees(rule, rule.laws[0])


def test_every_shipped_generated_rule_is_proven_for_every_shape_and_pruned() -> None:
    assert len(GENERATED) > 300
    for rule in GENERATED:
        proof = dict(rule.laws[0].provenance)["proof"]
        assert "every shape" in proof, rule.name
    names = {r.name for r in GENERATED}
    assert {"gen-mm-3", "gen-mm-3.reverse"} <= names  # x(w1 w2) <-> (x w1) w2


def test_a_law_that_is_an_instance_of_another_is_dropped() -> None:
    from kiln.synth.prune import drop_instances, instance_of

    w = PVar("w")
    general = L("assoc", A(Op.MM, X, A(Op.MM, Y, w)), A(Op.MM, A(Op.MM, X, Y), w), EXACT)
    special = L("assoc-same", A(Op.MM, X, A(Op.MM, Y, Y)), A(Op.MM, A(Op.MM, X, Y), Y), EXACT)
    other = L("swap", A(Op.MM, X, A(Op.MM, Y, Y)), A(Op.MM, A(Op.MM, Y, X), Y), EXACT)
    assert instance_of(special, general) and not instance_of(general, special)
    assert not instance_of(other, general)
    assert [law.name for law in drop_instances([special, general, other])] == ["assoc", "swap"]
    weaker = L("assoc-float", general.src, general.dst, EXACT, C(CondKind.FLOAT, X))
    assert not instance_of(special, weaker)  # the general law asks more: keep the instance


def test_an_attribute_the_law_leaves_out_must_have_its_default() -> None:
    law = L("div-one", A(Op.DIV, X, Lit(1)), X, EXACT)
    rule = rule_from_law(law)
    true_div = parse_graph("graph(%x: f32[4]) {\n  %c = scalar {value=1} : i64[]\n"
                           "  %d = div(%x, %c) : f32[4]\n  return %d\n}")
    trunc = parse_graph("graph(%x: f32[4]) {\n  %c = scalar {value=1} : i64[]\n"
                        "  %d = div(%x, %c) {rounding_mode='trunc'} : f32[4]\n  return %d\n}")
    assert apply_rules(true_div, [rule], Options()).stats["div-one"].fired == 1
    assert apply_rules(trunc, [rule], Options()).stats["div-one"].fired == 0


def test_conditions_are_tested_on_the_bound_values() -> None:
    law = L("mul-by-number", A(Op.MUL, X, S), A(Op.MUL, S, X), EXACT, C(CondKind.NUMBER, S))
    rule = rule_from_law(law)
    by_tensor = parse_graph("graph(%x: f32[4], %y: f32[4]) {\n  %m = mul(%x, %y) : f32[4]\n"
                            "  return %m\n}")
    assert apply_rules(by_tensor, [rule], Options()).stats[rule.name].fired == 0


def test_a_rewrite_that_would_change_the_type_does_not_fire() -> None:
    law = L("add-zero", A(Op.ADD, X, Lit(0.0)), X, EXACT)
    rule = rule_from_law(law)
    body = ("  %z = full {shape=(4,), value=0.0, dtype=f32} : f32[4]\n"
            "  %a = add(%x, %z) : f32[4]\n  return %a\n}")
    same = parse_graph("graph(%x: f32[4]) {\n" + body)
    broadcast = parse_graph("graph(%x: f32[1]) {\n" + body)
    assert apply_rules(same, [rule], Options()).stats["add-zero"].fired == 1
    assert apply_rules(broadcast, [rule], Options()).stats["add-zero"].fired == 0


def test_laws_with_guards_or_several_roots_are_refused() -> None:
    guarded = [law for rule in ALL_RULES for law in rule.laws
               if any(c.kind is CondKind.GUARD for c in law.when)]
    merged = [law for rule in ALL_RULES for law in rule.laws if len(law.src) > 1]
    for law in guarded[:3] + merged[:3]:
        with pytest.raises(LawError):
            rule_from_law(law)


def test_the_reverse_of_a_law_needs_every_variable_on_its_right_side() -> None:
    assoc = L("assoc", A(Op.ADD, A(Op.ADD, X, Y), S), A(Op.ADD, X, A(Op.ADD, Y, S)), EXACT)
    back = reverse(assoc)
    assert back is not None and back.src == assoc.dst and back.dst == assoc.src
    drop = L("mul-one", A(Op.MUL, X, Lit(1)), X, EXACT)
    assert reverse(drop) is None
    lose = L("sub-self", A(Op.SUB, X, X), A(Op.MUL, X, Lit(0)), EXACT)
    assert reverse(lose) is not None  # binds ?x on both sides: fine
