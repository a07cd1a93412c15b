"""The engine both frontends share: optimize a captured graph and make it runnable."""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kiln.ir.graph import Graph, Node
from kiln.ir.ops import Op
from kiln.ir.verify import verify
from kiln.kernels.build import build_kernels
from kiln.kernels.contractions import build_contraction_kernels, contraction_groups
from kiln.kernels.decide import Decisions
from kiln.kernels.outcome import Built, KernelBuild, Skipped
from kiln.options import Options
from kiln.passes.partition import KernelGroup, alone, gather, partition
from kiln.passes.pipeline import PIPELINE, run_pipeline
from kiln.report import GraphReport, KernelInfo
from kiln.report.details import GraphDetails, planned_buffers, steps_of
from kiln.report.on_compile import write_after_compile
from kiln.report.profile import profile_graph
from kiln.rewrite.passes import RulePass
from kiln.runtime.executor import Fallbacks, build_executor
from kiln.runtime.memory import FusedCall, MemoryPlan, plan_memory
from kiln.runtime.scatters import written_in_place

GENERATED_KERNELS_LEVEL = 2  # below it every op is a library call, whatever the Options say
# traced so that the report can say where each rule fired (only the firings are kept)
PIPELINE_RULES = tuple(r.name for p in PIPELINE if isinstance(p, RulePass) for r in p.rules)


@dataclass(frozen=True)
class KernelStage:
    """One row of the kernel table: which groups it takes, and how it builds them."""

    name: str
    wanted: Callable[[Options], bool]
    groups: Callable[[Graph], list[KernelGroup]]
    build: Callable[[Graph, Sequence[KernelGroup], Options, Decisions], KernelBuild]


# After the pipeline, in order; a node taken by one stage is not offered to the next.
KERNEL_STAGES: tuple[KernelStage, ...] = (
    # elementwise and row chains: memory-bound, so fusing them saves whole passes over memory
    KernelStage("rows and loops", lambda o: o.generated_kernels, partition, build_kernels),
    # GEMMs and convolutions: compute-bound; each runs the fastest of its ATen call, kiln's
    # generated GEMM on packed weights and oneDNN on reordered weights, measured on its shapes
    KernelStage("contractions", lambda o: o.generated_gemm or o.prepacked_library,
                contraction_groups, build_contraction_kernels),
)


@dataclass
class CompiledGraph:
    """A graph ready to run: call it with the boxed argument list, get the outputs."""

    graph: Graph  # after optimization
    captured: Graph  # as imported
    plan: MemoryPlan | None
    source: str  # the generated executor
    report: GraphReport
    run: Any  # (args: list) -> list

    def __call__(self, args: list[Any]) -> list[Any]:
        return self.run(args)


def compile_graph(graph: Graph, options: Options, input_positions: Sequence[int],
                  opaque_ops: Sequence[str] = (), started: float | None = None) -> CompiledGraph:
    start = time.perf_counter() if started is None else started
    if options.debug:
        verify(graph)
    optimized, records, _ = run_pipeline(graph, options, trace_rules=PIPELINE_RULES)
    records = [replace(r, trace=tuple(e for e in r.trace if e.fired)) for r in records]
    built = build_kernels_for(optimized, options)
    kernels = built.kernels
    if kernels:
        optimized = gather(optimized, [k.group for k in kernels])
    calls = [fused_call(k) for k in kernels]
    writes = written_in_place(optimized, calls)
    plan = plan_memory(optimized, calls, writes) if options.memory_plan else None
    fallbacks = Fallbacks()
    run, source = build_executor(optimized, plan, input_positions, kernels,
                                 fallbacks=fallbacks, writes=writes)
    step_of_node = steps_of(optimized, [k.group.nodes for k in kernels])
    details = GraphDetails(
        graph, optimized, step_of_node, planned_buffers(optimized, plan, step_of_node),
        plan.arena_bytes if plan else 0, functools.partial(profile_graph, optimized, plan,
                                                           tuple(kernels), writes=writes),
        fallbacks=fallbacks.counts)
    report = GraphReport(
        nodes_before=graph.num_ops(), nodes_after=optimized.num_ops(), passes=tuple(records),
        ops=optimized.op_counts(), opaque_ops=tuple(opaque_ops),
        planned_peak_bytes=plan.arena_bytes if plan else 0,
        intermediate_bytes=plan.intermediate_bytes if plan else 0,
        planned_bytes=plan.planned_bytes if plan else 0,
        compile_seconds=time.perf_counter() - start,
        planned_peak_bytes_before=plan_memory(graph).arena_bytes if plan else 0,
        kernels=kernel_infos(optimized, kernels, built.skipped, writes),
        packed_weight_bytes=sum(t.numel() * t.element_size() for k in kernels
                                for t in k.weights.values()) + sum(
            k.kernel.packed_bytes for k in kernels if not k.generated),  # type: ignore
        details=details)
    if options.report:
        write_report_file(report, options.report)
    return CompiledGraph(optimized, graph, plan, source, report, run)


