"""Never slower than the library: a checked kernel is timed against the library calls it
replaces (`kiln.cost.measure`, interleaved), on its shapes, on this machine, and used only
where it is faster. Decisions are kept on disk per (kernel, operand types, threads, machine),
so a recompile does not measure again.

    decisions = Decisions.open(options)          # <kernel cache>/decisions.sqlite
    outcome = faster_than_library(graph, built, decisions)   # Built (with .measured) or Skipped

The database is a cache: it never costs a compile or changes an answer. Processes share it
through sqlite's locks (a writer waits up to `TIMEOUT_S`); a database that cannot be read or
written (locked too long, read-only, a file where its folder should be) leaves the decisions
in memory for this process; a corrupt one is moved aside (``decisions.sqlite.corrupt``), with a
warning, and a new one started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import platform
import sqlite3
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from kiln.codegen.build import cache_dir
from kiln.codegen.kernel import CompiledKernel
from kiln.cost.contention import forget_unchecked
from kiln.cost.measure import (
    Budget,
    Timing,
    evict_caches,
    interleaved,
)
from kiln.ir import fused
from kiln.ir.graph import Graph
from kiln.ir.interp import evaluate_node
from kiln.ir.ops import Op
from kiln.kernels.outcome import Built, Measured, Skipped, SkipReason
from kiln.kernels.plan import Recipe
from kiln.kernels.streaming import streams_weights
from kiln.kernels.validate import empty_output, operand_strides, random_operands, runner
from kiln.options import Options

__all__ = ["MARGIN", "Decisions", "fastest", "faster_than_library", "margin"]

# the generated kernel must take at most this fraction of the library's time: a GEMM must win
# clearly (measurement noise on a tie would flip the choice between compiles); a fused
# elementwise or row kernel also saves the intermediates' memory traffic, so a tie keeps it;
# a direct convolution must win by a little more than the noise: ATen's (oneDNN) ran slower
# in the model than timed alone, the generated one did not (Zen 3, HF ResNet-50's 56x56x64
# 3x3: oneDNN timed 1.347 ms, in the model 1.30-1.45; generated 1.286, in the model
# 1.24-1.26). A library variant on prepared weights must win clearly: the five it won by
# 4-12% (mobilenet_v2's and resnet50's, inception's, vit_b16's patches) all lost in the model
# (Zen 3, 2 threads, in-process A/B without the variants: 0.978, 0.985 in 10 of 10 pairs,
# 0.998, 0.996; HF MobileNetV2's 49x576x160: timed 91 us, in the model 199 plus 34 for the
# views ahead of it, which a generated GEMM reads in place)
MARGIN = {Recipe.GEMM: 0.95, Recipe.DEPTHWISE: 0.95, Recipe.CONV: 0.97, Recipe.POOL: 0.95,
          Recipe.ROWS: 1.0, Recipe.LOOPS: 1.0, Recipe.LIBRARY: 0.85,
          Recipe.ATTENTION: 0.95}
STEADY = 0.5  # a decision is kept on disk only when every sample is within this of the median
TIMEOUT_S = 10.0  # how long a statement waits for another process's write lock
_CORRUPT = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB
_SCHEMA = ("""CREATE TABLE IF NOT EXISTS decisions (
    key TEXT PRIMARY KEY, library_s REAL NOT NULL, generated_s REAL NOT NULL)""",
           # a kernel's correctness check (kiln.kernels.checks): 1 agreed, 0 disagreed
           """CREATE TABLE IF NOT EXISTS checks (key TEXT PRIMARY KEY, agreed INTEGER NOT NULL)""")


@dataclass
class Decisions:
    """The on-disk record of measured decisions (sqlite; one row per key). ``path=None``
    keeps them in memory only; ``measure=False`` uses every checked kernel unmeasured."""

    path: Path | None
    measure: bool = True
    _memory: dict[str, Measured] = dataclasses.field(default_factory=dict)

    @staticmethod
    def open(options: Options) -> Decisions:
        return Decisions(cache_dir(options) / "decisions.sqlite", options.measure_kernels)

    def get(self, key: str) -> Measured | None:
        if key in self._memory:
            return self._memory[key]
        row = self._query("SELECT library_s, generated_s FROM decisions WHERE key = ?", (key,))
        if row:
            found = Measured(row[0], row[1], cached=True)
            self._memory[key] = found
            return found
        return None

    def put(self, key: str, measured: Measured) -> None:
        self._memory[key] = measured
        self._query("INSERT OR REPLACE INTO decisions VALUES (?, ?, ?)",
                    (key, measured.library_s, measured.generated_s))

    def agreed(self, key: str) -> bool | None:
        """A kept check's answer (`kiln.kernels.checks`); None where there is none."""
        row = self._query("SELECT agreed FROM checks WHERE key = ?", (key,))
        return None if row is None else bool(row[0])

    def put_agreed(self, key: str, agreed: bool) -> None:
        self._query("INSERT OR REPLACE INTO checks VALUES (?, ?)", (key, int(agreed)))

    def _query(self, sql: str, args: tuple) -> tuple | None:
        """Run one statement; an unusable database file costs the cache, not the compile."""
        if self.path is None:
            return None
        try:
            return _execute(self.path, sql, args)
        except sqlite3.DatabaseError as err:
            if not _is_corrupt(err) or not self._set_aside(err):
                return None
        except (sqlite3.Error, OSError):
            return None
        try:  # on the new database
            return _execute(self.path, sql, args)
        except (sqlite3.Error, OSError):
            return None

    def _set_aside(self, err: sqlite3.Error) -> bool:
        """Move a corrupt database (and its journal) aside; False where that fails, and then
        this process keeps its decisions in memory."""
        assert self.path is not None
        aside = self.path.with_name(self.path.name + ".corrupt")
        try:
            os.replace(self.path, aside)
            for suffix in ("-journal", "-wal", "-shm"):  # a hot journal belongs to the old file
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{self.path}{suffix}")
        except OSError as move_err:
            warnings.warn(f"kiln: the kernel decisions database {self.path} is corrupt ({err}) "
                          f"and cannot be moved aside ({move_err}); decisions are kept in "
                          f"memory", RuntimeWarning, stacklevel=4)
            self.path = None
            return False
        warnings.warn(f"kiln: the kernel decisions database {self.path} was corrupt ({err}); "
                      f"moved it to {aside.name} and started a new one (kernels are measured "
                      f"again)", RuntimeWarning, stacklevel=4)
        return True


