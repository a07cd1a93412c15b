"""The rules a search may apply: the hand-written tables of the pipeline's rule passes, plus
the generated rules shipped in `kiln/synth/generated` that are proven for every shape."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

from kiln.rewrite.rule import Rule
from kiln.synth.as_rule import runnable_rules
from kiln.synth.text import parse_rules

GENERATED = Path(__file__).resolve().parent.parent / "synth" / "generated"


def search_rules(hand: Sequence[Rule], generated: bool) -> tuple[Rule, ...]:
    """``hand`` (first occurrence of each name kept) and, if ``generated``, the shipped
    generated rules; a generated rule named like a hand rule is left out."""
    rules = {r.name: r for r in hand}
    if generated:
        for rule in shipped_generated_rules():
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
