"""The Ray builder/runner on a local cluster of two workers, started here: the same records
as the local runner, a crashing candidate is a failed result, and a worker's start is not
counted in a candidate's timeout."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from kiln.codegen.build import CompilerUnavailable, toolchain  # noqa: E402
from kiln.options import Options  # noqa: E402
from kiln.tune.db import Target  # noqa: E402
from kiln.tune.measure import Runner, build_one  # noqa: E402
from kiln.tune.ray_runner import RayRunner  # noqa: E402
from kiln.tune.space import GemmSpace, neighbours  # noqa: E402


@dataclass(frozen=True)
class Crashing:
    kind: str = "test"

    def plan(self, decisions):  # noqa: ANN001, ANN201
        os.kill(os.getpid(), signal.SIGSEGV)


def test_a_local_ray_cluster_gives_the_local_runner_s_records(tmp_path: Path) -> None:
    options = Options(kernel_cache_dir=str(tmp_path / "kernels"))
    if isinstance(toolchain(options), CompilerUnavailable):
        pytest.skip("no C compiler")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers lack this file
    space = GemmSpace.for_shape(33, 70, 129, b_prepacked=True, bias=True)
    points = [space.default(), next(iter(neighbours(space, space.default())))]
    for p in points:  # built here, so that a task only loads and times its kernel
        assert build_one(space, p, options)[1] == ""
    # 2 s: the first candidate's load and timing took 0.06 s; a new worker's start (torch and
    # kiln imported) 2.7 s here, and it counted against the first candidate's limit
    with RayRunner(options, address=None, num_cpus=2, timeout_s=2, threads=1,
                   budget_s=0.1) as remote:
        first = remote.run_one(space, points[0])  # the first task, on a new cluster
        assert remote.build(space, points) == ["", ""]
        on_ray = [first, remote.run_one(space, points[1])]
        together = remote.run_together(space, points, rounds=3)  # the tuner's confirmation
        remote.timeout_s = 120  # (a crash must not read as a timeout on a loaded machine)
        crashed = remote.run_one(Crashing(), {})
    with Runner(options, timeout_s=120, threads=1, budget_s=0.1) as local:
        here = local.run(space, points)
    for r, h in zip(on_ray, here):
        assert r.ok and h.ok, (r.error, h.error)
        assert r.decisions == h.decisions and r.source == h.source  # the same kernel
        assert r.target == Target.here(options, 1).key()
    assert crashed.error is not None and crashed.error.startswith(("crash", "run"))
    assert [len(t) for t in together] == [3, 3] and all(x > 0 for t in together for x in t)
