"""`kiln tune` (search schedules for a model's kernels, records into a tuning database) and
`kiln db` (list, show, export and import those records)."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from pathlib import Path

import kiln
from kiln import models
from kiln.cli.errors import UsageError, UserError
from kiln.cli.output import markdown, step_progress

DEFAULT_DB = Path.home() / ".cache" / "kiln" / "tuning.sqlite"


def add_command(commands: argparse._SubParsersAction) -> None:
    t = commands.add_parser(
        "tune", help="search schedules for a model's kernels; records go into a database",
        description="For each distinct generated kernel of MODEL (as kiln.compile builds it "
        "at --opt-level: GEMMs and batched GEMMs, convolutions, depthwise convolutions, pools, "
        "row kernels and elementwise chains), measure the heuristic schedule, then candidates "
        "an evolutionary search picks with a learned cost model (LightGBM), each built in "
        "parallel and timed in a separate process; the default and the best three are timed "
        "again side by side at the end, and a schedule that beat its default there is then "
        "checked in the model (its model's calls with and without it, alternated): a compile "
        "uses it only if the model ran faster. Records go into the tuning database; a stopped run "
        "resumes from it. Compile with Options(tuning_db=PATH) (or KILN_TUNING_DB) to use the "
        "results.",
        epilog="example: kiln tune bert --trials 32 --time-budget 10m --db tuning.sqlite")
    t.add_argument("model", metavar="MODEL", nargs="?",
                   help=f"one of {', '.join(models.names())}")
    t.add_argument("--all", action="store_true", help="every built-in model, in turn")
    t.add_argument("--quick", action="store_true", help="the small variants")
    t.add_argument("--opt-level", type=int, default=2, choices=range(4), metavar="N")
    t.add_argument("--trials", type=int, default=32, metavar="N",
                   help="candidates measured per kernel, the database's records of it "
                   "counted (default 32): a stopped run goes on where it stopped, and a kernel "
                   "an earlier model shares is not tuned again")
    t.add_argument("--time-budget", default="", metavar="T",
                   help="stop after T for the whole run, the checks in the model included: "
                   "90s, 10m, 1h (default: none); each model, then each kernel, gets an equal "
                   "share of what is left, less the time kept for the checks")
    t.add_argument("--patience", type=int, default=16, metavar="N",
                   help="move on to the next kernel once N candidates in a row found nothing "
                   "1%% faster than its best (default 16; 0: measure all --trials)")
    t.add_argument("--db", default=str(DEFAULT_DB), metavar="PATH",
                   help=f"the tuning database (default {DEFAULT_DB})")
    t.add_argument("--jobs", type=int, default=os.cpu_count() or 1, metavar="J",
                   help="compiler processes (default: one per core)")
    t.add_argument("--ray", metavar="ADDRESS",
                   help="build and measure on a Ray cluster: auto (the one this machine "
                        "belongs to), local (one started here on this machine's cores), or "
                        "an address; records are filed under the machine each ran on")
    t.add_argument("--random", action="store_true",
                   help="random search instead of the cost model (the baseline)")
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(run=_tune)

    d = commands.add_parser("db", help="the tuning database: ls, show, export, import",
                            epilog="example: kiln db export team.jsonl --db tuning.sqlite")
    d.add_argument("action", choices=("ls", "show", "export", "import"))
    d.add_argument("argument", nargs="?", metavar="WORKLOAD|FILE",
                   help="show: a workload key (a prefix is enough); export/import: a file")
    d.add_argument("--db", default=str(DEFAULT_DB), metavar="PATH",
                   help=f"the tuning database (default {DEFAULT_DB})")
    d.set_defaults(run=_db)


def parse_duration(text: str) -> float:
    """``"90s"``, ``"10m"``, ``"1.5h"`` or plain seconds -> seconds."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", text)
    if not match:
        raise UsageError(f"--time-budget {text!r}: write e.g. 90s, 10m or 1h")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def _tune(args: argparse.Namespace) -> int:
    from kiln.tune.db import TuningDBError
    from kiln.tune.ray_runner import RayUnavailable
    from kiln.tune.search import Session, TuneSettings, refresh, tune_kernel
    from kiln.tune.validate import ModelCheck
    from kiln.tune.workloads import model_workloads

    if (args.model is None) == (not args.all):
        raise UsageError("give a MODEL or --all (one of them)")
    names = models.names() if args.all else [args.model]
    for name in names:
        try:
            models.get(name)
        except ValueError as err:
            raise UsageError(str(err)) from None
    if args.trials < 1 or args.jobs < 1:
        raise UsageError("--trials and --jobs must be at least 1")
    if args.patience < 0:
        raise UsageError("--patience must be 0 (off) or more")
    budget = parse_duration(args.time_budget) if args.time_budget else math.inf
    if not args.random:  # the cost model; random search needs none
        try:
            import lightgbm  # noqa: F401
        except ImportError as err:
            raise UserError(f"the cost model needs LightGBM ({err}): pip install "
                            "'kiln[tune]', or search at random with --random") from None
    options = kiln.Options(opt_level=args.opt_level)
    try:
        session = Session.open(args.db, options, jobs=args.jobs, ray=args.ray)
    except TuningDBError as err:
        raise UserError(str(err)) from None
    except RayUnavailable as err:
        raise UserError(str(err)) from None
    except ImportError as err:
        raise UserError(f"tuning needs the tune extra ({err}): pip install 'kiln[tune]'") \
            from None
    start = time.perf_counter()
    rows = []
    in_model: dict[tuple[str, str], float] = {}  # (model, workload) -> time with / without
    untuned = 0  # kernels the budget left no time for
    worst: dict[tuple[str, str], float] = {}  # a schedule's highest ratio over the models
    try:
        for m, name in enumerate(names):
            model_start = time.perf_counter()
            deadline = model_start + (budget - (model_start - start)) / (len(names) - m)
            model, inputs = models.build(name, quick=args.quick)
            workloads = model_workloads(model, inputs, options)
            check = ModelCheck(model, inputs, options)
            print(f"{name}: {len(workloads)} tunable kernels", file=sys.stderr)
            with step_progress(sys.stderr, total=len(workloads) * args.trials) as bar:
                waiting = 0  # kernels tuned whose chosen schedule awaits its check
                for i, w in enumerate(workloads):
                    # an equal share of what is left, less the time the checks will take
                    # (the untuned build they compare with, then those of the kernels tuned
                    # and this one's): a kernel that stops early (patience, a small space)
                    # leaves its time to the ones after it
                    kept = 0.0
                    if math.isfinite(budget):
                        each = check.cost_s()  # (its first call measures compile_s)
                        kept = check.compile_s + (waiting + 1) * each
                    left = deadline - time.perf_counter() - kept
                    if left <= 0:
                        untuned += len(workloads) - i
                        break

                    show = _shows(bar, f"{name} {i + 1}/{len(workloads)} {w.label}",
                                  i * args.trials)
                    settings = TuneSettings(trials=args.trials, use_model=not args.random,
                                            time_budget_s=left / (len(workloads) - i),
                                            seed=args.seed, batch=max(args.jobs * 2, 4),
                                            patience=args.patience,
                                            trials_include_records=True)
                    result = tune_kernel(w.space, session, settings, show)
                    rows.append((name, w, result))
                    if math.isfinite(budget):
                        waiting += check.wanted(w, session.db, session.target)
            with step_progress(sys.stderr, total=len(workloads)) as bar:
                def checking(i: int, label: str, bar=bar, name=name) -> None:  # noqa: ANN001
                    bar.update(i, f"{name}: checking in the model: {label}")

                for done in check.run(workloads, session.db, session.target, deadline,
                                      checking, worst):
                    in_model[(name, done.workload.space.workload())] = done.ratio
            for row_name, w, result in rows:
                if row_name == name:
                    refresh(result, w.space, session)  # (what a compile now picks)
    finally:
        session.close()
    print(markdown(["model", "kernel", "uses", "default us", "tuned us", "speedup",
                    "model with it", "measured", "failed"],
                   [[name, w.label, str(len(w.nodes)), _us(r.default_s), _us(r.best_s),
                     f"{r.speedup:.2f}x", _checked(in_model.get((name, w.space.workload())),
                                                   r.best != w.space.default()),
                     str(r.measured), str(r.failed)]
                    for name, w, r in rows]))
    if in_model:
        kept = sum(r < 1 for r in in_model.values())
        print(f"\n{kept} of {len(in_model)} schedules checked made their model faster (its time "
              "with the schedule over without, calls alternated); a compile drops the others. "
              "A schedule under 2% of its model is not checked")
    if untuned:
        print(f"\n{untuned} kernels not tuned: the time budget ran out (a run resumed with the "
              "same database goes on with them)")
    print(f"\n{len(rows)} kernels in {time.perf_counter() - start:.0f} s; records in {args.db} "
          f"(compile with KILN_TUNING_DB={args.db} to use them)")
    return 0


