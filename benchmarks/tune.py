"""The tuner, measured: the learned cost model against random search, the transfer of a
model trained on some networks' kernels to another's, and tuned kernels against the default
and the library.

    python benchmarks/tune.py --models bert,hf_llama --trials 16 --out runs --json tune.json
    python benchmarks/tune.py --models bert --trials 16 --out runs --transfer-to hf_bert
    python benchmarks/tune.py --models bert --trials 16 --out runs --rejudge   # time again
    python benchmarks/tune.py --models bert,gpt2 --from-db tuning.sqlite     # no tuning

The comparison tunes each model's kernels (`kiln.tune.workloads`, the first ``--kernels`` of
each, or all) twice, as ``kiln tune`` would: one arm with the cost model, one with random picks
(``--random``), each with its own database that every kernel adds to, so the model guides a
kernel with what the kernels before it taught it. The arms take turns a batch of 8 trials at
a time on the same kernel, which of them first alternating. Then every point either arm
measured on that kernel is timed again, together and beside the library's call, in
interleaved rounds in this process: one yardstick for both arms (the runner's times of one
point differed by up to 2x between arms). Read off those times, per kernel: the default,
each arm's best, the library, and how many trials each arm took to come within 5% of the
best either found (the default is trial 1). The summary counts the model's wins and losses
on kernels where both arms measured ``--trials`` points, sums those trials (never reached:
``--trials`` + 1), and gives per model the geomean speedup of the tuned kernels over the
default.

With ``--transfer-to MODEL``, both arms use the cost model on MODEL's kernels; one starts
from the comparison's records (other models' kernels, those MODEL shares left out), the
other from nothing.

With ``--from-db PATH`` nothing is tuned: for each kernel of each model, the default, what a
compile with the database ``PATH`` picks on this machine (`kiln.tune.apply`) and the
library's call are timed together, and the summary gives per model the geomean of the default
over the tuned kernel (all kernels, and the row and elementwise ones) and of the library over
the tuned kernel.

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
from kiln.tune.apply import tuned_schedule
from kiln.tune.db import TuningDB
from kiln.tune.search import Session, TuneSettings, tune_kernel
from kiln.tune.workloads import model_workloads

ARMS = {"model": True, "random": False}  # arm -> whether the cost model guides it
# the cost model with other models' records first, against one that starts from nothing
TRANSFER_ARMS = {"prior": True, "cold": True}
BATCH = 8


def trials_to_goal(times: list[float], goal_s: float) -> int | None:
    best = math.inf
    for trials, t in enumerate(times, 1):
        best = min(best, t)
        if best <= goal_s:
            return trials
    return None


def library_call(space):  # noqa: ANN001, ANN201
    """A call of what the kernel replaces, on random operands: the torch ops of a fused
    group (as the compile's fallback runs them), addmm or bmm, a convolution or pool on
    channels-last tensors; with the activation where the kernel has one."""
    import torch.nn.functional as F

    from kiln.ir.fused import apply_activation
    from kiln.kernels.attention_schedule import AttentionShape
    from kiln.kernels.depthwise_schedule import DepthwiseShape
    from kiln.kernels.pool_schedule import PoolShape
    from kiln.kernels.validate import library_results, random_operands
    from kiln.tune.space import GemmSpace
    from kiln.tune.space_groups import GroupSpace

    gen = torch.Generator().manual_seed(0)
    if isinstance(space, GroupSpace):
        env = random_operands(space.graph, space.group)
        return lambda: library_results(space.graph, space.group, env)
    epilogue = getattr(space, "epilogue", None)

    def activated(out: torch.Tensor) -> torch.Tensor:
        if epilogue is not None:
            apply_activation(out, epilogue.activation, epilogue.args)
        return out

    if isinstance(space, GemmSpace):
        operands, _ = space.operands(space.default(), gen)
        if space.batch:
            return lambda: torch.bmm(operands[0], operands[1])
        a = operands[0]
        w = torch.randn(space.n, space.k, generator=gen)  # a Linear's weight: B = w.T
        bias = operands[2] if space.bias else None
        if bias is not None and space.bias_row:
            bias = bias + operands[3]
        return lambda: activated(F.linear(a, w, bias) if bias is None or bias.dim() == 1
                                 else torch.addmm(bias, a, w.t()))
    sh = space.shape
    if isinstance(sh, AttentionShape):  # (ATen's fused attention on the kernel's operands)
        operands, _ = space.operands(space.default(), gen)
        q, k, v = operands[:3]
        if sh.runtime_mask is not None:
            mask = operands[3]
        elif sh.mask is not None:
            mask = torch.randn(*sh.mask, sh.queries, sh.keys, generator=gen)
        else:
            mask = None
        if sh.causal and mask is not None:  # (ATen takes one or the other)
            seen = torch.ones(sh.queries, sh.keys, dtype=torch.bool).tril()
            mask = mask & seen if mask.dtype == torch.bool else \
                mask.masked_fill(~seen, -math.inf)
        grouped = (sh.kv_heads or sh.heads) != sh.heads
        return lambda: F.scaled_dot_product_attention(
            q, k, v, mask, is_causal=sh.causal and mask is None, scale=sh.scale,
            enable_gqa=grouped)
    cl = torch.channels_last
    channels = sh.ci if hasattr(sh, "ci") else sh.c
    x = torch.randn(sh.n, channels, sh.h, sh.w, generator=gen).contiguous(memory_format=cl)
    if isinstance(sh, PoolShape):
        pool = F.max_pool2d if sh.kind == "max" else F.avg_pool2d
        return lambda: pool(x, sh.kernel, sh.stride, sh.padding)
    groups = channels if isinstance(sh, DepthwiseShape) else 1
    out_channels = channels if groups > 1 else sh.co
    weight = torch.randn(out_channels, channels // groups, *sh.kernel, generator=gen
                         ).contiguous(memory_format=cl)
    bias = torch.randn(out_channels, generator=gen) if sh.bias else None
    residual = getattr(sh, "residual", False)
    shortcut = torch.randn(sh.n, out_channels, *sh.out, generator=gen
                           ).contiguous(memory_format=cl) if residual else None
    return lambda: activated(
        F.conv2d(x, weight, bias, sh.stride, sh.padding, sh.dilation, groups)
        if shortcut is None else
        F.conv2d(x, weight, bias, sh.stride, sh.padding, sh.dilation, groups).add_(shortcut))


def remeasure(space, points: list[dict], options: kiln.Options) -> list[float]:
    """The median seconds of each point, all timed together in interleaved rounds in this
    process, and last the library's call: one yardstick for both arms, whatever phase the
    machine was in when each arm measured a point (the runner's times of one point differed
    by up to 2x between arms)."""
    from kiln.cost.measure import Budget, interleaved
    from kiln.tune.measure import kernel_call

    threads = torch.get_num_threads()
    calls = [kernel_call(space, point, options, threads) for point in points]
    calls.append(library_call(space))
    timings = interleaved(calls, Budget(min_rounds=9, max_rounds=9, min_sample_s=1e-3,
                                        settle_calls=1, collect_first=False))
    return [t.median_s if t.error is None and t.samples else math.inf for t in timings]


def duel(names: list[str], arms: dict[str, bool], kernels: int | None, trials: int,
         out: Path, tune: bool = True) -> list[dict]:
    """Each model's kernels tuned by two arms (name -> whether the cost model guides it), one
    database per arm (``out/<arm>.sqlite``). The arms take turns a batch at a time on the same
    kernel (which one first alternates), and each batch resumes from the arm's database. Then
    every point either arm measured is timed again, all together (`remeasure`), and each
    arm's trials are read off those times."""
    options = kiln.Options()
    order = list(arms.items())
    # one session per arm for the whole duel: its builder's and runner's processes serve
    # every turn (a session opened per turn spawned them again each batch of 8)
    sessions = {mode: Session.open(out / f"{mode}.sqlite", options, jobs=2) for mode in arms}
    rows = []
    turn = 0
    try:
        for name in names:
            model, inputs = models.build(name)
            for w in model_workloads(model, inputs, options)[:kernels]:
                seconds = {mode: 0.0 for mode in arms}
                for step in range(math.ceil(trials / BATCH) if tune else 0):
                    for mode, use_model in (order if turn % 2 == 0 else order[::-1]):
                        start = time.perf_counter()
                        tune_kernel(w.space, sessions[mode],
                                    TuneSettings(trials=min(BATCH, trials - step * BATCH),
                                                 batch=BATCH, use_model=use_model, seed=step))
                        seconds[mode] += time.perf_counter() - start
                    turn += 1
                if TuningDB.open(out / f"{order[0][0]}.sqlite").records(w.space.workload()):
                    rows.append(head_to_head(w, name, list(arms), out, options, seconds))
                    print(json.dumps(rows[-1]), flush=True)  # (--rejudge: not in that run)
    finally:
        for session in sessions.values():
            session.close()
    return rows


def against_library(names: list[str], db_path: Path) -> list[dict]:
    """Per kernel: the default, the schedule a compile with the database picks
    (`apply.tuned_schedule`: the confirmation's choice on this machine, where it beat the
    default by `apply.MARGIN` and did not slow its model) and the library's call, timed
    together (`remeasure`)."""
    options = kiln.Options()
    with_db = kiln.Options(tuning_db=str(db_path))
    rows = []
    for name in names:
        model, inputs = models.build(name)
        for w in model_workloads(model, inputs, options):
            default = w.space.default()
            best = tuned_schedule(w.space, with_db)  # as a compile chooses
            tuned = best[0] if best is not None else default
            points = [default] if _point_key(tuned) == _point_key(default) else [default, tuned]
            *times, library_s = remeasure(w.space, points, options)
            rows.append({"model": name, "kernel": w.label, "kind": w.space.kind,
                         "uses": len(w.nodes), "tuned": best is not None,
                         "default_us": times[0] * 1e6, "tuned_us": times[-1] * 1e6,
                         "library_us": library_s * 1e6})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def library_summary(rows: list[dict]) -> dict:
    """Per model: geomeans of the default over the tuned kernel (all, and the row and
    elementwise kernels) and of the library over the tuned kernel, and the kernels tuned."""
    out = {}
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == name and math.isfinite(r["tuned_us"])]
        out[name] = {
            "kernels": len(mine), "tuned": sum(r["tuned"] for r in mine),
            "default_over_tuned": _geomean([r["default_us"] / r["tuned_us"] for r in mine]),
            "default_over_tuned_rows_and_elementwise": _geomean(
                [r["default_us"] / r["tuned_us"] for r in mine if r["kind"] in ("rows", "loops")]),
            "library_over_tuned": _geomean([r["library_us"] / r["tuned_us"] for r in mine
                                            if math.isfinite(r["library_us"])]),
            "slower_than_default": sum(r["tuned_us"] > r["default_us"] for r in mine)}
    return out


