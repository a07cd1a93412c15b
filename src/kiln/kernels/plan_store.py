"""Finished kernel plans kept on disk, next to the compiled kernels: a warm compile loads each
GEMM's and window kernel's plan, its schedule applied and its post-passes run, instead of
scheduling it again. Scheduling and post-passes were most of a warm compile's own work
(Inception v3: 1.1 of 3.6 s, 54 convolutions at about 20 ms each).

    plan = stored_plan(space, config, options)   # space.plan_config(config), kept on disk

An entry is keyed by the space and the configuration (their reprs: shapes, ISA, threads,
epilogue, tiles) and by a digest of kiln's own source, so a changed kiln never reads a plan
an older one made. Entries are written through a temporary name (a reader sees a whole file or
none); an entry that cannot be read is rebuilt and written again. They are pickles: the
folder is trusted as the kernel cache is, whose libraries this process loads and runs.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import pickle
import sys
from pathlib import Path
from typing import Any, Protocol

from kiln.codegen.build import cache_dir, write_atomic
from kiln.kernels.plan import KernelPlan
from kiln.options import Options

__all__ = ["kiln_digest", "plan_path", "stored_plan"]

FORMAT = 1  # bumped when an entry's layout changes


class _Space(Protocol):
    def plan_config(self, cfg: Any) -> KernelPlan: ...


@functools.lru_cache(maxsize=512)  # (a model's repeated layers ask for the same plans)
def stored_plan(space: _Space, config: Any, options: Options) -> KernelPlan:
    """``space.plan_config(config)``, read from the plan store where an earlier compile left
    it, else made and left there (`Options.store_plans` off: made, nothing read or kept)."""
    if not options.store_plans:
        return space.plan_config(config)
    path = plan_path(space, config, options)
    plan = _read(path)
    if plan is not None:
        return plan
    plan = space.plan_config(config).with_build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError:
        pass  # a read-only cache: the plan serves this compile all the same
    return plan


def plan_path(space: _Space, config: Any, options: Options) -> Path:
    h = hashlib.sha256()
    for part in (str(FORMAT), kiln_digest(), type(space).__name__, repr(space), repr(config)):
        h.update(part.encode())
        h.update(b"\0")
    key = h.hexdigest()
    return cache_dir(options) / "plans" / key[:2] / f"{key}.pickle"


def _read(path: Path) -> KernelPlan | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    collecting = gc.isenabled()
    gc.disable()  # (thousands of new objects: in a compiling process, with a large heap, the
    try:  # collections they set off took 13 ms a GEMM plan, the unpickling itself 0.5)
        plan = pickle.loads(data)
    except Exception:  # noqa: BLE001 - a truncated or foreign file: made again, overwritten
        return None
    finally:
        if collecting:
            gc.enable()
    return plan if isinstance(plan, KernelPlan) else None


@functools.cache
def kiln_digest() -> str:
    """SHA-256 of every Python source file of the kiln package (and of Python's version):
    a plan is only as good as the code that scheduled it."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256(f"{sys.version_info[:2]}".encode())
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()
