"""What the search strategies do to each model's graph, and how long they take.

    python benchmarks/search.py [--models inception,bert] [--quick] [--json out.json]

For each model: the graph as captured, then the pass pipeline with each strategy
(``Options(search=greedy|backtrack|saturate)``, measured confirmation on as by default).
Printed per model and strategy: the search pass's seconds (the issue's budget is 10 s per
model), its estimated cost as received / after greedy / chosen, what was chosen, and the
node count that runs. End-to-end latency of the compiled models is `kiln bench --search
greedy backtrack saturate` (timed side by side with eager and the peers).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch

from kiln import models
from kiln.options import SEARCH_STRATEGIES, Options
from kiln.passes.pipeline import run_pipeline


def capture(name: str, quick: bool):  # -> kiln.ir.Graph
    from kiln.frontend.export import _freeze
    from kiln.frontend.importer import import_fx

    model, inputs = models.build(name, quick=quick)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, inputs).run_decompositions()
        frozen, _ = _freeze(program)
        return import_fx(program.graph_module, frozen).graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(models.names(models.Origin.BUILTIN)))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rows = []
    for name in args.models.split(","):
        graph = capture(name, args.quick)
        for strategy in SEARCH_STRATEGIES:
            start = time.perf_counter()
            out, records, _ = run_pipeline(graph, Options(search=strategy))
            total = time.perf_counter() - start
            record = next((r for r in records if r.search is not None), None)
            row = {"model": name, "strategy": strategy, "pipeline_s": total,
                   "nodes": out.num_ops()}
            if record is not None:
                s = record.search
                row.update(search_s=record.seconds, cost_input_ms=s.cost_input * 1e3,
                           cost_greedy_ms=s.cost_greedy * 1e3, cost_chosen_ms=s.cost_chosen * 1e3,
                           chosen=s.chosen, stopped=s.stopped, measured=s.measured,
                           describe=s.describe())
            rows.append(row)
            extra = (f"search {row['search_s']:6.2f} s, est. {row['cost_greedy_ms']:8.3f} ms "
                     f"greedy -> {row['cost_chosen_ms']:8.3f} ms chosen ({row['chosen']}, "
                     f"stopped: {row['stopped']})" if record is not None else "")
            print(f"{name:<14} {strategy:<10} {row['nodes']:>5} nodes  pipeline "
                  f"{total:6.2f} s  {extra}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