def head_to_head(w, name: str, arms: list[str], out: Path, options: kiln.Options,
                 seconds: dict) -> dict:
    measured = {mode: TuningDB.open(out / f"{mode}.sqlite").records(w.space.workload())
                for mode in arms}
    points = {_point_key(r.decisions): dict(r.decisions)
              for records in measured.values() for r in records if r.ok}
    *times_again, library_s = remeasure(w.space, list(points.values()), options)
    again = dict(zip(points, times_again))
    row = {"model": name, "kernel": w.label, "kind": w.space.kind, "uses": len(w.nodes),
           "points": len(points), "library_us": library_s * 1e6}
    times = {mode: [again.get(_point_key(r.decisions), math.inf) for r in records]
             for mode, records in measured.items()}
    best = min(min(t, default=math.inf) for t in times.values())
    row["default_us"] = times[arms[0]][0] * 1e6
    for mode, t in times.items():
        row[f"{mode}_best_us"] = min(t) * 1e6
        row[f"{mode}_trials_to_95"] = trials_to_goal(t, best / 0.95)
        row[f"{mode}_measured"] = len(t)
        row[f"{mode}_speedup"] = t[0] / min(t)
        row[f"{mode}_seconds"] = round(seconds.get(mode, 0.0), 1)
    return row


