"""Cost-based selection: a mutant plus its corrections replaces a subprogram only where it is
faster, and only once it is shown correct (PET, Wang et al., OSDI'21, section 7).

    graph, summary = optimize(graph, options)          # Options(pet=True) runs it as a pass
    summary.describe()

For each subprogram (`split`), most expensive first, each mutant (`mutate`) is costed without
its corrections first; one that is not cheaper than the original even so is dropped before
any testing. The others get their differing boxes (`regions`) and corrections (`correct`), and
are costed again with the corrections. The cost model times each op signature on this machine
(`kiln.cost.measured`, cached on disk) when ``Options.measure_kernels`` is on, else it is the
roofline estimate. The cheapest corrected mutant is taken when it costs at most `MARGIN` of
the original. With ``measure_kernels`` on, that choice is then timed against the original as
whole programs, side by side (interleaved), and the measurement decides: one noisy per-op
timing must not make a mutant look 100x faster.

Before a mutant is used, both programs run on float inputs (the real weights) twice: random
values, then the same with NaN, +inf, -inf and -0.0 placed in the inputs. Results must agree
to float tolerance with NaN and infinities in the same places; a mutant that fails is tagged
``fast_math`` and applies only with ``Options.fast_math``. (Weights stay finite: a constant
weight holding inf could turn an explicit zero pad into NaN where the library skips the
padded terms.) Identical subprograms (the same block repeated) are decided once.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.cost.analytic import AnalyticCost, Roofline
from kiln.cost.graph import GraphCost
from kiln.cost.measure import Budget, interleaved
from kiln.cost.measured import MeasuredCost
from kiln.ir.graph import Graph, Node, Value, substitute
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.options import Options
from kiln.pet.correct import NoRegion, corrected
from kiln.pet.mutate import MAX_MUTANTS, Mutant, mutants
from kiln.pet.regions import Regions, differing_regions
from kiln.pet.split import MAX_OPS, Subprogram, split_program

__all__ = ["Applied", "PetSettings", "PetSummary", "optimize", "parented", "structure",
           "verify_mutant"]

MARGIN = 0.95  # a replacement must cost at most this fraction of the original
MAX_FRACTION = 0.5  # a mutant wrong on more of its output than this is not corrected
_TIMING = Budget(min_rounds=5, max_rounds=7, cap_s=1.0, min_sample_s=1e-3, settle_calls=1,
                 collect_first=False)


@dataclass(frozen=True)
class PetSettings:
    max_ops: int = MAX_OPS
    max_mutants: int = MAX_MUTANTS
    seconds: float = 25.0  # search budget per graph; then the rest is left as it is
    measure_s: float = 10.0  # of it, at most this much timing new op signatures
    # mutant names (or prefixes) to apply whatever the cost says, once shown correct: for
    # tests and for demonstrating a transformation end to end
    force: tuple[str, ...] = ()


@dataclass(frozen=True)
class Applied:
    subprogram: str
    mutant: str
    boxes: int  # corrected regions
    differing: float  # fraction of the output the corrections recompute
    cost_before: float  # seconds (model)
    cost_after: float  # seconds (model), corrections included
    correction: float  # seconds (model) of the correction nodes alone
    measured: tuple[float, float] | None  # (original, replacement) seconds, when timed
    safety: str  # "ieee" or "fast_math"
    forced: bool = False


@dataclass(frozen=True)
class PetSummary:
    subprograms: int = 0
    distinct: int = 0  # subprogram structures decided (a repeated block is decided once)
    mutants: int = 0  # generated, over the distinct subprograms
    analyzed: int = 0  # region analysis run (the others were not cheaper even uncorrected)
    correct: int = 0  # corrected and shown correct
    applied: tuple[Applied, ...] = ()
    rejected: tuple[tuple[str, int], ...] = ()  # reason -> count
    seconds: float = 0.0
    stopped: str = "done"  # or "time"
    model: str = "analytic"

    def describe(self) -> str:
        text = (f"pet: {self.subprograms} subprograms ({self.distinct} distinct), "
                f"{self.mutants} mutants, "
                f"{self.analyzed} tested, {self.correct} correct, {len(self.applied)} applied "
                f"({self.model} costs, {self.seconds:.2f} s, {self.stopped})")
        for a in self.applied:
            measured = ""
            if a.measured:
                measured = (f", measured {a.measured[0] * 1e3:.3f} -> "
                            f"{a.measured[1] * 1e3:.3f} ms")
            text += (f"\n  {a.mutant} on {a.subprogram}: {a.boxes} boxes corrected "
                     f"({a.differing:.1%} of the output), {a.cost_before * 1e3:.3f} -> "
                     f"{a.cost_after * 1e3:.3f} ms (corrections {a.correction * 1e3:.3f} ms)"
                     f"{measured}, {a.safety}{', forced' if a.forced else ''}")
        return text


@dataclass
class _Choice:
    name: str
    fixed: Graph
    cost: float
    correction: float
    boxes: int
    differing: float
    forced: bool
    measured: tuple[float, float] | None = None
    safety: str = "ieee"
    cost_before: float = 0.0  # the original's, under the same model


@dataclass
class _State:
    options: Options
    settings: PetSettings
    scorer: GraphCost
    start: float
    counts: Counter = field(default_factory=Counter)
    decided: dict[Any, _Choice | None] = field(default_factory=dict)


def optimize(graph: Graph, options: Options, settings: PetSettings = PetSettings()
             ) -> tuple[Graph, PetSummary]:
    start = time.perf_counter()
    analytic = AnalyticCost(Roofline.of_machine(options))
    model: Any = analytic
    if options.measure_kernels:
        model = MeasuredCost.open(options, analytic, settings.measure_s)
    state = _State(options, settings, GraphCost(model), start)
    subs = split_program(graph, settings.max_ops)
    # ordered by the roofline estimate, so that measuring is spent on the subprograms decided
    estimate = GraphCost(analytic)
    costs = {id(s): estimate.seconds(_as_graph(s.nodes, s.outputs)) for s in subs}
    applied: list[Applied] = []
    mapping: dict[Value, Value] = {}
    stopped = "done"
    for sub in sorted(subs, key=lambda s: -costs[id(s)]):
        if time.perf_counter() - start > settings.seconds:
            stopped = "time"
            break
        key = structure(sub)
        if key not in state.decided:
            cost_before = state.scorer.seconds(_as_graph(sub.nodes, sub.outputs))
            state.decided[key] = _decide(sub, cost_before, state)
        choice = state.decided[key]
        if choice is None or (choice.safety == "fast_math" and not options.fast_math):
            continue
        values = parented(sub, choice.fixed)
        mapping.update(zip(sub.outputs, values))
        applied.append(Applied(sub.describe(), choice.name, choice.boxes, choice.differing,
                               choice.cost_before, choice.cost, choice.correction, choice.measured,
                               choice.safety, choice.forced))
    if mapping:
        graph = substitute(graph, mapping)
    counts = state.counts
    rejected = tuple(sorted((k, v) for k, v in counts.items() if k.startswith("rejected:")))
    summary = PetSummary(len(subs), len(state.decided), counts["mutants"], counts["analyzed"],
                         counts["correct"], tuple(applied), rejected,
                         time.perf_counter() - start, stopped, getattr(model, "name", "analytic"))
    return graph, summary


def _decide(sub: Subprogram, cost_before: float, state: _State) -> _Choice | None:
    """The best corrected mutant of ``sub`` that pays (or is forced), or None."""
    found = mutants(sub, state.settings.max_mutants)
    state.counts["mutants"] += len(found)
    best: _Choice | None = None
    for mutant in found:
        if time.perf_counter() - state.start > state.settings.seconds:
            break
        forced = any(mutant.name.startswith(f) for f in state.settings.force)
        bare = state.scorer.seconds(_as_graph(_nodes_of(sub, mutant.graph)))
        if not forced and bare > MARGIN * cost_before:
            state.counts["rejected: slower before correction"] += 1
            continue
        state.counts["analyzed"] += 1
        checked = verify_mutant(sub, mutant)
        if isinstance(checked, str):
            state.counts[f"rejected: {checked}"] += 1
            continue
        fixed, regions, safety = checked
        state.counts["correct"] += 1
        cost = state.scorer.seconds(_as_graph(_nodes_of(sub, fixed)))
        choice = _Choice(mutant.name, fixed, cost, max(0.0, cost - bare),
                         sum(len(b) for b in regions.boxes), regions.fraction, forced,
                         safety=safety, cost_before=cost_before)
        if not forced and (cost > MARGIN * cost_before or (best and cost >= best.cost)):
            state.counts["rejected: slower with corrections"] += 1
            continue
        if forced:
            return choice
        best = choice
    if best is not None and state.options.measure_kernels:
        best.measured = _time_pair(sub, best.fixed)
        if best.measured[1] > MARGIN * best.measured[0]:
            state.counts["rejected: measured slower"] += 1
            return None
    return best


def verify_mutant(sub: Subprogram, mutant: Mutant) -> tuple[Graph, Regions, str] | str:
    """The mutant with its corrections, its regions and its safety tag ("ieee" or
    "fast_math"); or why it cannot be used."""
    regions = differing_regions(sub.graph, mutant.graph)
    if regions is None or regions.fraction > MAX_FRACTION:
        return "wrong on too much of the output"
    try:
        fixed = corrected(sub.graph, mutant.graph, regions.boxes)
    except NoRegion:
        return "no correction"
    if not _agrees(sub, fixed, specials=False):
        return "wrong on float inputs"  # the regions said equal: a bug, never used
    return fixed, regions, "ieee" if _agrees(sub, fixed, specials=True) else "fast_math"


def _nodes_of(sub: Subprogram, standalone: Graph) -> list[Node]:
    """The nodes ``standalone`` would add to the parent graph, its inputs bound to the
    subprogram's operands (so weight-only nodes are recognized and not costed)."""
    values = parented(sub, standalone)
    seen: set[Node] = set()
    nodes: list[Node] = []
    stack = [v.node for v in values]
    inputs = {v.node for v in sub.inputs}
    while stack:
        node = stack.pop()
        if node in seen or node in inputs or node.op is Op.INPUT:
            continue
        seen.add(node)
        nodes.append(node)
        stack.extend(v.node for v in node.inputs)
    return nodes


