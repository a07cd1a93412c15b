"""Memory across repeated compiles: does compiling one model again and again grow the process?

    python benchmarks/compile_memory.py [--model gpt2] [--times 10] [--quick] [--keep]
                                        [--cache-dir DIR] [--frontend export|dynamo]

Compiles the model ``--times`` times in one process (``kiln.compile``, or
``torch.compile(backend="kiln")`` with ``--frontend dynamo``), calls each compiled model once,
drops it (unless ``--keep``), collects garbage and prints after each compile: the resident set
size (VmRSS from /proc/self/status; no psutil needed), the RSS once glibc's malloc_trim has
handed the allocator's free memory back to the system (what is left is in use), the bytes of
live CPU tensors, and whether the dropped compiled model was freed (a weak reference). The
first compile fills the kernel cache and the decisions database (in a fresh folder unless
``--cache-dir``), the later ones are warm. The default model is the built-in zoo model with the
most parameters. A steady state after the first one or two compiles is the expected shape;
growth on every compile is a leak.

GPT-2 (124 M parameters, 475 MiB of weights), 2-core x86 VM shared with other jobs, torch 2.13:
compile 1 (cold cache) RSS 831 -> 1878 MiB; compiles 2-10 between 2004 and 2053 MiB, no trend;
with malloc_trim, 795 MiB before, then 881, 888, 889, ... 896 MiB after compile 10 (about
1 MiB a compile: torch.fx keeps the generated source of every GraphModule that torch.export
makes, in its eval cache and linecache); live tensors 487 MiB throughout (the weights), and
every compiled model freed. The untrimmed plateau is memory glibc keeps for reuse.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import sys
import tempfile
import time
import warnings
import weakref

import torch

import kiln
from kiln import models


def rss_mib() -> float:
    """Resident set size of this process, from /proc/self/status (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def trimmed_rss_mib() -> float:
    """RSS after glibc's malloc_trim(0): freed heap memory handed back to the system."""
    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):  # not glibc
        return float("nan")
    return rss_mib()


def live_tensor_mib() -> float:
    """Bytes of the distinct CPU storages that live tensors reach (the garbage collector's view)."""
    seen: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance on deprecated module attributes warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor) and not obj.is_meta and obj.is_cpu:
                    storage = obj.untyped_storage()
                    seen[storage.data_ptr()] = storage.nbytes()
            except (RuntimeError, NotImplementedError):  # fake, functional, sparse tensors
                continue
    return sum(seen.values()) / 2**20


def _fate(alive: weakref.ref | None, keep: bool) -> str:
    if keep:
        return "kept"
    if alive is None:  # torch.compile's wrapper: nothing of kiln's to follow
        return ""
    return "freed" if alive() is None else "NOT FREED"


def largest_builtin() -> str:
    """The built-in zoo model with the most parameters (full size)."""
    def params(name: str) -> int:
        model, _ = models.build(name, quick=False)
        return sum(p.numel() for p in model.parameters())
    return max(models.names(models.Origin.BUILTIN), key=params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="zoo model (default: the largest built-in)")
    parser.add_argument("--times", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="the quick variant of the model")
    parser.add_argument("--keep", action="store_true", help="keep every compiled model alive")
    parser.add_argument("--cache-dir", default="", help="kernel cache (default: a fresh one)")
    parser.add_argument("--frontend", choices=("export", "dynamo"), default="export")
    args = parser.parse_args()
    name = args.model or largest_builtin()
    cache = args.cache_dir or tempfile.mkdtemp(prefix="kiln-compile-memory-")
    options = kiln.Options(kernel_cache_dir=cache)
    model, inputs = models.build(name, quick=args.quick)
    params_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    with torch.no_grad():
        model(*inputs)
    gc.collect()
    print(f"{name}{' (quick)' if args.quick else ''}: {params_mib:.0f} MiB of weights, "
          f"frontend {args.frontend}, cache {cache}, torch {torch.__version__}")
    print(f"before:            RSS {rss_mib():7.1f} MiB   trimmed {trimmed_rss_mib():7.1f} MiB"
          f"   live tensors {live_tensor_mib():7.1f} MiB")
    kept = []
    for i in range(1, args.times + 1):
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if args.frontend == "export":
                compiled = kiln.compile(model, inputs, options)
            else:
                torch._dynamo.reset()  # a fresh torch.compile each time, as a new script would
                compiled = torch.compile(model, backend="kiln",
                                         options={"kernel_cache_dir": cache})
            with torch.no_grad():
                compiled(*inputs)
        seconds = time.perf_counter() - start
        if args.keep:
            kept.append(compiled)
        alive = weakref.ref(compiled) if args.frontend == "export" else None
        del compiled
        gc.collect()
        rss = rss_mib()
        print(f"compile {i:2d}: {seconds:5.1f} s   RSS {rss:7.1f} MiB   trimmed "
              f"{trimmed_rss_mib():7.1f} MiB   live tensors {live_tensor_mib():7.1f} MiB   "
              f"{_fate(alive, args.keep)}",
              flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