def _execute(path: Path, sql: str, args: tuple) -> tuple | None:
    """One statement in its own transaction, on a connection closed straight after. A file
    an older kiln wrote loses its decisions first (`kiln.cost.contention.forget_unchecked`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(path, timeout=TIMEOUT_S)) as db, db:
        for table in _SCHEMA:
            db.execute(table)
        forget_unchecked(db, "decisions")  # (the checks' answers do not depend on load)
        return db.execute(sql, args).fetchone()


def _is_corrupt(err: sqlite3.DatabaseError) -> bool:
    code = getattr(err, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return code & 0xFF in _CORRUPT
    text = str(err)
    return "not a database" in text or "malformed" in text


def margin(built: Built) -> float:
    """The fraction of the library's time ``built`` may take: its recipe's `MARGIN`, or a tie
    where it computes several nodes. Those it keeps from writing their values out and
    reading them back, which a timing of the group alone (its values in cache) does not see:
    MobileNetV2's 3136x24x144 GEMM with its residual and bias measured 0.191 ms against the
    library's add and addmm, 0.196, and lost; in the model those two took 0.080 and 0.232."""
    return 1.0 if len(built.group.nodes) > 1 else MARGIN[built.recipe]


def faster_than_library(graph: Graph, built: Built, decisions: Decisions) -> Built | Skipped:
    """``built`` with its measurement where it beats the library by `MARGIN`; else Skipped."""
    return fastest(graph, [built], decisions)


def fastest(graph: Graph, candidates: Sequence[Built], decisions: Decisions
            ) -> Built | Skipped:
    """The fastest of ``candidates`` (kernels for the same group) among those that beat the
    group's library calls by their `MARGIN`, with its measurement; else Skipped. Each
    competes by its time over its margin: a library variant must beat a generated kernel by
    as much more as its own margin asks more of it against the library. Unmeasured
    (``decisions.measure`` off): the first candidate. Candidates without a kept decision are
    timed together with the library calls, in one interleaved run."""
    if not decisions.measure:
        return candidates[0]
    strides = measured_strides(candidates)
    cold = streams_weights(graph, candidates[0].group)
    keys = [decision_key(c, strides) + ("cold" if cold else "")  # (how it was timed)
            for c in candidates]
    known = [decisions.get(key) for key in keys]
    missing = [i for i, m in enumerate(known) if m is None]
    if missing:
        measured, steady = measure(graph, [candidates[i] for i in missing], cold)
        for i, m in zip(missing, measured):
            known[i] = m
            if steady:  # a measurement disturbed by other work is used now, not kept
                decisions.put(keys[i], m)
    timed = [(c, m) for c, m in zip(candidates, known) if m is not None]
    winners = [(c, m) for c, m in timed if m.generated_s <= margin(c) * m.library_s]
    if winners:
        best, m = min(winners, key=lambda cm: cm[1].generated_s / margin(cm[0]))
        return dataclasses.replace(best, measured=m)
    detail = "; ".join(f"{c.kernel.name}: {m}" for c, m in timed)
    return Skipped(candidates[0].group, SkipReason.SLOWER, detail, timed[0][1])


