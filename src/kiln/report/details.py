"""What the HTML report draws of one compiled graph, kept beside its GraphReport.

The engine fills it once per compile; the page is drawn from it later (``to_html``), so it
holds only immutable things: the two graphs, which kernel runs each node, the planned
buffers with their lifetimes, and a way to time one run of the compiled graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kiln.ir.graph import Graph, Node
from kiln.ir.ops import Op
from kiln.runtime.memory import MemoryPlan, lifetimes

NOT_RUN = -1  # step of a weight or a number: no call computes it


@dataclass(frozen=True)
class Buffer:
    """One planned intermediate: where it sits in the arena and when it is alive, in steps
    (a step is one library or kernel call, numbered in run order)."""

    name: str  # the value's node label (#i for the i-th output of a node with several)
    offset: int
    nbytes: int
    first: int  # the step that writes it
    last: int  # the last step that reads it or a view of it


@dataclass(frozen=True)
class StepTime:
    step: int  # index into GraphReport.kernels
    seconds: float  # median over the timed runs


@dataclass(frozen=True)
class Profile:
    """Per-call times of one run of the compiled graph, and how they were taken."""

    steps: tuple[StepTime, ...]
    method: str  # a sentence for the page
    total_seconds: float  # the graph call itself, untimed steps included

    @property
    def by_step(self) -> dict[int, float]:
        return {s.step: s.seconds for s in self.steps}


@dataclass(frozen=True)
class GraphDetails:
    captured: Graph  # as imported, before any pass
    optimized: Graph  # as it runs
    step_of_node: tuple[int, ...]  # per optimized.nodes index: its step, or NOT_RUN
    buffers: tuple[Buffer, ...]
    arena_bytes: int
    # times one run on random inputs (seconds of device time): called when the page is drawn
    profiler: Callable[[], Profile] | None = None
    # per generated kernel (its group's last node): the calls so far that ran its library ops
    # instead, its operands laid out otherwise than it reads them (`kiln.runtime.executor`)
    fallbacks: Mapping[str, int] = field(default_factory=dict)

    def group_of_step(self) -> dict[int, list[Node]]:
        """The nodes each step computes, in graph order."""
        groups: dict[int, list[Node]] = {}
        for node, step in zip(self.optimized.nodes, self.step_of_node):
            if step != NOT_RUN:
                groups.setdefault(step, []).append(node)
        return groups


def steps_of(graph: Graph, kernel_groups: Sequence[Sequence[Node]]) -> tuple[int, ...]:
    """The step of each body node, counted as the executor runs them: a node outside every
    kernel group is its own step, a group is one step at its last node."""
    group_of = {n: tuple(g) for g in kernel_groups for n in g}
    step_of: dict[Node, int] = {}
    step = 0
    for node in graph.nodes:
        if node.op in (Op.CONSTANT, Op.SCALAR):
            continue
        group = group_of.get(node)
        if group is None:
            step_of[node] = step
            step += 1
        elif node is group[-1]:
            for member in group:
                step_of[member] = step
            step += 1
    return tuple(step_of.get(n, NOT_RUN) for n in graph.nodes)


def planned_buffers(graph: Graph, plan: MemoryPlan | None,
                    step_of_node: Sequence[int]) -> tuple[Buffer, ...]:
    """Every planned value's place and lifetime in steps. A kernel writes its outputs and
    reads its inputs in its one call, so lifetimes counted in steps need no kernel rule."""
    if plan is None:
        return ()
    spans = lifetimes(graph)
    buffers = []
    for value, offset in plan.offsets.items():
        span = spans[value]
        first = step_of_node[span.first]
        # the last reader may be a weight-free view or a node inside a kernel: its step
        last = max(first, step_of_node[span.last])
        name = value.node.name if len(value.node.types) == 1 else (
            f"{value.node.name}#{value.index}")
        buffers.append(Buffer(name, offset, value.type.nbytes, first, last))
    return tuple(sorted(buffers, key=lambda b: (b.first, b.offset)))
