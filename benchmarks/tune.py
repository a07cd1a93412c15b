"""The tuner, measured: the learned cost model against random search, and the transfer of a
model trained on one network's kernels to another's.

    python benchmarks/tune.py --models bert --trials 40 --kernels 3 --json tune.json
    python benchmarks/tune.py --models bert --transfer-to gpt2 --trials 40

For each of the first ``--kernels`` workloads of each model (`kiln.tune.workloads`), the same
number of trials is run twice from an empty database: with the cost model, and with random
picks (same seed). Each run reports the best time, and how many trials it took to come
within 5% of the best time either run found. With ``--transfer-to``, the cost model trained on
the first models' records ranks the other model's candidates from its first batch, against a
run that starts with no model.

Run it on a quiet machine: every trial is a timing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

import kiln
from kiln import models
from kiln.tune.db import TuningDB
from kiln.tune.search import Session, TuneResult, TuneSettings, tune_kernel
from kiln.tune.workloads import model_workloads


def trials_to(result: TuneResult, goal_s: float) -> int | None:
    """The trial count at which the run's best first came within ``goal_s``."""
    for trials, best in result.history:
        if best <= goal_s:
            return trials
    return None


def run(space, db_path: Path, options: kiln.Options, settings: TuneSettings,
        prior: list | None = None) -> TuneResult:
    """One search from an empty database, or from one holding ``prior`` records (other
    workloads': the cost model trains on them before the first pick)."""
    session = Session.open(db_path, options, jobs=2)
    if prior:
        session.db.add_many(prior)
    try:
        return tune_kernel(space, session, settings)
    finally:
        session.close()


def compare(names: list[str], kernels: int, trials: int, out: Path) -> list[dict]:
    options = kiln.Options()
    rows = []
    for name in names:
        model, inputs = models.build(name)
        for w in model_workloads(model, inputs, options)[:kernels]:
            results = {}
            for mode, use_model in (("model", True), ("random", False)):
                db = out / f"{name}-{w.space.workload()[:8]}-{mode}.sqlite"
                start = time.perf_counter()
                results[mode] = run(w.space, db, options,
                                    TuneSettings(trials=trials, use_model=use_model, batch=8))
                results[mode + "_s"] = time.perf_counter() - start
            best = min(results["model"].best_s, results["random"].best_s)
            row = {"model": name, "kernel": w.label, "uses": len(w.nodes),
                   "default_us": results["model"].default_s * 1e6}
            for mode in ("model", "random"):
                r = results[mode]
                row[f"{mode}_best_us"] = r.best_s * 1e6
                row[f"{mode}_trials_to_95"] = trials_to(r, best / 0.95)
                row[f"{mode}_speedup"] = r.speedup
                row[f"{mode}_seconds"] = round(results[mode + "_s"], 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def transfer(source_dbs: list[Path], target: str, kernels: int, trials: int, out: Path
             ) -> list[dict]:
    """The records of ``source_dbs`` (another model's kernels) as the prior for ``target``'s
    kernels, against no prior; both with the cost model guiding the search."""
    records = [r for path in source_dbs for r in TuningDB.open(path).records()]
    options = kiln.Options()
    model, inputs = models.build(target)
    rows = []
    for w in model_workloads(model, inputs, options)[:kernels]:
        results = {}
        # a kernel both models share (the same shapes) is not a transfer: leave its records out
        others = [r for r in records if r.workload != w.space.workload()]
        for mode, use in (("prior", others), ("cold", None)):
            db = out / f"{target}-{w.space.workload()[:8]}-{mode}.sqlite"
            results[mode] = run(w.space, db, options, TuneSettings(trials=trials, batch=8),
                                prior=use)
        best = min(r.best_s for r in results.values())
        row = {"model": target, "kernel": w.label, "prior_records": len(others)}
        for mode, r in results.items():
            row[f"{mode}_best_us"] = r.best_s * 1e6
            row[f"{mode}_trials_to_95"] = trials_to(r, best / 0.95)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def ranking(db_path: str, sizes: tuple[int, ...] = (16, 32, 64, 128)) -> list[dict]:
    """The cost model's ranking quality on kernels it never saw, as records accumulate: for
    each workload with at least 20 records, train on a growing random sample of the other
    workloads' records and rank this one's (Kendall tau, top-5 recall)."""
    import random

    from kiln.tune.model import CostModel, Measured, ranking_quality

    records = [r for r in TuningDB.open(db_path).records() if r.features]
    by_workload: dict[str, list] = {}
    for r in records:
        by_workload.setdefault(r.workload, []).append(r)
    rows = []
    for held, own in by_workload.items():
        if len(own) < 20:
            continue
        pool = [r for r in records if r.workload != held]
        random.Random(0).shuffle(pool)
        test = [Measured(r.workload, r.features, r.median_s) for r in own]
        for n in (*[n for n in sizes if n < len(pool)], len(pool)):
            model = CostModel().fit([Measured(r.workload, r.features, r.median_s)
                                     for r in pool[:n]])
            q = ranking_quality(model, test, k=5)
            rows.append({"workload": held, "kind": own[0].kind, "candidates": len(test),
                         "train_records": n, "all": n == len(pool),
                         "kendall_tau": q.kendall_tau,
                         "top5_recall": q.top_k_recall})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="bert", help="comma-separated zoo models")
    p.add_argument("--kernels", type=int, default=3, help="workloads per model")
    p.add_argument("--trials", type=int, default=40)
    p.add_argument("--transfer-to", metavar="MODEL", help="also measure the transfer to MODEL")
    p.add_argument("--out", help="folder for the databases (default: a temporary one)")
    p.add_argument("--ranking-db", metavar="PATH",
                   help="only the cost model's ranking quality on this database's records")
    p.add_argument("--skip-compare", action="store_true",
                   help="only the transfer, from the *-model.sqlite databases in --out")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args(argv)
    if args.ranking_db:
        rows = ranking(args.ranking_db)
        def label(r: dict) -> str:
            return "all other" if r["all"] else str(r["train_records"])

        for n in dict.fromkeys(label(r) for r in sorted(rows, key=lambda r: r["all"])):
            at = [r for r in rows if label(r) == n]
            print(f"{n:>9} training records: mean Kendall tau "
                  f"{sum(r['kendall_tau'] for r in at) / len(at):.2f}, mean top-5 recall "
                  f"{sum(r['top5_recall'] for r in at) / len(at):.2f} over {len(at)} "
                  "held-out workloads")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return 0
    torch.set_num_threads(torch.get_num_threads())
    out = Path(args.out or tempfile.mkdtemp(prefix="kiln-tune-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    document = {"threads": torch.get_num_threads(), "trials": args.trials,
                "compare": [] if args.skip_compare else compare(names, args.kernels,
                                                                  args.trials, out)}
    if args.transfer_to:
        sources = sorted(p for p in out.glob("*-model.sqlite")
                         if not p.name.startswith(args.transfer_to + "-"))
        document["transfer"] = transfer(sources, args.transfer_to, args.kernels, args.trials,
                                        out)
    for row in document["compare"]:
        m, r = row["model_trials_to_95"], row["random_trials_to_95"]
        print(f"{row['model']:<8} {row['kernel']:<44} default {row['default_us']:9.1f} us  "
              f"model {row['model_best_us']:9.1f} us ({m} trials)  random "
              f"{row['random_best_us']:9.1f} us ({r} trials)")
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=1, default=_plain))
    return 0


def _plain(x: object) -> object:
    return None if isinstance(x, float) and not math.isfinite(x) else str(x)


if __name__ == "__main__":
    sys.exit(main())
