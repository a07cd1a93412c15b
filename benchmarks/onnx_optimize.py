"""kiln optimize on the quick zoo models: ONNX nodes before/after and ONNX Runtime latency of
the model as torch.onnx.export writes it against kiln's optimized ONNX (numbers, not pass/fail).

    python benchmarks/onnx_optimize.py [--full] [--contrib] [--threads 2] [--runs 20]

Both models run in one process, in interleaved rounds, an untimed call first; medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import onnxruntime

from kiln import models
from kiln.export.onnx import optimize


def session(model, threads: int) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(model.SerializeToString(), options,
                                        providers=["CPUExecutionProvider"])


def medians(sessions, feeds, runs: int) -> list[float]:
    times: list[list[float]] = [[] for _ in sessions]
    for s in sessions:
        s.run(None, feeds)  # untimed
    for _ in range(runs):
        for i, s in enumerate(sessions):
            start = time.perf_counter()
            s.run(None, feeds)
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="full-size models (default quick)")
    parser.add_argument("--contrib", action="store_true", help="com.microsoft fused ops")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    print("| model | nodes before | nodes after | ORT original ms | ORT kiln ms | ratio | "
          "max rel. error |")
    print("|---|---|---|---|---|---|---|")
    for name in models.names(models.Origin.BUILTIN):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = optimize(name, quick=not args.full, contrib_ops=args.contrib)
        before, after = medians([session(result.original, args.threads),
                                 session(result.model, args.threads)], result.feeds, args.runs)
        error = result.max_relative_error(args.threads)
        print(f"| {name} | {result.nodes_before} | {result.nodes_after} | {before * 1e3:.3f} | "
              f"{after * 1e3:.3f} | {before / after:.2f} | {error:.1e} |", flush=True)


if __name__ == "__main__":
    main()
