"""The compile report: one GraphReport per compiled graph, summed in a CompileReport."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kiln.passes.pipeline import PassRecord
from kiln.report.details import GraphDetails


@dataclass(frozen=True)
class KernelInfo:
    """One kernel of a compiled graph: a generated kernel for a group of nodes, or the library
    (ATen) call of one node."""

    kind: str  # "generated" or "library"
    ops: tuple[str, ...]  # kiln op names of the nodes it covers, in order
    source: str | None = None  # generated: the C source
    trace: str | None = None  # generated: the schedule (a replayable trace, or the template)
    nodes: tuple[str, ...] = ()  # the node names, in order
    # why this kernel and not the other: the measured times of both, or why no generated
    # kernel stands for these nodes ("" where nothing was tried)
    decision: str = ""

    def __str__(self) -> str:
        covered = ", ".join(f"{n} ({o})" for n, o in zip(self.nodes, self.ops)) or ", ".join(
            self.ops)
        return f"{self.kind:<9} {covered}"


@dataclass(frozen=True)
class GraphReport:
    nodes_before: int  # body nodes right after capture
    nodes_after: int  # body nodes that run
    passes: tuple[PassRecord, ...]
    ops: dict[str, int]  # final graph, by kiln op name
    opaque_ops: tuple[str, ...]  # ATen ops kept as calls of the original op
    planned_peak_bytes: int  # the memory arena
    intermediate_bytes: int  # all intermediates added up, as if none were reused
    planned_bytes: int  # the planned intermediates added up: the arena holds these, reused
    compile_seconds: float
    planned_peak_bytes_before: int = 0  # the arena the captured graph would need, no rewrites
    kernels: tuple[KernelInfo, ...] = ()  # every computing node's kernel, in run order
    packed_weight_bytes: int = 0  # weights repacked at compile time into kernels' layouts
    # the graphs, kernels' nodes, buffers and profiler the HTML page draws (kiln.report.html)
    details: GraphDetails | None = field(default=None, compare=False, repr=False)

    def rules_fired(self) -> dict[str, int]:
        """How often each rewrite rule fired, over every rule pass."""
        fired: dict[str, int] = {}
        for p in self.passes:
            for name, stats in p.rules.items():
                if stats.fired:
                    fired[name] = fired.get(name, 0) + stats.fired
        return fired


@dataclass
class CompileReport:
    graphs: list[GraphReport] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)  # pieces that run eagerly, and why

    def op_counts(self) -> dict[str, int]:
        """Ops of the final graph(s), keyed by kiln op name, most frequent first."""
        counts: dict[str, int] = {}
        for g in self.graphs:
            for op, n in g.ops.items():
                counts[op] = counts.get(op, 0) + n
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def rules_fired(self) -> dict[str, int]:
        """How often each rewrite rule fired, most often first."""
        fired: dict[str, int] = {}
        for g in self.graphs:
            for name, n in g.rules_fired().items():
                fired[name] = fired.get(name, 0) + n
        return dict(sorted(fired.items(), key=lambda kv: (-kv[1], kv[0])))

    @property
    def kernels(self) -> tuple[KernelInfo, ...]:
        """Every kernel of every graph, in run order."""
        return tuple(k for g in self.graphs for k in g.kernels)

    @property
    def nodes_before(self) -> int:
        return sum(g.nodes_before for g in self.graphs)

    @property
    def nodes_after(self) -> int:
        return sum(g.nodes_after for g in self.graphs)

    @property
    def planned_peak_bytes(self) -> int:
        return max((g.planned_peak_bytes for g in self.graphs), default=0)

    @property
    def intermediate_bytes(self) -> int:
        return max((g.intermediate_bytes for g in self.graphs), default=0)

    @property
    def compile_seconds(self) -> float:
        return sum(g.compile_seconds for g in self.graphs)

    def to_html(self, path: str | Path) -> Path:
        """Write the report as one self-contained HTML page (`kiln.report.write_html`)."""
        from kiln.report.html import write_html

        return write_html(self, path)

    def __str__(self) -> str:
        lines = [f"kiln compile report: {len(self.graphs)} graph(s), "
                 f"{self.compile_seconds * 1e3:.1f} ms"]
        for i, g in enumerate(self.graphs):
            lines.append(f"graph {i}: {g.nodes_before} -> {g.nodes_after} nodes, "
                         f"memory plan {_mib(g.planned_peak_bytes)} arena for "
                         f"{_mib(g.intermediate_bytes)} of intermediates "
                         f"({_mib(g.planned_peak_bytes_before)} before rewrites)")
            for p in g.passes:
                lines.append(f"  {p.name:<12} {p.nodes_before:>6} -> {p.nodes_after:<6} "
                             f"{p.seconds * 1e3:8.2f} ms")
                if p.search is not None:
                    lines.append(f"    {p.search.describe()}")
                    if p.search.path:
                        steps = ", ".join(f"{rule} at {node}" for rule, node in p.search.path)
                        lines.append(f"    rewrites after the {p.search.seed} graph: {steps}")
                if p.pet is not None:
                    lines.extend(f"    {line}" for line in p.pet.describe().splitlines())
            generated = sum(k.kind == "generated" for k in g.kernels)
            if g.kernels:
                lines.append(f"  kernels: {generated} generated, "
                             f"{len(g.kernels) - generated} library; weights packed at compile "
                             f"time: {_mib(g.packed_weight_bytes)}")
            if g.opaque_ops:
                lines.append(f"  run as original ATen ops: {', '.join(sorted(set(g.opaque_ops)))}")
        ops = ", ".join(f"{k}: {v}" for k, v in self.op_counts().items())
        lines.append(f"ops: {ops}")
        fired = ", ".join(f"{k}: {v}" for k, v in self.rules_fired().items())
        lines.append(f"rules fired: {fired or 'none'}")
        lines += [f"fallback: {f}" for f in self.fallbacks]
        return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"