def _point_key(decisions: dict) -> str:
    return json.dumps(dict(decisions), sort_keys=True)


def summary(rows: list[dict], trials: int, a: str = "model", b: str = "random") -> dict:
    """Wins, ties and losses of arm ``a`` against ``b`` on trials to 95% of the best, the
    trials summed (a run that never got there counts ``trials`` + 1), the geomean of their
    best-found ratios, and per model the speedup of ``a``'s tuned kernels over the default."""
    def cost(r: dict, mode: str) -> int:
        t = r[f"{mode}_trials_to_95"]
        return trials + 1 if t is None else t

    # a space both runs measured whole leaves nothing for a model to decide
    contested = [r for r in rows if min(r[f"{a}_measured"], r[f"{b}_measured"]) >= trials]
    wins = sum(cost(r, a) < cost(r, b) for r in contested)
    losses = sum(cost(r, a) > cost(r, b) for r in contested)
    finite = [r for r in rows if math.isfinite(r[f"{a}_best_us"] + r[f"{b}_best_us"])]
    ratio = [r[f"{b}_best_us"] / r[f"{a}_best_us"] for r in finite if r in contested]
    # the tuned kernel over the default, both timed again together
    speedups: dict[str, dict[str, float | None]] = {}
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in finite if r["model"] == name]
        speedups[name] = {
            "row_and_elementwise": _geomean([r[f"{a}_speedup"] for r in mine
                                             if r["kind"] in ("rows", "loops")]),
            "all": _geomean([r[f"{a}_speedup"] for r in mine])}
    return {"kernels": len(rows), "contested": len(contested), f"{a}_wins": wins,
            "ties": len(contested) - wins - losses, f"{a}_losses": losses,
            f"{a}_trials": sum(cost(r, a) for r in contested),
            f"{b}_trials": sum(cost(r, b) for r in contested),
            f"best_{b}_over_{a}_geomean": _geomean(ratio),
            "tuned_over_default_geomean": speedups}


