"""ONNX backend node tests through kiln's ONNX importer and runtime: how many pass.

    python benchmarks/onnx_conformance.py [--opt-level 1] [--filter abs] [--show wrong,crash]

Prints one line per case that did not pass (as --show asks) and the counts: passing /
applicable / total. kiln.frontend.onnx.conformance says what "applicable" means.
"""

from __future__ import annotations

import argparse
import logging
import time

from kiln.frontend.onnx.conformance import Outcome, node_cases, run_case, summarize
from kiln.options import Options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opt-level", type=int, default=1)
    parser.add_argument("--filter", default="", help="only cases whose name contains this")
    parser.add_argument("--show", default="wrong,crash,refused",
                        help="outcomes to list, comma-separated (pass, wrong, refused, "
                             "crash, n/a)")
    args = parser.parse_args()
    logging.getLogger("kiln").setLevel(logging.ERROR)
    show = {Outcome(s) for s in args.show.split(",") if s}
    options = Options(opt_level=args.opt_level)
    cases = [c for c in node_cases() if args.filter in c.name]
    start = time.perf_counter()
    results = []
    for case in cases:
        result = run_case(case, options)
        results.append(result)
        if result.outcome in show:
            print(f"{result.outcome.value:8} {result.name}: {result.detail[:160]}", flush=True)
    counts = summarize(results)
    applicable = len(results) - counts[Outcome.NOT_APPLICABLE]
    print(f"\n{counts[Outcome.PASS]} passing / {applicable} applicable / {len(results)} total "
          f"({100 * counts[Outcome.PASS] / max(applicable, 1):.1f}% of applicable); "
          + ", ".join(f"{o.value} {n}" for o, n in counts.items())
          + f"; {time.perf_counter() - start:.0f} s")
    translated = sum(1 for r in results if r.outcome is Outcome.PASS and not r.run_as_is)
    print(f"of the passing: {translated} with every node translated by kiln, "
          f"{counts[Outcome.PASS] - translated} with some node run as it is (onnx.reference)")


if __name__ == "__main__":
    main()
