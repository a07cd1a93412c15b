"""One compiled model called from 8 threads at once computes, in every thread, what eager does.

The executor writes intermediates into planned buffers and generated kernels write through raw
pointers; threads calling the same compiled model must never share those bytes (each thread
has its own arena). A shared arena fails these tests: one thread's kernel overwrites another
thread's intermediates between their write and their read.
"""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

import kiln
from kiln import models
from kiln.options import Options

THREADS = 8
ROUNDS = 15


def _inputs(example: tuple[torch.Tensor, ...], seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(x.shape, generator=generator, dtype=x.dtype)
                 if x.is_floating_point() else x for x in example)


def _hammer(run, per_thread: list[tuple[torch.Tensor, ...]],
            expected: list[torch.Tensor]) -> list[str]:
    """Every thread calls ``run`` ROUNDS times on its own inputs; the failures, as text."""
    barrier = threading.Barrier(len(per_thread))
    failures: list[str] = []

    def worker(k: int) -> None:
        try:
            barrier.wait()
            for r in range(ROUNDS):
                got = run(*per_thread[k])
                if not torch.allclose(got, expected[k], rtol=1e-4, atol=1e-5):
                    error = (got - expected[k]).abs().max().item()
                    failures.append(f"thread {k}, round {r}: max error {error:.3g}")
                    return
        except Exception as err:  # noqa: BLE001 - reported to the main thread
            failures.append(f"thread {k}: {type(err).__name__}: {err}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(per_thread))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return failures


@pytest.fixture(scope="module")
def case() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], list, list]:
    """Quick BERT (GEMMs, softmax and layer-norm rows, elementwise chains), a different input
    per thread, and eager's answer for each."""
    model, example = models.build("bert", quick=True)
    per_thread = [_inputs(example, seed) for seed in range(THREADS)]
    with torch.no_grad():
        expected = [model(*x) for x in per_thread]
    return model, example, per_thread, expected


def test_kiln_compile_from_8_threads_matches_eager(case, kernel_options: Options) -> None:
    model, example, per_thread, expected = case
    compiled = kiln.compile(model, example, kernel_options)
    (graph,) = compiled.report.graphs
    assert graph.planned_peak_bytes > 0  # intermediates live in a planned arena
    assert any(k.kind == "generated" for k in graph.kernels)
    assert _hammer(compiled, per_thread, expected) == []


def test_torch_compile_from_8_threads_matches_eager(case, kernel_options: Options) -> None:
    model, example, per_thread, expected = case
    options = {"kernel_cache_dir": kernel_options.kernel_cache_dir, "measure_kernels": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        compiled = torch.compile(model, backend="kiln", options=options)
        with torch.no_grad():
            compiled(*example)  # compiled once, before the threads start

    def run(*x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return compiled(*x)

    assert _hammer(run, per_thread, expected) == []