def _as_graph(nodes, outputs=()) -> Graph:
    return Graph([], list(nodes), list(outputs))


def parented(sub: Subprogram, standalone: Graph) -> list[Value]:
    """``standalone``'s outputs rebuilt over the parent graph's values."""
    env: dict[Value, Value] = {n.out(): v for n, v in zip(standalone.inputs, sub.inputs)}
    for node in standalone.nodes:
        if node.op is Op.SCALAR:
            continue
        inputs = [env.get(v, v) for v in node.inputs]
        new = Node(node.op, inputs, node.attrs, node.types, node.name)
        env.update(zip(node.outputs, new.outputs))
    return [env.get(v, v) for v in standalone.outputs]


def structure(sub: Subprogram) -> tuple:
    """Equal for subprograms with the same ops, attributes and types (names ignored)."""
    index: dict[Value, int] = {n.out(): i for i, n in enumerate(sub.graph.inputs)}
    rows = []
    for k, node in enumerate(sub.graph.nodes):
        operands = tuple(index.get(v, ("scalar", getattr(v.node.attrs, "value", None)))
                         for v in node.inputs)
        rows.append((node.op, node.attrs, node.types, operands))
        index[node.out()] = len(sub.graph.inputs) + k
    inputs = tuple((n.type, i in sub.constant_inputs) for i, n in enumerate(sub.graph.inputs))
    return inputs, tuple(rows), tuple(index[v] for v in sub.graph.outputs)


