"""kiln's rule tables, one theory per module, grouped into the sets the pipeline runs."""

from __future__ import annotations

from kiln.rewrite.rule import Rule
from kiln.rules import (
    arith,
    broadcast,
    constants,
    epilogue,
    fusion,
    idioms,
    matmul,
    merge,
    movement,
    neutral,
    regroup,
)

# local algebra: each rewrite is cheaper or equal, and the set has no cycles; the idioms
# before arith, whose div-const would otherwise take hardswish's division first
SIMPLIFY: tuple[Rule, ...] = (neutral.RULES + movement.RULES + idioms.RULES + arith.RULES
                              + constants.RULES + broadcast.RULES + matmul.RULES)
# batch norms, biases and scales into weights; with SIMPLIFY so that scales can travel
FOLD_INTO_WEIGHTS: tuple[Rule, ...] = fusion.RULES + SIMPLIFY
EPILOGUE: tuple[Rule, ...] = epilogue.RULES
MERGE: tuple[Rule, ...] = merge.RULES
# chains of views and permutes alone: the late passes' (layout, pointwise) leave some
MOVEMENT: tuple[Rule, ...] = movement.RULES

# rewrites that pay only at some shapes: the cost-based search tries them, no greedy pass
SEARCH_ONLY: tuple[Rule, ...] = regroup.RULES

ALL_RULES: tuple[Rule, ...] = tuple({r.name: r for r in SIMPLIFY + FOLD_INTO_WEIGHTS + EPILOGUE
                                     + MERGE + SEARCH_ONLY}.values())


def rule_named(name: str) -> Rule:
    for rule in ALL_RULES:
        if rule.name == name:
            return rule
    known = ", ".join(sorted(r.name for r in ALL_RULES))
    raise KeyError(f"no rule named {name!r}; rules: {known}")


def rule_of_law(name: str) -> Rule | None:
    """The hand-written rule that states the law named ``name`` (a rule file's guards refer
    to it), or None."""
    for rule in ALL_RULES:
        if any(law.name == name for law in rule.laws):
            return rule
    return None
