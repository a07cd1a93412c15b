"""Every rule in kiln.rules, checked on random instances of its pattern.

For each rule: build random examples (tests/rules/rule_examples.py), rewrite them with that
rule alone, and run both graphs through the reference interpreter on random inputs:
* exact: bit-identical results (NaNs may differ only in payload), inputs with NaN, ±inf, ±0;
* ieee: the same NaN and ±inf positions, finite values equal up to rounding, same inputs;
* fast_math: finite inputs, finite results equal within a loose tolerance.
A rule with no example fails here, so no rule can be added unchecked.
"""

from __future__ import annotations

import math
import random

import pytest
import rule_examples
import torch

from kiln.ir.graph import Graph
from kiln.ir.interp import interpret
from kiln.ir.types import DType
from kiln.ir.verify import verify
from kiln.options import Options
from kiln.rewrite import apply_rules
from kiln.rewrite.rule import EXACT, FAST_MATH, IEEE, Rule, Safety
from kiln.rules import ALL_RULES

EXAMPLES_PER_RULE = 6
INPUTS_PER_EXAMPLE = 3
SPECIALS = (math.nan, math.inf, -math.inf, 0.0, -0.0)


def random_inputs(graph: Graph, gen: torch.Generator, specials: bool) -> list[torch.Tensor]:
    inputs = []
    for node in graph.inputs:
        t = node.type
        if t.dtype in (DType.F32, DType.F64):
            x = torch.randn(t.shape, generator=gen, dtype=t.dtype.torch) * 3
            if specials and x.numel():
                flat = x.view(-1)
                picks = torch.randint(0, len(SPECIALS) * 4, (flat.numel(),), generator=gen)
                for i, value in enumerate(SPECIALS):
                    flat[picks == i] = value  # about one element in four is special
        else:
            x = torch.randint(-5, 6, t.shape, generator=gen).to(t.dtype.torch)
        inputs.append(x)
    return inputs


def assert_equivalent(before: torch.Tensor, after: torch.Tensor, safety: Safety) -> None:
    assert before.shape == after.shape and before.dtype == after.dtype
    if not before.dtype.is_floating_point:
        assert torch.equal(before, after)
        return
    nan = torch.isnan(before)
    if safety is not FAST_MATH:
        assert torch.equal(nan, torch.isnan(after)), "NaN positions differ"
    if safety is EXACT:
        bits = {torch.float32: torch.int32, torch.float64: torch.int64}[before.dtype]
        same = before.view(bits) == after.view(bits)
        assert bool((same | nan).all()), "not bit-identical"
        return
    if safety is IEEE:
        assert torch.equal(torch.isposinf(before), torch.isposinf(after)), "+inf positions differ"
        assert torch.equal(torch.isneginf(before), torch.isneginf(after)), "-inf positions differ"
    finite = torch.isfinite(before) & torch.isfinite(after)
    if not finite.any():
        return
    scale = max(1.0, before[finite].abs().max().item())
    tolerance = 1e-5 if safety is IEEE else 1e-3
    torch.testing.assert_close(after[finite], before[finite], rtol=tolerance,
                               atol=tolerance * scale)


def test_every_rule_has_examples() -> None:
    names = [r.name for r in ALL_RULES]
    assert len(names) == len(set(names)), "rule names must be unique"
    missing = sorted(set(names) - set(rule_examples.EXAMPLES))
    assert not missing, f"rules without examples in tests/rules/rule_examples.py: {missing}"
    stale = sorted(set(rule_examples.EXAMPLES) - set(names))
    assert not stale, f"examples of rules that no longer exist: {stale}"


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.name)
def test_rule_preserves_meaning(rule: Rule) -> None:
    rng = random.Random(rule.name)
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    example = rule_examples.EXAMPLES[rule.name]
    for _ in range(EXAMPLES_PER_RULE):
        graph = example(rule_examples.Example(rng))
        verify(graph)
        result = apply_rules(graph, [rule], Options(fast_math=True))
        assert result.stats[rule.name].fired >= 1, f"{rule.name} did not fire on:\n{graph}"
        verify(result.graph)
        for _ in range(INPUTS_PER_EXAMPLE):
            inputs = random_inputs(graph, gen, specials=rule.safety is not FAST_MATH)
            with torch.no_grad():
                before = interpret(graph, [t.clone() for t in inputs])
                after = interpret(result.graph, [t.clone() for t in inputs])
            for b, a in zip(before, after, strict=True):
                assert_equivalent(b, a, rule.safety)
