"""The rules a search may apply: the hand-written tables of the pipeline's rule passes, plus
the generated rules shipped in `kiln/synth/generated` that are proven for every shape.

Of the generated rules, only those tagged ``exact`` run by default; with
``Options(fast_math=True)`` all of them do. A generated ``ieee`` tag rests on runs that leave
out elements where either side's float32 value and its float64 twin disagree (an
intermediate overflowed), and reassociation passes that test while changing answers the
fuzzer checks: ``(x + c) + c`` with x = -inf and c near the float32 limit is -inf, and
``x + (c + c)`` NaN (fuzz seed 8, graph 7487). Until the tag and the fuzzer's oracle agree on
overflow, such rules wait for fast math."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

from kiln.rewrite.rule import EXACT, Rule
from kiln.rules import SEARCH_ONLY
from kiln.synth.as_rule import runnable_rules
from kiln.synth.text import parse_rules

GENERATED = Path(__file__).resolve().parent.parent / "synth" / "generated"


def search_rules(hand: Sequence[Rule], generated: bool, fast_math: bool = False
                 ) -> tuple[Rule, ...]:
    """``hand`` (first occurrence of each name kept), the hand rules only a search runs
    (`kiln.rules.SEARCH_ONLY`, those ``fast_math`` enables) and, if ``generated``, the shipped
    generated rules: the exact ones, or all with ``fast_math`` (module docstring); a
    generated rule named like a hand rule is left out."""
    rules = {r.name: r for r in hand}
    for rule in SEARCH_ONLY:
        if rule.enabled(fast_math):
            rules.setdefault(rule.name, rule)
    if generated:
        for rule in shipped_generated_rules():
            if fast_math or rule.safety is EXACT:
                rules.setdefault(rule.name, rule)
    return tuple(rules.values())


@functools.cache
def shipped_generated_rules() -> tuple[Rule, ...]:
    """Parsed without re-checking: `kiln synth verify` checked these files when they were
    generated, and a test proves them again."""
    rules: list[Rule] = []
    for path in sorted(GENERATED.glob("*.txt")):
        rules.extend(runnable_rules(parse_rules(path.read_text(), str(path))))
    return tuple(rules)
