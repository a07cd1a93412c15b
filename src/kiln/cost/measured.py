"""What an op costs on this machine, measured: each distinct op signature (op, attributes,
operand and result types) is timed once as the library call kiln would make, on random
operands, and the median kept on disk in ``<kernel cache>/op_times.sqlite``.

    model = MeasuredCost.open(options, AnalyticCost(Roofline.of_machine(options)))
    model.node_seconds(node)      # measured (or read back), else the analytic estimate

Measuring costs compile time, so a `MeasuredCost` has a budget: once it has spent
``budget_s`` seconds timing ops, new signatures get the analytic estimate (and say so in
`sources`). An op that cannot run on random operands (an index out of range, a shape the
library refuses) gets the estimate too. A timing whose samples spread widely, or whose threads
waited for a CPU (`kiln.cost.contention`: a busy machine), is used for this compile but not
kept; a file an older kiln filled, without that check, loses its timings once. The database is
a cache: a locked, read-only or corrupt file costs measurements, never a compile.
"""

from __future__ import annotations

import contextlib
import hashlib
import platform
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kiln.cost import measure
from kiln.cost.analytic import AnalyticCost, signature
from kiln.cost.contention import forget_unchecked
from kiln.cost.measure import Budget, interleaved
from kiln.ir.graph import Graph, Node
from kiln.ir.interp import evaluate_node
from kiln.ir.ops import Op
from kiln.ir.types import DType
from kiln.options import Options

__all__ = ["MeasuredCost", "kept_seconds"]

TIMEOUT_S = 5.0
STEADY = 0.5  # kept on disk only when every sample is within 50% of the median
_SCHEMA = "CREATE TABLE IF NOT EXISTS op_times (key TEXT PRIMARY KEY, seconds REAL NOT NULL)"
_BUDGET = Budget(min_rounds=5, max_rounds=7, cap_s=0.5, min_sample_s=1e-3, settle_calls=1,
                 collect_first=False)


@dataclass
class MeasuredCost:
    analytic: AnalyticCost
    path: Path | None = None  # None: keep measurements in memory only
    budget_s: float = 5.0  # measuring time this model may spend; then estimates only
    name: str = "measured"
    # which nodes to time; the others get the analytic estimate (None: every node)
    measures: Callable[[Node], bool] | None = None
    spent_s: float = 0.0
    sources: dict[str, int] = field(default_factory=lambda: {"measured": 0, "cached": 0,
                                                             "estimated": 0})
    _memory: dict[tuple, float] = field(default_factory=dict, repr=False)

    @staticmethod
    def open(options: Options, analytic: AnalyticCost, budget_s: float = 5.0,
             measures: Callable[[Node], bool] | None = None) -> MeasuredCost:
        from kiln.codegen.build import cache_dir  # the cache folder, not code generation

        return MeasuredCost(analytic, cache_dir(options) / "op_times.sqlite", budget_s,
                            measures=measures)

    def node_seconds(self, node: Node, graph: Graph | None = None) -> float:
        if node.op in (Op.INPUT, Op.CONSTANT, Op.SCALAR):
            return 0.0
        if self.measures is not None and not self.measures(node):
            return self.analytic.node_seconds(node)
        sig = signature(node)
        found = self._memory.get(sig)
        if found is not None:
            return found
        key = self._key(sig)
        row = self._query("SELECT seconds FROM op_times WHERE key = ?", (key,))
        if row:
            self.sources["cached"] += 1
            found = row[0]
        elif self.spent_s < self.budget_s:
            start = time.perf_counter()
            found, steady = _time_node(node, graph)
            self.spent_s += time.perf_counter() - start
            if found is not None:
                self.sources["measured"] += 1
                if steady:  # a busy machine's timing serves this compile, not the next
                    self._query("INSERT OR REPLACE INTO op_times VALUES (?, ?)", (key, found))
        if found is None:
            self.sources["estimated"] += 1
            found = self.analytic.node_seconds(node)
        self._memory[sig] = found
        return found

    def _key(self, sig: tuple) -> str:
        text = f"{sig!r}|{torch.get_num_threads()}|{platform.machine()}|{platform.processor()}"
        return hashlib.sha256(text.encode()).hexdigest()

    def _query(self, sql: str, args: tuple) -> Any:
        return _query(self.path, sql, args)


def kept_seconds(options: Options, what: tuple,
                 measure: Callable[[], tuple[tuple[float, ...], bool]]) -> tuple[float, ...]:
    """Timings measured once per machine, threads and torch version, and kept beside the op
    timings: ``what`` names them (its repr is the key), ``measure`` returns the seconds and
    whether they were steady (only steady ones are kept, as for ops)."""
    from kiln.codegen.build import cache_dir  # the cache folder, not code generation

    path = cache_dir(options) / "op_times.sqlite"
    text = (f"{what!r}|{torch.get_num_threads()}|{torch.__version__}|{platform.machine()}|"
            f"{platform.processor()}")
    keys = [hashlib.sha256(f"{text}|{i}".encode()).hexdigest() for i in range(_KEPT_MAX)]
    found: list[float] = []
    for key in keys:
        row = _query(path, "SELECT seconds FROM op_times WHERE key = ?", (key,))
        if not row:  # never kept (or a write cut short before its end mark)
            break
        if row[0] < 0:  # the end mark, written last
            return tuple(found)
        found.append(row[0])
    seconds, steady = measure()
    if steady and len(seconds) < _KEPT_MAX:
        for key, value in zip(keys, (*seconds, -1.0)):
            _query(path, "INSERT OR REPLACE INTO op_times VALUES (?, ?)", (key, value))
    return seconds


_KEPT_MAX = 16  # timings per kept_seconds entry, at most


def _query(path: Path | None, sql: str, args: tuple) -> Any:
    if path is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.closing(sqlite3.connect(path, timeout=TIMEOUT_S)) as db, db:
            db.execute(_SCHEMA)
            forget_unchecked(db, "op_times")
            return db.execute(sql, args).fetchone()
    except (sqlite3.Error, OSError):
        return None  # the cache is lost, not the compile


def _time_node(node: Node, graph: Graph | None) -> tuple[float | None, bool]:
    """The median seconds of the node's library call on random operands (None if it fails),
    and whether every sample was within `STEADY` of the median."""
    gen = torch.Generator().manual_seed(0)
    operands: list[Any] = []
    for v in node.inputs:
        t = v.type
        if v.node.op is Op.SCALAR:
            operands.append(v.node.attrs.value)  # type: ignore[attr-defined]
        elif v.node.op is Op.CONSTANT and graph is not None:
            operands.append(graph.constant(v.node))  # indices and masks stay valid
        elif t.dtype.is_floating:
            operands.append(torch.randn(t.shape, generator=gen).to(t.dtype.torch))
        elif t.dtype is DType.BOOL:
            operands.append(torch.randint(0, 2, t.shape, generator=gen).bool())
        else:
            operands.append(torch.zeros(t.shape, dtype=t.dtype.torch))  # valid as any index
    host = graph if graph is not None else Graph([], [], [])

    def call() -> object:
        return evaluate_node(node, operands, host)

    with torch.no_grad():
        timing = interleaved([call], _BUDGET)[0]
    if timing.error is not None or not timing.samples:
        return None, False
    median = timing.median_s
    close = timing.max_s <= (1 + STEADY) * median and timing.min_s >= median / (1 + STEADY)
    return median, close and (timing.waited is None or timing.waited <= measure.WAITED_MAX)
