"""End to end: transformer zoo models with kiln's generated fused kernels.

    python benchmarks/e2e_kernels.py [--quick] [--gemm] [--models bert,gpt2,vit_b16] [--rounds 15]

For each model, in one process: eager PyTorch, kiln with library calls only
(``generated_kernels=False``), kiln with generated kernels (``generated_kernels=True``) and,
with ``--gemm``, kiln with generated GEMMs too where they measure faster at compile time.
The three contenders are timed in interleaved rounds (each round runs every contender for a
batch of calls long enough to measure), so a burst of load on a shared machine hits all of
them alike; medians are reported, with the interquartile spread, the ratios, the relative error
against eager, and the kernels the generated variant uses. The load average is printed before
and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch

import kiln
from kiln import models

MODELS = ("bert", "gpt2", "vit_b16")
Fn = Callable[[], object]


def batch_size(fn: Fn, min_sample_s: float) -> int:
    """Calls per sample so that one sample lasts at least ``min_sample_s``."""
    fn()
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - start >= min_sample_s:
            return n
        n *= 2


def interleaved(contenders: dict[str, Fn], rounds: int, min_sample_s: float
                ) -> dict[str, list[float]]:
    """Per-call seconds of each contender, one sample per round, contenders interleaved."""
    sizes = {name: batch_size(fn, min_sample_s) for name, fn in contenders.items()}
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            n = sizes[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - start) / n)
    return samples


def spread(xs: list[float]) -> float:
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / statistics.median(xs)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).double().norm() / b.double().norm().clamp_min(1e-30))


def bench_model(name: str, quick: bool, rounds: int, min_sample_s: float,
                gemm: bool = False) -> dict[str, object]:
    model, inputs = models.build(name, quick=quick)
    compiled = {}
    compile_s = {}
    variants = [("kiln lib", kiln.Options(generated_kernels=False)),
                ("kiln gen", kiln.Options(generated_kernels=True))]
    if gemm:
        variants.append(("kiln gen+gemm", kiln.Options(generated_kernels=True,
                                                       generated_gemm=True)))
    for label, options in variants:
        start = time.perf_counter()
        compiled[label] = kiln.compile(model, inputs, options)
        compile_s[label] = time.perf_counter() - start
    with torch.no_grad():
        expected = model(*inputs)
        errors = {label: rel_err(c(*inputs), expected) for label, c in compiled.items()}

        def eager() -> object:
            return model(*inputs)
        contenders: dict[str, Fn] = {"eager": eager}
        for label, c in compiled.items():
            contenders[label] = lambda c=c: c(*inputs)
        samples = interleaved(contenders, rounds, min_sample_s)
    kernels = compiled["kiln gen"].report.kernels
    generated = [k for k in kernels if k.kind == "generated"]
    gemms = [k for k in compiled.get("kiln gen+gemm", compiled["kiln gen"]).report.kernels
             if k.kind == "generated" and k.ops in (("mm",), ("addmm",))]
    return {
        "gemms": sorted({f"{k.nodes[0]}: {k.trace.splitlines()[-1]}" for k in gemms}),  # type: ignore
        "model": name, "samples": samples, "errors": errors, "compile_s": compile_s,
        "generated": len(generated), "kernels": len(kernels),
        "fused": sorted({"+".join(k.ops) for k in generated}),
    }


def table(results: list[dict[str, object]]) -> str:
    header = ["model", "eager ms", "kiln lib ms", "kiln gen ms", "gen vs lib", "gen vs eager",
              "lib vs eager", "spread (each)", "rel err gen", "kernels gen/all", "compile s l/g"]
    if any("kiln gen+gemm" in r["samples"] for r in results):  # type: ignore
        header[4:4] = ["gen+gemm ms", "gen+gemm vs lib"]
    rows = [header]
    for r in results:
        med = {k: statistics.median(v) for k, v in r["samples"].items()}  # type: ignore
        sp = "/".join(f"{spread(v):.0%}" for v in r["samples"].values())  # type: ignore
        cs = r["compile_s"]
        extra = []
        if "kiln gen+gemm" in med:
            g = med["kiln gen+gemm"]
            extra = [f"{g * 1e3:.3f}", f"{med['kiln lib'] / g:.2f}x"]
        rows.append([
            str(r["model"]), f"{med['eager'] * 1e3:.3f}", f"{med['kiln lib'] * 1e3:.3f}",
            f"{med['kiln gen'] * 1e3:.3f}", *extra, f"{med['kiln lib'] / med['kiln gen']:.2f}x",
            f"{med['eager'] / med['kiln gen']:.2f}x", f"{med['eager'] / med['kiln lib']:.2f}x",
            sp, f"{r['errors']['kiln gen']:.1e}",  # type: ignore
            f"{r['generated']}/{r['kernels']}",
            f"{cs['kiln lib']:.1f}/{cs['kiln gen']:.1f}"])  # type: ignore
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small zoo variants")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--min-sample-ms", type=float, default=20.0)
    parser.add_argument("--threads", type=int, help="torch intra-op threads")
    parser.add_argument("--gemm", action="store_true",
                        help="also kiln with generated_gemm=True (GEMMs timed at compile time)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average before: {os.getloadavg()}", file=sys.stderr)
    results = []
    for name in args.models.split(","):
        results.append(bench_model(name.strip(), args.quick, args.rounds,
                                   args.min_sample_ms / 1e3, args.gemm))
    print(table(results))
    for r in results:
        print(f"* {r['model']}: generated kernels: {', '.join(r['fused'])}")  # type: ignore
        for line in r["gemms"]:  # type: ignore
            print(f"  - generated GEMM {line}")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
