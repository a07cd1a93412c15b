"""The machine's FMA peak, measured: a generated C kernel with independent fp32 FMA chains on
every thread (a rate, not a latency), so benchmarks can state a fraction of the hardware's
limit.

    probe = fma_probe(options)          # None without a C compiler
    probe.gflops(threads=2)             # e.g. 234 on 2 Zen 4 cores with AVX-512, 190 on Zen 3

A kernel's or a model's "% of FMA peak" in `kiln bench` and benchmarks/ops.py is its GFLOP/s
over this figure.

    full_rate_512(options)              # True on an AVX-512 Xeon with two 512-bit FMA pipes
                                        # (ratio 1.86); Zen 4 splits 512-bit FMAs (about 1)

`full_rate_512` says whether 512-bit FMAs retire twice as many lanes a cycle as 256-bit ones,
measured once per machine with the same probe on both widths and recorded in the kernel cache
(schedules whose best register tile depends on it read it: `kiln.kernels.gemm`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import time
from dataclasses import dataclass

from kiln.codegen.build import (
    CompilerUnavailable,
    build,
    host_identity,
    toolchain,
    writable_cache_dir,
    write_atomic,
)
from kiln.codegen.isa import Isa, target_isa
from kiln.options import Options

__all__ = ["FmaProbe", "fma_probe", "full_rate_512", "width_ratio"]

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


def probe_source(isa: Isa, lanes: int | None = None) -> str:
    """The probe's C source for ``isa``: 12 chains of one register each (``f32_lanes``), or
    of ``lanes``-wide vectors (narrower than the ISA's: one register each too)."""
    return PEAK_C.format(lanes=lanes or isa.f32_lanes)


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
def _probe(compiler: str, flags: tuple[str, ...], cache: str,
           lanes: int | None = None) -> FmaProbe | None:
    options = Options(c_compiler=compiler, c_flags=flags, kernel_cache_dir=cache)
    isa = target_isa(options)
    lanes = lanes or isa.f32_lanes
    lib = build(probe_source(isa, lanes), "fma_peak", options)
    if isinstance(lib, CompilerUnavailable):
        return None
    fn = lib.function("kiln_peak")
    fn.argtypes = [ctypes.c_int64, ctypes.c_int]
    fn.restype = ctypes.c_double
    team = lib.function("kiln_threads")
    team.restype = ctypes.c_int
    return FmaProbe(fn, int(team()), lanes)


# 512-bit FMAs at full rate give about 2x the 256-bit lanes a cycle, split ones about 1x
FULL_RATE_RATIO = 1.5
# rounds of `width_ratio`: each width's best rate over them
RATIO_ROUNDS = 4
# a ratio strictly between these is neither signature (about 1 split, about 2 full rate):
# other work took the core from some of the runs (2 of 52 probes in fresh caches on one
# Xeon: 1.32, and 1.47 while a test suite ran beside it; the others 1.76-2.46); it answers
# this process but is not recorded, so the next compile measures again
AMBIGUOUS_RATIOS = (1.25, 1.75)


def width_ratio(wide: FmaProbe, narrow: FmaProbe, rounds: int = RATIO_ROUNDS) -> float:
    """The wide probe's best one-thread rate over the narrow one's, the two measured in
    turns, ``rounds`` times each: another process busy for a while (a test suite's second
    worker, a build) then slows both widths' runs alike, where measuring one width and then
    the other could slow one of them only, and record a wrong answer for good."""
    best_wide = best_narrow = 0.0
    for _ in range(rounds):
        best_wide = max(best_wide, wide.gflops(threads=1, iters=1_000_000))
        best_narrow = max(best_narrow, narrow.gflops(threads=1, iters=1_000_000))
    return best_wide / best_narrow


def full_rate_512(options: Options) -> bool:
    """Whether this machine's 512-bit FMAs run at full rate: twice the fp32 lanes a cycle of
    its 256-bit ones (a Xeon with two 512-bit FMA pipes), not the same lanes (Zen 4, which
    splits each in two halves, or a Xeon with one 512-bit pipe). False unless the kernels
    are built for AVX-512. Measured on one thread, the two widths in turns (`width_ratio`),
    then read back from ``<kernel cache>/fma-width-*.json`` (one per host, compiler and flags),
    so every compile on this machine sees the same answer; a ratio in `AMBIGUOUS_RATIOS`
    (another process was busy) is used but not recorded."""
    if target_isa(options) is not Isa.AVX512:
        return False
    chain = toolchain(options)
    if isinstance(chain, CompilerUnavailable):
        return False
    return _full_rate_512(options.c_compiler, options.c_flags, options.kernel_cache_dir,
                          chain.compiler, chain.version)


@functools.lru_cache(maxsize=4)
def _full_rate_512(compiler: str, flags: tuple[str, ...], cache: str, path: str,
                   version: str) -> bool:
    ident = hashlib.sha256(repr((host_identity(), path, version, flags)).encode()).hexdigest()
    # (beside the compiler probe's record: the cache's subfolders hold kernels only)
    record = writable_cache_dir(Options(kernel_cache_dir=cache)) / f"fma-width-{ident[:16]}.json"
    try:
        return bool(json.loads(record.read_text())["full_rate_512"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    wide, narrow = _probe(compiler, flags, cache, 16), _probe(compiler, flags, cache, 8)
    if wide is None or narrow is None:
        return False
    ratio = width_ratio(wide, narrow)
    full = ratio >= FULL_RATE_RATIO
    if AMBIGUOUS_RATIOS[0] < ratio < AMBIGUOUS_RATIOS[1]:
        return full
    try:
        write_atomic(record, json.dumps({"full_rate_512": full, "ratio": ratio}).encode())
    except OSError:
        pass
    return full
