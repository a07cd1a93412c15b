"""The fuzzing loop: generate, check, shrink, write reproducers; over several processes.

    summary = run_fuzz(FuzzSettings(graphs=1000, seed=0, jobs=4, out_dir="fuzz-out"))
    print(summary.text())

Graph ``i`` of seed ``s`` is the same whatever the process count, so a failure names its
graph by (seed, index) and ``kiln fuzz --seed s --start i --graphs 1`` reruns it. With
``jobs >= 1`` each graph runs in a worker process (one ATen thread each); a worker that dies
(a segfault in a kernel, a trap) is reported as a crash of the graph it was running and
replaced. ``jobs = 0`` runs everything in this process (tests).
"""

from __future__ import annotations

import collections
import gc
import json
import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from kiln.fuzz.case import Case
from kiln.fuzz.check import CONFIGS, KERNEL_CONFIGS, Config, Failure, Kind, check_case
from kiln.fuzz.compare import Strength
from kiln.fuzz.generate import Limits, generate_case
from kiln.fuzz.repro import write_repro
from kiln.fuzz.shrink import shrink
from kiln.ir.ops import Op


@dataclass(frozen=True)
class FuzzSettings:
    graphs: int = 1000
    seed: int = 0
    start: int = 0  # the first graph's index
    jobs: int = 1  # worker processes; 0: run in this process
    configs: tuple[str, ...] = tuple(c.name for c in CONFIGS)
    kernel_every: int = 1  # configurations with generated kernels run on every n-th graph
    max_ops: int = 6
    ops: tuple[str, ...] = ()  # the ops steps choose among, by name ((): every generated op)
    out_dir: str = ""  # reproducers go here ("" writes none)
    cache_dir: str = ""  # kernel cache ("" makes a temporary one)
    shrink: bool = True
    shrink_seconds: float = 60.0
    time_limit: float = 0.0  # stop starting graphs after this many seconds (0: no limit)
    verify: bool = False  # verify the graph after every pass (Options.debug)

    def configs_for(self, index: int) -> list[Config]:
        chosen = [c for c in CONFIGS if c.name in self.configs]
        if self.kernel_every > 1 and index % self.kernel_every:
            chosen = [c for c in chosen if c not in KERNEL_CONFIGS]
        return chosen


@dataclass
class GraphResult:
    index: int
    valid: bool = True
    invalid_reason: str = ""
    ops: list[str] = field(default_factory=list)
    configs: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> counters
    failures: list[str] = field(default_factory=list)
    reproducers: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    pid: int = 0  # the process that ran it


def run_graph(settings: FuzzSettings, index: int) -> GraphResult:
    """Generate, check and (on failure) shrink and write graph ``index``."""
    start = time.perf_counter()
    case = generate_case(settings.seed, index, Limits(max_ops=settings.max_ops),
                         tuple(Op.parse(name) for name in settings.ops) or None)
    result = GraphResult(index, ops=sorted({n.op.text for n in case.graph.all_nodes()}),
                         pid=os.getpid())
    outcome = check_case(case, settings.configs_for(index), settings.cache_dir,
                         verify=settings.verify)
    result.valid, result.invalid_reason = outcome.valid, outcome.invalid_reason
    for name, stats in outcome.stats.items():
        counters = {s.name.lower(): n for s, n in stats.outputs.items()}
        counters.update(generated=stats.generated, prepacked=stats.prepacked)
        result.configs[name] = counters
        result.warnings += [f"[{name}] {w}" for w in stats.warnings]
    result.failures = [str(f) for f in outcome.failures]
    if outcome.failures and settings.out_dir:  # the first; the others are mostly the same bug
        note = "\n".join(result.failures)
        result.reproducers += _write(settings, case, outcome.failures[0], index, note)
    result.seconds = time.perf_counter() - start
    return result