def measure(graph: Graph, candidates: Sequence[Built], cold: bool = False
            ) -> tuple[list[Measured], bool]:
    """The kernels and the group's library calls, interleaved on the same random operands
    (``cold``: with the caches evicted before each call, `streams_weights`); and whether the
    samples were steady (each contender's spread within `STEADY` of its median)."""
    group = candidates[0].group
    env = random_operands(graph, group, measured_strides(candidates))
    runners = []
    for built in candidates:
        outs = [empty_output(built, i) for i in range(len(built.outputs))]
        runners.append(runner(graph, built, env, outs))

    def library() -> None:
        values = dict(env)
        for node in group.nodes:
            args = [values[v] if v in values else v.node.attrs.value  # type: ignore[attr-defined]
                    for v in node.inputs]
            values.update(zip(node.outputs, evaluate_node(node, args, graph)))

    margins = [margin(c) for c in candidates]
    with torch.no_grad():
        lib, *gens = interleaved([library, *runners],
                                 Budget.kernel_cold() if cold else Budget.kernel(),
                                 settled=lambda ts: _settled(ts[0], ts[1:], margins),
                                 before_sample=evict_caches if cold else None)
    steady = all(t.steady(STEADY) for t in (lib, *gens))
    return [Measured(lib.median_s, g.median_s) for g in gens], steady


def _settled(library: Timing, generated: Sequence[Timing], margins: Sequence[float]) -> bool:
    """Whether more rounds could change the decision: every sample of each candidate is on
    one side of its margin against every sample of the library call, and of the candidates
    that beat it, every sample of the fastest is below every sample of the others."""
    if library.error is not None or not library.samples:
        return False
    winners = []
    for timing, margin in zip(generated, margins):
        if timing.error is not None:
            continue
        if timing.max_s <= margin * library.min_s:
            winners.append(timing)
        elif timing.min_s <= margin * library.max_s:
            return False  # on both sides of the margin
    winners.sort(key=lambda t: t.min_s)
    return len(winners) < 2 or winners[0].max_s < winners[1].min_s


def measured_strides(candidates: Sequence[Built]) -> dict:
    """The operands' strides as the run time gives them to the candidates: where a generated
    kernel reads an input channels-last, every contender (the library calls too) is timed on
    it so, as they would run."""
    strides: dict = {}
    for built in candidates:
        strides.update(operand_strides(built))
    return strides


def decision_key(built: Built, strides: dict | None = None) -> str:
    """The kernel's library identity (source, compiler, flags; and its `Built.run_if` test,
    timed with it), what it is called on (the operand types, and ``strides`` where the
    operands are not contiguous), the threads it runs on, the torch it competes with, the
    machine, and where the group has a call, the source of kiln's own library ops."""
    kernel = built.kernel
    identity = kernel.library.key if isinstance(kernel, CompiledKernel) else kernel.source
    if built.run_if is not None:  # (by name: a partial's repr holds an address)
        test = built.run_if[0]
        bound = test.keywords if isinstance(test, functools.partial) else {}
        test = test.func if isinstance(test, functools.partial) else test
        identity += f" run_if {test.__module__}.{test.__qualname__} {sorted(bound.items())}"
    laid = [strides[v] for v in built.group.inputs if v in strides] if strides else []
    parts = [identity,
             repr([v.type for v in built.group.inputs]) + (repr(laid) if laid else ""),
             str(torch.get_num_threads()), torch.__version__, machine()]
    if any(n.op is Op.CALL for n in built.group.nodes):
        parts.append(kiln_library())
    return digest(*parts)


@functools.cache
def kiln_library() -> str:
    """The source of kiln's own library ops (`kiln.ir.fused`: the attention call's guard,
    ATen's fused kernel or the decomposition), whose speed a decision over a call of one
    also records: another version of them is measured anew, not read from a cache that a
    kiln before it filled (the key named only the kernel, the operands, torch and the
    machine)."""
    return hashlib.sha256(Path(fused.__file__).read_bytes()).hexdigest()


def digest(*parts: str) -> str:
    """SHA-256 of ``parts``, each ended by a NUL (so no two splits of one text collide)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def machine() -> str:
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.machine()} {model}"
