"""kiln.cost.contention: how long this process's threads waited for a CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kiln.cost.contention import waited_s, waited_share
from kiln.cost.measure import WAITED_MAX

linux_only = pytest.mark.skipif(not os.path.isdir("/proc/self/task"),
                                reason="the kernel's scheduler statistics are Linux's")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@linux_only
def test_a_thread_that_shares_its_cpu_with_spinning_processes_waits() -> None:
    """One spinning process more than there are cores: this thread waits for a CPU for a
    large share of the time, far above `WAITED_MAX`."""
    spin = "import time\nend = time.time() + 3\nwhile time.time() < end: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin])
                for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.3)  # (the spinners started)
        before, start = waited_s(), time.perf_counter()
        _spin(0.6)
        share = waited_share(before, time.perf_counter() - start)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert share is not None and share > 4 * WAITED_MAX


def test_unknown_waiting_gives_no_share() -> None:
    assert waited_share(None, 1.0) is None
    assert waited_share(0.0, 0.0) is None
