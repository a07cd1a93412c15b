"""The per-call time profile of one compiled graph, for the report.

The executor is generated a second time with a timer around each step (one library call or
one kernel call) and run on random inputs of the graph's input types: one untimed run to warm
caches, then a few timed runs; each step's time is the median of its runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from kiln.ir.graph import Graph, Node
from kiln.ir.types import TensorType
from kiln.kernels.outcome import Built
from kiln.report.details import Profile, StepTime
from kiln.runtime.executor import build_executor
from kiln.runtime.memory import MemoryPlan

RUNS = 5  # timed runs, at most
BUDGET_SECONDS = 2.0  # stop early after this much timed running (a large model)


class StepClock:
    """Collects the seconds of each step; waits for the device around each step, so a GPU's
    queued work is charged to the call that queued it."""

    def __init__(self, device: torch.device) -> None:
        self.samples: dict[int, list[float]] = {}
        self._sync = torch.cuda.synchronize if device.type == "cuda" else _no_sync
        self._started = 0.0

    def start(self) -> None:
        self._sync()
        self._started = time.perf_counter()

    def stop(self, step: int) -> None:
        self._sync()
        self.samples.setdefault(step, []).append(time.perf_counter() - self._started)


def _no_sync() -> None:
    pass


def random_input(t: TensorType, device: torch.device) -> torch.Tensor:
    """Normal floats; zeros for integers and booleans (always valid as indices)."""
    if t.dtype.is_floating:
        return torch.randn(t.shape, dtype=t.dtype.torch, device=device)
    return torch.zeros(t.shape, dtype=t.dtype.torch, device=device)


def profile_graph(graph: Graph, plan: MemoryPlan | None, kernels: Sequence[Built],
                  writes: frozenset[Node] = frozenset()) -> Profile:
    """Time every step of one run of the compiled graph (see the module docstring);
    ``writes``: its scatters written in place."""
    clock = StepClock(graph.device)
    timed, _ = build_executor(graph, plan, range(len(graph.inputs)), kernels, clock,
                              writes=writes)
    plain, _ = build_executor(graph, plan, range(len(graph.inputs)), kernels, writes=writes)
    inputs = [random_input(n.type, graph.device) for n in graph.inputs]
    with torch.no_grad():
        _call(plain, inputs)  # warm: first-touch pages, lazy library setup
        totals = []
        for _ in range(RUNS):
            start = time.perf_counter()
            _call(plain, inputs)
            totals.append(time.perf_counter() - start)
        clock.samples.clear()
        _call(timed, inputs)  # the timer's own first call warms its generated code
        clock.samples.clear()
        spent = time.perf_counter()
        runs = 0
        while runs < RUNS and (runs == 0 or time.perf_counter() - spent < BUDGET_SECONDS):
            _call(timed, inputs)
            runs += 1
    steps = tuple(StepTime(step, statistics.median(times))
                  for step, times in sorted(clock.samples.items()))
    threads = torch.get_num_threads()
    method = (f"each call timed with time.perf_counter around it, in a copy of the generated "
              f"executor, on random inputs (normal floats, zero integers); median of {runs} "
              f"runs after a warm-up run, {threads} thread(s), at the time the page was drawn")
    return Profile(steps, method, statistics.median(totals))


def _call(run: Any, inputs: list[torch.Tensor]) -> None:
    run(list(inputs))  # the executor empties the list it is given
