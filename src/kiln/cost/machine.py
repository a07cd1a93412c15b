"""The machine's FMA peak, measured: a generated C kernel with independent fp32 FMA chains on
every thread (a rate, not a latency), so benchmarks can state a fraction of the hardware's
limit.

    probe = fma_probe(options)          # None without a C compiler
    probe.gflops(threads=2)             # e.g. 234 on 2 Zen 4 cores with AVX-512, 190 on Zen 3

A kernel's or a model's "% of FMA peak" in `kiln bench` and benchmarks/ops.py is its GFLOP/s
over this figure.
"""

from __future__ import annotations

import ctypes
import functools
import time
from dataclasses import dataclass

from kiln.codegen.build import CompilerUnavailable, build
from kiln.codegen.isa import Isa, target_isa
from kiln.options import Options

__all__ = ["FmaProbe", "fma_probe"]

CHAINS = 12  # independent vector chains per thread: more than FMA latency x FMA ports
# One chain's vector is one register of the ISA the kernels are built for: a wider vector
# type is split into several registers, and 12 chains of 64-byte vectors on AVX2's 16 ymm
# registers spill on every step (Zen 3: 8 GFLOP/s a core, a twelfth of its peak).
PEAK_C = """
#include <omp.h>
#include <stdint.h>
#define LANES {lanes}
typedef float vec __attribute__((vector_size(LANES * 4)));
/* Independent FMA chains on each of `threads` threads: the peak rate, not a latency. */
double kiln_peak(int64_t iters, int threads) {{
  double total = 0.0;
  #pragma omp parallel num_threads(threads) reduction(+:total)
  {{
    /* distinct starting values, so the compiler cannot merge the chains */
    vec a0 = {{0}}, a1 = {{0}}, a2 = {{0}}, a3 = {{0}}, a4 = {{0}}, a5 = {{0}};
    vec a6 = {{0}}, a7 = {{0}}, a8 = {{0}}, a9 = {{0}}, a10 = {{0}}, a11 = {{0}};
    vec x = {{0}}, y = {{0}};
    for (int i = 0; i < LANES; ++i) {{
      x[i] = 1.0f - 1e-7f * i; y[i] = 1e-7f;
      a0[i] = 0.1f; a1[i] = 0.2f; a2[i] = 0.3f; a3[i] = 0.4f; a4[i] = 0.5f; a5[i] = 0.6f;
      a6[i] = 0.7f; a7[i] = 0.8f; a8[i] = 0.9f; a9[i] = 1.1f; a10[i] = 1.2f; a11[i] = 1.3f;
    }}
    for (int64_t it = 0; it < iters; ++it) {{
      a0 = a0 * x + y; a1 = a1 * x + y; a2 = a2 * x + y; a3 = a3 * x + y;
      a4 = a4 * x + y; a5 = a5 * x + y; a6 = a6 * x + y; a7 = a7 * x + y;
      a8 = a8 * x + y; a9 = a9 * x + y; a10 = a10 * x + y; a11 = a11 * x + y;
    }}
    vec s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
    for (int i = 0; i < LANES; ++i) total += s[i];
  }}
  return total;
}}
int kiln_threads(void) {{
  int n = 1;
  #pragma omp parallel
  {{
    #pragma omp single
    n = omp_get_num_threads();
  }}
  return n;
}}
"""


def probe_source(isa: Isa) -> str:
    """The probe's C source for ``isa``: 12 chains of one register each (``f32_lanes``)."""
    return PEAK_C.format(lanes=isa.f32_lanes)


@dataclass(frozen=True, eq=False)  # one per process and toolchain: compared by identity
class FmaProbe:
    """The compiled probe: ``run(iters, threads)`` does ``iters`` steps of every chain."""

    run_c: object
    threads: int  # the OpenMP team size the kernels get
    lanes: int = 16  # fp32 lanes of one chain's vector

    def run(self, iters: int, threads: int) -> float:
        return self.run_c(iters, threads)  # type: ignore[operator]

    def gflops(self, threads: int | None = None, iters: int = 5_000_000) -> float:
        """The best of three timed runs on ``threads`` threads (default: the team size)."""
        threads = threads or self.threads
        self.run(iters // 10, threads)  # wake the team, settle the clocks
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            self.run(iters, threads)
            best = min(best, time.perf_counter() - start)
        return threads * self.flops_per_iter * iters / best / 1e9

    @property
    def flops_per_iter(self) -> int:
        return CHAINS * self.lanes * 2


def fma_probe(options: Options) -> FmaProbe | None:
    return _probe(options.c_compiler, options.c_flags, options.kernel_cache_dir)


@functools.lru_cache(maxsize=4)
def _probe(compiler: str, flags: tuple[str, ...], cache: str) -> FmaProbe | None:
    options = Options(c_compiler=compiler, c_flags=flags, kernel_cache_dir=cache)
    isa = target_isa(options)
    lib = build(probe_source(isa), "fma_peak", options)
    if isinstance(lib, CompilerUnavailable):
        return None
    fn = lib.function("kiln_peak")
    fn.argtypes = [ctypes.c_int64, ctypes.c_int]
    fn.restype = ctypes.c_double
    team = lib.function("kiln_threads")
    team.restype = ctypes.c_int
    return FmaProbe(fn, int(team()), isa.f32_lanes)
