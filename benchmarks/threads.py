"""Do kiln's OpenMP threads and ATen's compete? An ATen call alone and right after a kiln kernel.

    python benchmarks/threads.py [--threads 2] [--blocks 15] [--reps 4] [--repeats 3]
                                 [--no-second-runtime]

Prints, in one process:

* the OpenMP runtimes involved: the libgomp files mapped into this process, ``ldd`` lines of
  libtorch_cpu and of a kiln kernel library, and the process's threads;
* spinning: the CPU time the process burns while its main thread sleeps for 20 ms right after
  a kiln kernel and right after an ATen call (an idle pool that spins shows up here);
* timings of two ATen calls, each as the consumer of the op before it in a BERT-base layer:
  ``F.linear`` (x f32[128, 768], weight f32[3072, 768]) after a layernorm over x, and
  ``torch.mm`` (f32[128, 3072] @ f32[3072, 768]) after a softmax over its left operand.
  Only the ATen call is timed, in four settings: alone; right after the kiln kernel; right
  after the same op done by eager PyTorch into the same buffer (the control: same data
  touched, ATen's own pool); and right after the kiln kernel built against a second OpenMP
  runtime: a renamed copy of the libgomp torch uses (as auditwheel renames it), loaded with
  RTLD_DEEPBIND so that the kernel's OpenMP calls bind to it rather than to the libgomp torch
  put in the global symbol scope (as a kernel built by clang against libomp would): what two
  thread pools cost. The settings are interleaved in blocks (their order rotates from block
  to block); medians over all calls, and the spread (interquartile range / median).

Timings are noisy on a shared machine: run with ``--repeats 3`` and compare repeats.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from kiln.codegen.build import CompilerUnavailable, toolchain
from kiln.codegen.c import CRenderer
from kiln.codegen.kernel import CompiledKernel, compile_kernel
from kiln.options import Options

try:  # the row kernels' schedules are moving from codegen/ to kernels/
    from kiln.kernels.rows_schedule import layernorm_rows, softmax_rows
except ImportError:  # pragma: no cover - older tree
    from kiln.codegen.fused import layernorm_rows, softmax_rows  # type: ignore[no-redef]

Fn = Callable[[], object]
aten = torch.ops.aten
ROWS, HIDDEN, FFN = 128, 768, 3072


def mapped_openmp() -> list[str]:
    """The OpenMP runtime files mapped into this process (Linux only)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return ["(no /proc/self/maps)"]
    names = ("libgom", "libomp", "libiomp")  # libgom: also a renamed copy (libgomX)
    return sorted({line.split()[-1] for line in lines if any(n in line for n in names)})


