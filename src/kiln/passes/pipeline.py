"""The pass pipeline: a table of contents of what kiln does to a graph, in order."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kiln import rules
from kiln.ir.graph import Graph
from kiln.ir.verify import verify
from kiln.options import Options
from kiln.passes.attention import fuse_attention
from kiln.passes.base import Pass
from kiln.passes.conv1d import conv1d_as_conv2d
from kiln.passes.conv_padding import pads_into_convolutions
from kiln.passes.cse import eliminate_common_subexpressions
from kiln.passes.dce import eliminate_dead_code
from kiln.passes.fold import fold_constants
from kiln.passes.grouped_heads import per_shared_head
from kiln.passes.layout import to_channels_last
from kiln.passes.pet import PetPass
from kiln.passes.pointwise import pointwise_as_gemm
from kiln.passes.search import SearchPass, SearchSummary, with_search
from kiln.pet.select import PetSummary
from kiln.rewrite.engine import RuleStats, TraceEvent
from kiln.rewrite.passes import RulePass

PIPELINE: tuple[Pass | RulePass | PetPass, ...] = (
    Pass("dce", eliminate_dead_code, 0, "drop what capture left unused before spending time on it"),
    Pass("cse", eliminate_common_subexpressions, 0, "merge duplicates so folding sees each once"),
    Pass("fold", fold_constants, 0, "precompute weight-only subgraphs (e.g. weight transposes)"),
    RulePass("simplify", rules.SIMPLIFY, 1, "neutral elements, moves, arithmetic: fewer nodes"),
    Pass("attention", fuse_attention, 2, "softmax(Q K^T s + M) V as the library's fused "
         "attention where measured faster; after simplify has cleaned the views around it"),
    Pass("shared.heads", per_shared_head, 2, "grouped-query attention's fused calls and "
         "matmuls read each shared key/value head, not heads repeated by a copy; after "
         "attention, which takes the chain whole where the library's fused call is faster"),
    Pass("conv1d", conv1d_as_conv2d, 2, "1-d convolutions as 2-d ones over one row, before "
         "the rules and passes made for 2-d ones (epilogues, layout, kernels) look for them"),
    RulePass("fuse.weights", rules.FOLD_INTO_WEIGHTS, 2,
             "batch norms, biases, scales into weights, before epilogues claim the convs"),
    RulePass("fuse.epilogue", rules.EPILOGUE, 2,
             "bias/residual/activation onto their contraction, before merging siblings"),
    RulePass("merge.parallel", rules.MERGE, 2, "one wide GEMM/conv per shared input"),
    PetPass(),  # Options(pet=True) only: see its `why`
    Pass("pad.conv", pads_into_convolutions, 2, "explicit symmetric zero pads (TF 'same') "
         "into the convolution's padding, before layout decides on the padded convolutions"),
    Pass("layout", to_channels_last, 2, "NHWC convolutions where measured faster (ATen's or "
         "oneDNN's, as the kernel stage may pick); after merging: merged weights convert once"),
    Pass("pointwise", pointwise_as_gemm, 2, "1x1 NHWC convolutions as GEMMs over the pixels "
         "(views around an addmm), so kiln's GEMM on packed weights competes for them"),
    RulePass("simplify.views", rules.MOVEMENT, 2, "a pointwise GEMM's result viewed back to "
             "NCHW, then to the next one's pixels, is the same matrix: the views cancel",
             searched=False),
    Pass("fold.rewritten", fold_constants, 1, "compute the weights the rules built"),
    Pass("cse.final", eliminate_common_subexpressions, 1, "rewrites can make equal nodes"),
    Pass("dce.final", eliminate_dead_code, 0, "drop the sources folding left behind"),
)


@dataclass(frozen=True)
class PassRecord:
    """One pass's run; node counts leave out weights and numbers (Graph.num_ops)."""

    name: str
    nodes_before: int
    nodes_after: int
    seconds: float
    rules: dict[str, RuleStats] = field(default_factory=dict)  # rule passes: per-rule stats
    trace: tuple[TraceEvent, ...] = ()  # rule passes: events of the traced rules
    search: SearchSummary | None = None  # the search pass: costs, rewrites, effort
    pet: PetSummary | None = None  # the PET pass, when Options.pet: mutants tried and applied


def run_pipeline(graph: Graph, options: Options,
                 passes: Sequence[Pass | RulePass | SearchPass | PetPass] = PIPELINE,
                 keep_snapshots: bool = False, trace_rules: Iterable[str] = ()
                 ) -> tuple[Graph, list[PassRecord], list[Graph]]:
    """Run every pass enabled at ``options.opt_level``; verify after each when debugging.
    With ``options.search`` other than greedy, the rule passes run as one search pass."""
    records: list[PassRecord] = []
    snapshots: list[Graph] = []
    traced = tuple(trace_rules)
    for p in with_search(tuple(passes), options):
        if options.opt_level < p.min_level:
            continue
        start = time.perf_counter()
        before = graph.num_ops()
        summary, pet = None, None
        if isinstance(p, PetPass):
            if not options.pet:
                continue
            graph, pet = p.run(graph, options)
            stats, trace = {}, ()
        elif isinstance(p, RulePass):
            result = p.rewrite(graph, options, traced)
            graph = result.graph
            stats, trace = result.stats, tuple(result.trace)
        elif isinstance(p, SearchPass):
            graph, stats, events, summary = p.search(graph, options, traced)
            trace = tuple(events)
        else:
            graph, stats, trace = p(graph, options), {}, ()
        records.append(PassRecord(p.name, before, graph.num_ops(), time.perf_counter() - start,
                                  stats, trace, summary, pet))
        if options.debug:
            verify(graph)
        if keep_snapshots:
            snapshots.append(graph)
    return graph, records, snapshots
