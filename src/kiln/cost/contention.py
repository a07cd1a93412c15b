"""How long this process's threads waited for a CPU: the sign that other work shared the
cores while kiln timed something.

    before = waited_s()
    ...                                   # the timing
    share = waited_share(before, wall_s)  # seconds waited per second of wall time, or None

Linux counts, per thread, the time it was ready to run but had no CPU (the second field of
``/proc/<pid>/task/<tid>/schedstat``, in ns). kiln's own threads (the caller and its OpenMP
and ATen pools) fit the cores they are sized for, so on a quiet machine they hardly wait:
compiling HF LeViT on this project's 2-core machine, its 37 kernel timings waited 0-1.1% of
their wall time; with one other process spinning beside the compile, half (the median).
A timing's samples can stay close to each other under a steady load (a test suite beside
it) while the load slows the contenders unequally, so `kiln.cost.measure.Timing.steady`
also asks this. Elsewhere (no ``/proc``) it is unknown, and only the samples' spread
decides.
"""

from __future__ import annotations

import os

__all__ = ["waited_s", "waited_share"]

_TASKS = "/proc/self/task"


def waited_s() -> float | None:
    """Seconds this process's threads, those alive now, have waited for a CPU so far; None
    where the kernel does not say."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    total, found = 0, False
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
            found = True
        except (OSError, IndexError, ValueError):
            continue  # (a thread that ended since the listing)
    return total / 1e9 if found else None


def waited_share(before: float | None, wall_s: float) -> float | None:
    """Seconds waited since ``before`` (a `waited_s` reading) per second of ``wall_s``."""
    now = waited_s()
    if before is None or now is None or wall_s <= 0:
        return None
    return max(now - before, 0.0) / wall_s