def write_report_file(report: GraphReport, path: str) -> None:
    """``Options(report=path)``: the page of this graph, next to the earlier graphs' pages of
    this process (`kiln.report.on_compile`). A page that cannot be drawn is one warning: the
    compiled graph is fine without it."""
    try:
        write_after_compile(report, path)
    except Exception as err:  # noqa: BLE001 - no report failure may fail a compile
        warnings.warn(f"kiln: could not write the report {path!r} ({type(err).__name__}: "
                      f"{err}); the model compiled normally", RuntimeWarning, stacklevel=2)


def build_kernels_for(graph: Graph, options: Options) -> KernelBuild:
    """Every stage of `KERNEL_STAGES` the options ask for, in order."""
    result = KernelBuild()
    if options.opt_level < GENERATED_KERNELS_LEVEL:
        return result
    decisions = Decisions.open(options)
    for stage in KERNEL_STAGES:
        if stage.wanted(options):
            taken = {n for k in result.kernels for n in k.group.nodes}
            groups = [g if not taken & set(g.nodes) else alone(graph, g)  # (a GEMM whose
                      for g in stage.groups(graph) if g.last not in taken]  # bias was taken)
            done = stage.build(graph, groups, options, decisions)
            result.kernels += done.kernels
            result.skipped += done.skipped
    return result


def fused_call(kernel: Built) -> FusedCall:
    nodes = kernel.group.nodes
    internal = frozenset(v for n in nodes for v in n.outputs if v not in kernel.outputs)
    return FusedCall(nodes, kernel.inputs, kernel.outputs, internal, kernel.generated)


IN_PLACE = "written into its base's memory, which nothing reads after it (kiln.runtime.scatters)"


def kernel_infos(graph: Graph, kernels: Sequence[Built], skipped: Sequence[Skipped] = (),
                 writes: frozenset[Node] = frozenset()) -> tuple[KernelInfo, ...]:
    """One KernelInfo per generated kernel and per remaining computing node, in run order,
    each with the decision that put it there."""
    member_of = {n: k for k in kernels for n in k.group.nodes}
    why_not = {n: str(s) for s in skipped for n in s.group.nodes}
    why_not.update((n, IN_PLACE) for n in writes)
    infos = []
    for node in graph.nodes:
        k = member_of.get(node)
        if k is None and node.op not in (Op.CONSTANT, Op.SCALAR):
            infos.append(KernelInfo("library", (node.op.text,), nodes=(node.name,),
                                    decision=why_not.get(node, "")))
        elif k is not None and node is k.group.last:
            nodes = k.group.nodes
            kind = "generated" if k.generated else "prepacked"
            schedule = "tuned" if k.plan is not None and k.plan.trace.decisions() else ""
            label = f"{kind} ({schedule})" if schedule else kind
            decision = f"{label}, measured {k.measured}" if k.measured else label
            if k.run_if is not None:  # (say when the library calls run instead)
                test = getattr(k.run_if[0], "func", k.run_if[0])
                decision += f"; runs where {test.__name__} holds, else the library calls"
            if k.library_where_not_finite:
                decision += "; the library calls run again where its output is not finite"
            infos.append(KernelInfo(kind, tuple(n.op.text for n in nodes), k.source,
                                    k.trace, tuple(n.name for n in nodes), decision))
    return tuple(infos)