def _shows(bar, label: str, offset: int):  # noqa: ANN001, ANN202 - StepProgress -> callback
    """The progress callback of one kernel's search: its best time so far."""
    def show(result) -> None:  # noqa: ANN001 - kiln.tune.search.TuneResult
        best = f"{result.best_s * 1e6:.1f} us" if math.isfinite(result.best_s) else "-"
        bar.update(offset + result.measured, f"{label}: best {best}",
                   key=(label, result.best_s))

    return show


def _checked(ratio: float | None, chosen: bool) -> str:
    """The check in the model of a kernel's schedule; a chosen schedule without one was too
    small a share of the model to check (`kiln.tune.validate.MIN_SHARE`)."""
    return "not checked: small" if ratio is None and chosen else _ratio(ratio)


def _ratio(ratio: float | None, drop: bool = True) -> str:
    """A ratio of times, "-" where there is none; ``drop``: a model's, marked where it
    makes a compile drop the schedule."""
    return "-" if ratio is None else f"{ratio:.3f}" + (" (dropped)" if drop and ratio >= 1
                                                         else "")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}" if math.isfinite(seconds) else "-"


def _db(args: argparse.Namespace) -> int:
    from kiln.tune.db import Target, TuningDB, TuningDBError

    if args.action in ("export", "import", "show") and not args.argument:
        raise UsageError(f"kiln db {args.action} needs a "
                         f"{'workload' if args.action == 'show' else 'file'}")
    if args.action != "export" and not os.path.exists(args.db) and args.action != "import":
        raise UserError(f"{args.db}: no such tuning database")
    try:
        db = TuningDB.open(args.db)
        if args.action == "ls":
            rows = [[s.workload, s.kind, str(Target.from_key(s.target)), str(s.records),
                     str(s.failed), _us(s.best_s)] for s in db.workloads()]
            print(markdown(["workload", "kind", "target", "records", "failed", "best us"],
                           rows) if rows else "no records")
        elif args.action == "show":
            found = [s for s in db.workloads() if s.workload.startswith(args.argument)]
            if not found:
                raise UserError(f"no workload {args.argument!r} in {args.db}")
            for s in found:
                records = sorted(db.records(s.workload, s.target), key=lambda r: r.median_s)
                print(f"{s.workload} ({s.kind}) on {Target.from_key(s.target)}")
                print(markdown(["median us", "over default", "model with it", "decisions",
                                "error"],
                               [[_us(r.median_s), _ratio(r.paired, drop=False),
                                 _ratio(r.in_model), str(r.decisions), r.error or ""]
                                for r in records]))
        elif args.action == "export":
            print(f"{db.export_jsonl(args.argument)} records written to {args.argument}")
        else:
            print(f"{db.import_jsonl(args.argument)} new records from {args.argument}")
    except TuningDBError as err:
        raise UserError(str(err)) from None
    except OSError as err:
        raise UserError(f"{args.argument}: {err.strerror}") from None
    return 0
