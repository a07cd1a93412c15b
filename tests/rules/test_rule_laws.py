"""Each hand-written rule does what its laws say: where the rule fires on a law's source,
the graph it builds computes what the law's destination computes."""

from __future__ import annotations

import pytest
import torch

from kiln.ir.interp import interpret
from kiln.options import Options
from kiln.rewrite.engine import apply_rules
from kiln.rules import ALL_RULES
from kiln.synth.instance import build, find_instances, rule_fires, sample_weights

CASES = [(rule, law) for rule in ALL_RULES for law in rule.laws]


@pytest.mark.parametrize("rule,law", CASES, ids=[law.name for _, law in CASES])
def test_the_rule_builds_what_its_law_says(rule, law) -> None:
    builts = find_instances(law, count=2, accept=lambda b: rule_fires(rule, b))
    assert builts, f"{law.name}: no instance on which {rule.name} fires"
    gen = torch.Generator().manual_seed(0)
    for built in builts:
        weights = sample_weights(law, built.instance, gen)
        full = build(law, built.instance, weights=weights)
        rewritten = apply_rules(full.src, [rule], Options(fast_math=True))
        assert rewritten.stats[rule.name].fired, f"{rule.name} did not fire on {full.src}"
        inputs = [torch.randn(n.type.shape, generator=gen).to(n.type.dtype.torch)
                  for n in full.src.inputs]
        got = interpret(rewritten.graph, inputs)
        want = interpret(full.dst, inputs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda rule: rule.name)
def test_every_law_is_proven_or_checked_and_its_tag_has_evidence(rule) -> None:
    from kiln.synth.check import Status, check_law

    for law in rule.laws:
        verdict = check_law(law, rule, time_limit_s=5)
        assert verdict.status in (Status.PROVEN, Status.CHECKED), \
            f"{law.name}: {verdict.status.value}: {verdict.detail}"
        assert verdict.tag_ok, f"{law.name}: tagged {law.safety.value}, evidence " \
            f"{verdict.evidence}: {verdict.detail}"