def _write(settings: FuzzSettings, case: Case, failure: Failure, index: int,
           note: str) -> list[str]:
    """The case as generated, and shrunk for ``failure``; ``note`` lists every failure."""
    stem = Path(settings.out_dir) / f"seed{settings.seed}-graph{index}-{failure.config}"
    written = [str(write_repro(case, f"{stem}-original", note))]
    if settings.shrink:
        small = shrink(case, failure, settings.cache_dir, settings.shrink_seconds,
                       verify=settings.verify)
        written.insert(0, str(write_repro(small, stem, str(failure))))
    return written


@dataclass
class Summary:
    settings: FuzzSettings
    graphs: int = 0
    invalid: int = 0
    seconds: float = 0.0
    configs: dict[str, dict[str, int]] = field(default_factory=dict)  # summed counters
    failures: list[tuple[int, str]] = field(default_factory=list)
    reproducers: list[str] = field(default_factory=list)
    invalid_reasons: collections.Counter = field(default_factory=collections.Counter)
    warnings: collections.Counter = field(default_factory=collections.Counter)
    ops: collections.Counter = field(default_factory=collections.Counter)  # graphs per op
    processes: set[int] = field(default_factory=set)

    def add(self, result: GraphResult) -> None:
        self.graphs += 1
        if result.pid:
            self.processes.add(result.pid)
        self.ops.update(result.ops)
        if not result.valid:
            self.invalid += 1
            self.invalid_reasons[result.invalid_reason[:100]] += 1
        for name, counters in result.configs.items():
            total = self.configs.setdefault(name, {"graphs": 0})
            total["graphs"] += 1
            for key, n in counters.items():
                total[key] = total.get(key, 0) + n
        self.failures += [(result.index, f) for f in result.failures]
        self.reproducers += result.reproducers
        self.warnings.update(w[:160] for w in result.warnings)

    @property
    def failed_graphs(self) -> int:
        return len({i for i, _ in self.failures})

    def text(self) -> str:
        rate = self.graphs / self.seconds if self.seconds else 0.0
        lines = [f"kiln fuzz: seed {self.settings.seed}, {self.graphs} graphs in "
                 f"{self.seconds:.1f} s ({rate:.1f} graphs/s, {len(self.processes)} "
                 f"process(es)); {self.invalid} invalid (the reference itself raises), "
                 f"{len(self.failures)} failure(s) in {self.failed_graphs} graph(s)"]
        header = ["config", "graphs", *(s.name.lower() for s in Strength), "generated",
                  "prepacked"]
        rows = [header] + [[name, *(str(c.get(k, 0)) for k in header[1:])]
                           for name, c in self.configs.items()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines.append("outputs compared per configuration, by strength; kernels that ran:")
        lines += ["  " + "  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in rows]
        for index, failure in self.failures[:50]:
            lines.append(f"FAIL graph {index}: {failure}")
        lines += [f"  reproducer: {path}" for path in self.reproducers[:50]]
        for reason, n in self.invalid_reasons.most_common(5):
            lines.append(f"invalid x{n}: {reason}")
        for warning, n in self.warnings.most_common(10):
            lines.append(f"warning x{n}: {warning}")
        return "\n".join(lines)

    def as_json(self) -> dict:
        return {"settings": asdict(self.settings), "graphs": self.graphs,
                "invalid": self.invalid, "seconds": self.seconds, "configs": self.configs,
                "processes": len(self.processes),
                "failures": [{"graph": i, "failure": f} for i, f in self.failures],
                "reproducers": self.reproducers, "ops": dict(self.ops),
                "invalid_reasons": dict(self.invalid_reasons), "warnings": dict(self.warnings)}

    def write_json(self, path: str) -> None:
        Path(path).write_text(json.dumps(self.as_json(), indent=2) + "\n")


Progress = Callable[[Summary, GraphResult], None]


def run_fuzz(settings: FuzzSettings, progress: Progress | None = None) -> Summary:
    """Run ``settings.graphs`` graphs; ``progress`` is called after each."""
    with tempfile.TemporaryDirectory(prefix="kiln-fuzz-") as tmp:
        if not settings.cache_dir:
            settings = _replace(settings, cache_dir=os.path.join(tmp, "kernels"))
        summary = Summary(settings)
        start = time.perf_counter()
        indices = range(settings.start, settings.start + settings.graphs)
        results = _in_process(settings, indices, start) if settings.jobs <= 0 else \
            _in_workers(settings, indices, start)
        for result in results:
            summary.add(result)
            summary.seconds = time.perf_counter() - start
            if progress is not None:
                progress(summary, result)
        summary.seconds = time.perf_counter() - start
    return summary


def _replace(settings: FuzzSettings, **changes: object) -> FuzzSettings:
    return FuzzSettings(**{**asdict(settings), **changes})  # type: ignore[arg-type]


def _out_of_time(settings: FuzzSettings, start: float) -> bool:
    return settings.time_limit > 0 and time.perf_counter() - start >= settings.time_limit


def _in_process(settings: FuzzSettings, indices: Iterable[int], start: float):
    for index in indices:
        if _out_of_time(settings, start):
            return
        yield run_graph(settings, index)


def _worker(settings: FuzzSettings, tasks: mp.Queue, results: mp.Queue) -> None:
    torch.set_num_threads(1)  # one process per core
    gc.freeze()  # timing decisions collect garbage; the startup objects need no scanning
    parent = os.getppid()
    while True:
        try:
            index = tasks.get(timeout=5.0)
        except queue.Empty:
            if os.getppid() != parent:  # the driver is gone
                return
            continue
        if index is None:
            return
        results.put(("start", index, os.getpid()))
        try:
            result = run_graph(settings, index)
        except Exception:  # noqa: BLE001 - the fuzzer's own bug: report it, keep going
            result = GraphResult(index, failures=[f"[fuzzer] {Kind.CRASH.value}: "
                                                  f"{traceback.format_exc(limit=5)}"],
                                 pid=os.getpid())
        results.put(("done", index, result))


def _in_workers(settings: FuzzSettings, indices: Iterable[int], start: float):
    """Graphs are handed out two per worker at a time, so that stopping at the time limit
    only waits for the graphs already handed out."""
    ctx = mp.get_context("spawn")
    tasks: mp.Queue = ctx.Queue()
    results: mp.Queue = ctx.Queue()
    todo = iter(indices)
    workers: dict[int, mp.process.BaseProcess] = {}
    running: dict[int, int] = {}  # pid -> the graph it started last
    handed: set[int] = set()  # handed out, not yet reported

    def hand_out() -> None:
        while len(handed) < 2 * max(len(workers), 1) and not _out_of_time(settings, start):
            index = next(todo, None)
            if index is None:
                return
            handed.add(index)
            tasks.put(index)

    def spawn() -> None:
        p = ctx.Process(target=_worker, args=(settings, tasks, results), daemon=True)
        p.start()
        workers[p.pid] = p  # type: ignore[index]

    for _ in range(settings.jobs):
        spawn()
    try:
        hand_out()
        while handed:
            try:
                kind, index, payload = results.get(timeout=1.0)
            except queue.Empty:
                for pid, p in list(workers.items()):
                    if p.is_alive():
                        continue
                    del workers[pid]
                    index = running.pop(pid, None)
                    if index is not None and index in handed:
                        handed.discard(index)
                        yield GraphResult(index, failures=[
                            f"[worker] {Kind.CRASH.value}: the process running this graph "
                            f"died (exit code {p.exitcode}); rerun it alone with --seed "
                            f"{settings.seed} --start {index} --graphs 1 --jobs 0"])
                    spawn()
                hand_out()
                continue
            if kind == "start":
                running[payload] = index
            elif index in handed:
                handed.discard(index)
                yield payload
                hand_out()
    finally:
        for _ in workers:
            tasks.put(None)
        for p in workers.values():
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