def _geomean(xs: list[float]) -> float | None:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def seed_prior(source_dbs: list[Path], target: str, db: Path) -> int:
    """The records of ``source_dbs`` (other models' kernels) into ``db``, but for the kernels
    ``target`` shares with them (the same shapes: not a transfer); how many."""
    model, inputs = models.build(target)
    own = {w.space.workload() for w in model_workloads(model, inputs, kiln.Options())}
    records = [r for path in source_dbs for r in TuningDB.open(path).records()
               if r.workload not in own]
    return TuningDB.open(db).add_many(records)


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
    p.add_argument("--kernels", type=int, default=None,
                   help="the first N workloads of each model (default: all)")
    p.add_argument("--trials", type=int, default=16, help="per kernel and arm")
    p.add_argument("--transfer-to", metavar="MODEL", help="also measure the transfer to MODEL")
    p.add_argument("--out", help="folder for the databases (default: a temporary one)")
    p.add_argument("--ranking-db", metavar="PATH",
                   help="only the cost model's ranking quality on this database's records")
    p.add_argument("--skip-compare", action="store_true",
                   help="only the transfer, from the databases of an earlier run in --out")
    p.add_argument("--rejudge", action="store_true",
                   help="no tuning: time again the points of an earlier run's databases in --out")
    p.add_argument("--from-db", metavar="PATH",
                   help="no tuning: time each kernel's default, PATH's best and the library")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args(argv)
    if args.from_db:
        names = [n.strip() for n in args.models.split(",") if n.strip()]
        rows = against_library(names, Path(args.from_db))
        for r in rows:
            print(f"{r['model']:<16} {r['kernel']:<48} default {r['default_us']:9.1f} us  "
                  f"tuned {r['tuned_us']:9.1f} us  library {r['library_us']:9.1f} us")
        document = {"threads": torch.get_num_threads(), "rows": rows,
                    "summary": library_summary(rows)}
        print(json.dumps(document["summary"], indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(document, indent=1, default=_plain))
        return 0
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
                "compare": [] if args.skip_compare else duel(names, ARMS, args.kernels,
                                                               args.trials, out,
                                                               not args.rejudge)}
    if args.transfer_to:
        sources = [p for p in (out / "model.sqlite", out / "random.sqlite") if p.is_file()]
        if not args.rejudge:
            for arm in TRANSFER_ARMS:  # (and the cost model saved beside each)
                for stale in out.glob(f"{arm}.sqlite*"):
                    stale.unlink()
            document["prior_records"] = seed_prior(sources, args.transfer_to,
                                                   out / "prior.sqlite")
        document["transfer"] = duel([args.transfer_to], TRANSFER_ARMS, args.kernels,
                                    args.trials, out, not args.rejudge)
        document["transfer_summary"] = summary(document["transfer"], args.trials, "prior",
                                               "cold")
        print(json.dumps(document["transfer_summary"]))
    for row in document["compare"]:
        m, r = row["model_trials_to_95"], row["random_trials_to_95"]
        print(f"{row['model']:<8} {row['kernel']:<44} default {row['default_us']:9.1f} us  "
              f"model {row['model_best_us']:9.1f} us ({m} trials)  random "
              f"{row['random_best_us']:9.1f} us ({r} trials)  library "
              f"{row['library_us']:9.1f} us")
    if document["compare"]:
        document["summary"] = summary(document["compare"], args.trials)
        print(json.dumps(document["summary"]))
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=1, default=_plain))
    return 0


def _plain(x: object) -> object:
    return None if isinstance(x, float) and not math.isfinite(x) else str(x)


if __name__ == "__main__":
    sys.exit(main())