def _float_inputs(sub: Subprogram, specials: bool, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    inputs = []
    for i, (node, value) in enumerate(zip(sub.graph.inputs, sub.inputs)):
        if i in sub.constant_inputs:
            inputs.append(sub.parent.constant(value.node))
            continue
        t = torch.randn(node.type.shape, generator=gen).to(node.type.dtype.torch)
        if specials and t.numel() >= 4:
            flat = t.view(-1)
            where = torch.randperm(flat.numel(), generator=gen)[:max(4, flat.numel() // 64)]
            values = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
            flat[where] = values[torch.arange(where.numel()) % 4].to(t.dtype)
        inputs.append(t)
    return inputs


def _agrees(sub: Subprogram, fixed: Graph, specials: bool) -> bool:
    inputs = _float_inputs(sub, specials)
    with torch.no_grad():
        want = interpret(sub.graph, inputs)
        got = interpret(fixed, inputs)
    for w, g in zip(want, got):
        if w.shape != g.shape or w.dtype != g.dtype:
            return False
        if not torch.equal(torch.isnan(w), torch.isnan(g)):
            return False
        inf = torch.isinf(w)
        if not torch.equal(inf, torch.isinf(g)) or not torch.equal(w[inf], g[inf]):
            return False
        finite = torch.isfinite(w)
        scale = float(w[finite].abs().max()) if bool(finite.any()) else 1.0
        if not torch.allclose(w[finite], g[finite], rtol=1e-4, atol=1e-4 * max(scale, 1.0)):
            return False
    return True


def _time_pair(sub: Subprogram, fixed: Graph) -> tuple[float, float]:
    inputs = _float_inputs(sub, specials=False, seed=1)
    with torch.no_grad():
        timings = interleaved([lambda: interpret(sub.graph, inputs),
                               lambda: interpret(fixed, inputs)], _TIMING)
    return timings[0].median_s, timings[1].median_s