def ldd_openmp(library: Path) -> list[str]:
    try:
        done = subprocess.run(["ldd", str(library)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return [f"(ldd failed: {exc})"]
    return [line.strip() for line in done.stdout.splitlines() if "omp" in line]


def threads() -> list[str]:
    try:
        tids = sorted(os.listdir("/proc/self/task"), key=int)
    except OSError:
        return []
    return [f"{t}:{Path(f'/proc/self/task/{t}/comm').read_text().strip()}" for t in tids]


def thread_cpu_ns() -> dict[str, int]:
    """CPU time (ns) each thread of this process has run so far (Linux schedstat)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            out[tid] = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def spinning(fn: Fn, window_s: float = 0.02, samples: int = 9) -> tuple[float, int]:
    """Median CPU ms the other threads burn while the main thread sleeps ``window_s`` right
    after ``fn()``, and the most threads seen burning over 0.5 ms in one window."""
    main = str(threading.get_native_id())
    burned, busiest = [], 0
    for _ in range(samples):
        fn()
        before = thread_cpu_ns()
        time.sleep(window_s)
        after = thread_cpu_ns()
        used = [(ns - before.get(t, 0)) / 1e6 for t, ns in after.items() if t != main]
        burned.append(sum(used))
        busiest = max(busiest, sum(ms > 0.5 for ms in used))
    return statistics.median(burned), busiest


def timed_after(before: Fn | None, call: Fn) -> Callable[[], float]:
    """One sample: run ``before`` (untimed), then time ``call``."""
    def sample() -> float:
        if before is not None:
            before()
        t0 = time.perf_counter()
        call()
        return time.perf_counter() - t0
    return sample


def interleaved(settings: dict[str, Callable[[], float]], blocks: int,
                reps: int) -> dict[str, tuple[float, float]]:
    """(median s, spread) per setting; each block runs every setting ``reps`` times, the order
    of settings rotating from block to block; the first call of each block is untimed."""
    names = list(settings)
    times: dict[str, list[float]] = {n: [] for n in names}
    for b in range(blocks):
        order = names[b % len(names):] + names[: b % len(names)]
        for name in order:
            settings[name]()  # untimed: wake this setting's pool and caches
            times[name].extend(settings[name]() for _ in range(reps))
    out = {}
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4)
        med = statistics.median(ts)
        out[name] = (med, (q[2] - q[0]) / med)
    return out


def second_runtime_kernel(kernel: CompiledKernel, options: Options,
                          folder: Path) -> Callable[..., None] | None:
    """``kernel`` rebuilt against a renamed copy of the libgomp in use and bound to it, so
    this process runs two OpenMP thread pools; None if there is no libgomp in use or no
    compiler. (Linked alone is not enough: torch loads its libgomp RTLD_GLOBAL, through
    libtorch_global_deps.so, and a library loaded later binds its GOMP_* calls to it.)"""
    chain = toolchain(options)
    gomp = [p for p in mapped_openmp() if "libgomp" in p]
    if isinstance(chain, CompilerUnavailable) or not gomp or not chain.openmp:
        return None
    data = Path(gomp[0]).read_bytes()
    if data.count(b"libgomp.so.1\0") != 1:
        return None
    (folder / "libgomX.so.1").write_bytes(data.replace(b"libgomp.so.1\0", b"libgomX.so.1\0"))
    source, library = folder / "kernel.c", folder / "kernel.so"
    source.write_text(kernel.source)
    command = [chain.compiler, *chain.flags, "-shared", "-fPIC", "-o", str(library), str(source),
               "-Wl,--as-needed", str(folder / "libgomX.so.1"), f"-Wl,-rpath,{folder}",
               *[lib for lib in chain.libs if lib.startswith("-l")]]
    subprocess.run(command, check=True, capture_output=True)
    # DEEPBIND: bind to libgomX, not to the libgomp torch put in the global scope
    cdll = ctypes.CDLL(str(library), mode=os.RTLD_DEEPBIND)
    cdll.kiln_set_num_threads(torch.get_num_threads())
    fn = getattr(cdll, CRenderer().entry_name(kernel.func))
    fn.argtypes = [ctypes.c_void_p] * len(kernel.func.params)
    fn.restype = None
    return lambda *tensors: fn(*[t.data_ptr() for t in tensors])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-second-runtime", action="store_true",
                        help="skip the setting with a second OpenMP runtime")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    options = Options.from_env()

    ln = compile_kernel(layernorm_rows(ROWS, HIDDEN).func, options)
    sm = compile_kernel(softmax_rows(ROWS, FFN).func, options)
    if not isinstance(ln, CompiledKernel) or not isinstance(sm, CompiledKernel):
        sys.exit(f"no C compiler: {ln}")
    x, gamma, beta = torch.randn(ROWS, HIDDEN), torch.randn(HIDDEN), torch.randn(HIDDEN)
    x_ln = torch.empty(ROWS, HIDDEN)
    weight = torch.randn(FFN, HIDDEN)
    s = torch.randn(ROWS, FFN)
    a = torch.empty(ROWS, FFN)
    b = torch.randn(FFN, HIDDEN)

    def linear() -> object:
        return F.linear(x_ln, weight)

    def mm() -> object:
        return torch.mm(a, b)

    mean, rstd = torch.empty(ROWS, 1), torch.empty(ROWS, 1)

    def eager_layernorm() -> object:  # the control: the same op into the same buffer
        return aten.native_layer_norm.out(x, (HIDDEN,), gamma, beta, 1e-5,
                                          out0=x_ln, out1=mean, out2=rstd)

    def eager_softmax() -> object:
        return aten._softmax.out(s, -1, False, out=a)

    ln(x, gamma, beta, x_ln)
    sm(s, a)

    tmp = tempfile.TemporaryDirectory(prefix="kiln-threads-")
    ln2 = sm2 = None
    if not args.no_second_runtime:
        ln2 = second_runtime_kernel(ln, options, Path(tmp.name))
        folder = Path(tmp.name) / "sm"
        folder.mkdir()
        sm2 = second_runtime_kernel(sm, options, folder)

    torch_lib = Path(torch.__file__).parent / "lib"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs, pid {os.getpid()}")
    print("OpenMP runtimes mapped:", *mapped_openmp(), sep="\n  ")
    print("ldd libtorch_cpu.so:", *ldd_openmp(torch_lib / "libtorch_cpu.so"), sep="\n  ")
    print(f"ldd {sm.library.path.name}:", *ldd_openmp(sm.library.path), sep="\n  ")
    print(f"threads ({len(threads())}):", " ".join(threads()))
    print("\nCPU ms other threads burn while the main thread sleeps 20 ms right after a call\n"
          "(idle OpenMP workers spinning), median of 9, and how many threads spun:")
    spins = {"after kiln softmax": lambda: sm(s, a), "after torch.mm": mm,
             "after nothing": lambda: None}
    if sm2 is not None:
        spins["after kiln softmax (2nd runtime)"] = lambda: sm2(s, a)
    for name, fn in spins.items():
        ms, busy = spinning(fn)
        print(f"  {name:36s} {ms:6.2f} ms  {busy} thread(s)")

    cases = {
        "F.linear 128x768 @ 3072x768^T": (linear, lambda: ln(x, gamma, beta, x_ln),
                                          eager_layernorm,
                                          (lambda: ln2(x, gamma, beta, x_ln)) if ln2 else None),
        "torch.mm 128x3072 @ 3072x768": (mm, lambda: sm(s, a), eager_softmax,
                                         (lambda: sm2(s, a)) if sm2 else None),
    }
    for repeat in range(args.repeats):
        print(f"\nrepeat {repeat + 1}: median ms of the ATen call (spread), "
              f"{args.blocks} blocks x {args.reps} calls")
        for case, (call, kiln_before, eager_before, second_before) in cases.items():
            settings = {
                "alone": timed_after(None, call),
                "after kiln kernel": timed_after(kiln_before, call),
                "after eager op": timed_after(eager_before, call),
            }
            if second_before is not None:
                settings["after kiln, 2nd runtime"] = timed_after(second_before, call)
            result = interleaved(settings, args.blocks, args.reps)
            alone = result["alone"][0]
            cells = "  ".join(f"{name} {med * 1e3:6.3f} ({spread:4.0%}) x{med / alone:4.2f}"
                              for name, (med, spread) in result.items())
            print(f"  {case:30s} {cells}")
    print("\nthreads at exit:", len(threads()))
    tmp.cleanup()


if __name__ == "__main__":
    main()
