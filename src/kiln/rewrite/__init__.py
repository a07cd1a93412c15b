"""The rewrite engine: typed patterns, rules as data rows, a deterministic fixpoint driver."""

from kiln.rewrite.engine import RewriteResult, RuleStats, TraceEvent, apply_rules
from kiln.rewrite.pattern import On, Siblings, Uniform, Var
from kiln.rewrite.rule import EXACT, FAST_MATH, IEEE, Match, Rule, Safety

__all__ = ["EXACT", "FAST_MATH", "IEEE", "Match", "On", "RewriteResult", "Rule", "RuleStats",
           "Safety", "Siblings", "TraceEvent", "Uniform", "Var", "apply_rules"]
