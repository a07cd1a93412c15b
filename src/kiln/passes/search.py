"""The rule passes as one cost-based search (``Options(search="backtrack")``).

The greedy pipeline runs each rule table to a fixpoint, in a fixed order, whatever a rewrite
costs. This pass instead searches (`kiln.search.backtrack`) over the same rules, plus the
rules only a search applies (`kiln.rules.SEARCH_ONLY`) and the generated rules proven for
every shape, ranked by the roofline estimate of `kiln.cost` (the grouped convolutions it
misjudges, `kiln.cost.analytic.narrow_groups`, timed instead). The
greedy result is one of the search's seeds, so the estimate never prefers a graph it ranks
below greedy's. Where the search picks a different graph, both are timed op by op on this
machine (`kiln.cost.measured`, cached on disk) when `Options.measure_kernels` is on, and the
searched graph is kept only if that measurement agrees it is faster.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from kiln.cost.analytic import AnalyticCost, Roofline, narrow_groups
from kiln.cost.graph import GraphCost
from kiln.cost.measured import MeasuredCost
from kiln.ir.graph import Graph
from kiln.options import Options
from kiln.pet.moves import PetMoves
from kiln.rewrite.engine import RuleStats, TraceEvent
from kiln.rewrite.passes import RulePass
from kiln.search.backtrack import Limits, Outcome, Step, backtrack
from kiln.search.equality import SaturationOutcome, optimize
from kiln.search.rules import search_rules
from kiln.search.saturate import SatLimits, SaturationError

LIMITS = Limits()
SAT_LIMITS = SatLimits()
ILP_SECONDS = 3.0
MARGIN = 0.98  # the searched graph must measure at most this fraction of greedy's time


@dataclass(frozen=True)
class SearchSummary:
    """What the search did, for the report and ``kiln explain``. Costs are seconds per call."""

    strategy: str
    cost_input: float  # estimated, the graph as the pass received it
    cost_greedy: float  # estimated, after the greedy rule passes
    cost_chosen: float  # estimated, the graph the pass returns
    chosen: str  # "greedy", "search" or "input"
    path: tuple[Step, ...]  # rewrites after the seed the chosen graph comes from
    seed: str
    rules: int  # rules the search could apply
    explored: int
    expanded: int
    seconds: float
    stopped: str
    measured: tuple[float, float] | None = None  # (greedy, searched) seconds, when timed
    roofline_measured: bool = False
    # saturation only: iterations, e-classes, e-nodes, e-nodes left out for their type, which
    # extraction won, and how often each rule matched
    iterations: int = 0
    classes: int = 0
    enodes: int = 0
    rejected: int = 0
    extraction: str = ""
    matched: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        text = (f"{self.strategy}: estimated {self.cost_input * 1e3:.3f} ms as received, "
                f"{self.cost_greedy * 1e3:.3f} ms greedy, {self.cost_chosen * 1e3:.3f} ms "
                f"chosen ({self.chosen}); ")
        if self.strategy == "saturate":
            text += (f"{self.iterations} iterations, {self.classes} e-classes, {self.enodes} "
                     f"e-nodes ({self.rejected} ill-typed), {self.rules} rewrites, "
                     f"{len(self.matched)} matched, extraction: {self.extraction}")
        else:
            text += (f"{self.explored} graphs costed, {self.expanded} expanded, "
                     f"{self.rules} rules")
        text += f", {self.seconds:.2f} s, stopped: {self.stopped}"
        if self.measured:
            text += (f"; measured {self.measured[0] * 1e3:.3f} ms greedy vs "
                     f"{self.measured[1] * 1e3:.3f} ms searched")
        return text


@dataclass(frozen=True)
class SearchPass:
    rule_passes: tuple[RulePass, ...]
    name: str = "search"
    min_level: int = 1
    why: str = "the rule passes' rules and the generated rules, applied by estimated cost"

    def search(self, graph: Graph, options: Options, trace: Iterable[str] = ()
               ) -> tuple[Graph, dict[str, RuleStats], list[TraceEvent], SearchSummary]:
        """The chosen graph; per-rule counts and fired events of the rewrites that made it
        (the greedy passes' for the traced rules, if it grew from greedy's result)."""
        active = [p for p in self.rule_passes if options.opt_level >= p.min_level]
        greedy, greedy_fired, greedy_trace = graph, Counter(), []
        for p in active:
            result = p.rewrite(greedy, options, trace)
            greedy = result.graph
            greedy_fired.update({k: s.fired for k, s in result.stats.items() if s.fired})
            greedy_trace.extend(e for e in result.trace if e.fired)
        rules = search_rules([r for p in active for r in p.rules],
                             generated=options.opt_level >= 2, fast_math=options.fast_math)
        roof = Roofline.of_machine(options)
        analytic = AnalyticCost(roof)
        model: AnalyticCost | MeasuredCost = analytic
        if options.measure_kernels:  # the convolutions the roofline misjudges are timed
            model = MeasuredCost.open(options, analytic, measures=narrow_groups)
        scorer = GraphCost(model)
        cost_greedy = scorer.seconds(greedy)
        extra: dict = {}
        if options.search == "saturate":
            laws = [law for r in rules for law in r.laws if r.enabled(options.fast_math)]

            def finish(g: Graph) -> Graph:
                for p in active:
                    g = p.rewrite(g, options).graph
                return g

            try:
                sat = optimize(greedy, laws, model, SAT_LIMITS, ILP_SECONDS, finish)
            except SaturationError as err:  # the greedy result serves; say why
                warnings.warn(f"kiln: equality saturation failed ({err}); the rules were "
                              "applied greedily", RuntimeWarning, stacklevel=2)
                sat = SaturationOutcome(greedy, cost_greedy, cost_greedy, f"greedy ({err})",
                                        0, "failed", 0, 0, 0, 0)
            outcome = Outcome(sat.graph, scorer.seconds(graph), sat.cost_after, (), "greedy",
                              0, 0, sat.seconds, sat.stopped)
            extra = {"iterations": sat.iterations, "classes": sat.classes,
                     "enodes": sat.enodes, "rejected": sat.rejected, "extraction": sat.chosen,
                     "matched": tuple(sorted(sat.matched.items()))}
            rule_count = sat.rules
        else:
            pet_moves = PetMoves(options) if options.pet else None  # PET: one more move
            outcome = backtrack(graph, rules, options, model, LIMITS,
                                seeds=[("greedy", greedy)], moves=pet_moves)
            rule_count = len(rules)
        chosen, graph_out, path, seed = "search", outcome.graph, outcome.path, outcome.seed
        if outcome.graph is greedy:
            chosen = "greedy"
        elif outcome.graph is graph:
            chosen = "input"
        measured = None
        if chosen != "greedy" and options.measure_kernels:
            timer = GraphCost(MeasuredCost.open(options, analytic))
            measured = (timer.seconds(greedy), timer.seconds(outcome.graph))
            if measured[1] >= MARGIN * measured[0]:
                chosen, graph_out, path, seed = "greedy", greedy, (), "greedy"
        fired = Counter(rule for rule, _ in path)
        events = [TraceEvent(rule, node, True) for rule, node in path]
        if seed == "greedy":
            fired.update(greedy_fired)
            events = greedy_trace + events
        stats = {name: RuleStats(fired=n) for name, n in sorted(fired.items())}
        summary = SearchSummary(
            options.search, outcome.cost_before, cost_greedy,
            scorer.seconds(graph_out), chosen, path, seed, rule_count, outcome.explored,
            outcome.expanded, outcome.seconds, outcome.stopped, measured, roof.measured,
            **extra)
        return graph_out, stats, events, summary


def with_search(passes: tuple, options: Options) -> tuple:
    """``passes`` with their searched rule passes replaced by one `SearchPass` where the first
    stood; unchanged for the greedy strategy. A rule pass that cleans up after later passes
    (``searched=False``: the views around the pointwise GEMMs) still runs where it stands."""
    if options.search == "greedy":
        return passes
    rule_passes = tuple(p for p in passes if isinstance(p, RulePass) and p.searched)
    out: list = []
    for p in passes:
        if not isinstance(p, RulePass) or not p.searched:
            out.append(p)
        elif p is rule_passes[0]:
            out.append(SearchPass(rule_passes, min_level=min(r.min_level for r in rule_passes)))
    return tuple(out)
