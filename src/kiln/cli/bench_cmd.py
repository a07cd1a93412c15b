"""`kiln bench`: eager vs kiln (vs peers), timed side by side; a Markdown table and JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import torch

import kiln
from kiln import bench, models
from kiln.bench import BenchResult
from kiln.cli.errors import UsageError
from kiln.cli.output import markdown, step_progress
from kiln.options import SEARCH_STRATEGIES


def add_command(commands: argparse._SubParsersAction) -> None:
    b = commands.add_parser(
        "bench", help="eager vs kiln (vs peers): latency, error, memory",
        epilog="example: kiln bench --models resnet50,hf_bert --peers inductor,ort --json b.json")
    b.add_argument("--models", nargs="+", action="extend", metavar="NAME",
                   help=f"comma- or space-separated (default: all of {', '.join(models.names())})")
    b.add_argument("--quick", action="store_true", help="small variants, short timing")
    b.add_argument("--peers", nargs="+", action="extend", metavar="PEER",
                   help=f"also time these: {', '.join(bench.PEERS)}")
    b.add_argument("--opt-level", nargs="+", action="extend", type=int, choices=range(4),
                   metavar="N", dest="opt_levels", help="kiln opt level(s) (default: 2)")
    b.add_argument("--kernels", nargs="+", action="extend", choices=list(bench.KERNEL_MODES),
                   metavar="MODE", help="kiln contender(s) per opt level: generated (the "
                   "default: fused C kernels and GEMMs, each where measured faster), no-gemm "
                   "(row kernels only), library (library calls, oneDNN on prepacked weights), "
                   "aten (every op its ATen call)")
    b.add_argument("--search", nargs="+", action="extend", choices=list(SEARCH_STRATEGIES),
                   metavar="STRATEGY", dest="searches", help="how kiln applies its rules, one "
                   "contender each: greedy (the default), backtrack (TASO's search), saturate "
                   "(equality saturation and extraction, as Tensat does)")
    b.add_argument("--tuning-db", metavar="PATH",
                   help="add a kiln-O<N>-tuned row compiled with this tuning database "
                        "(`kiln tune`); the other kiln rows then use none")
    b.add_argument("--pet", action="store_true",
                   help="add a kiln-O<N>-pet row with the PET pass on (partially equivalent "
                        "mutants with corrections, where measured faster)")
    b.add_argument("--json", metavar="FILE", help="also write every number to FILE")
    b.add_argument("--threads", type=int, metavar="N", help="torch intra-op threads")
    b.set_defaults(run=_bench)



def _bench(args: argparse.Namespace) -> int:
    names = split_names(args.models) or models.names()
    for name in names:
        check_model(name)
    peers = split_names(args.peers)
    unknown = [p for p in peers if p not in bench.PEERS]
    if unknown:
        raise UsageError(f"unknown peer {unknown[0]!r}; known peers: {', '.join(bench.PEERS)}")
    if args.tuning_db and not os.path.isfile(args.tuning_db):
        raise UsageError(f"--tuning-db {args.tuning_db}: no such file (make one with kiln tune)")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be at least 1, got {args.threads}")
    # find out now, not after minutes of benchmarking, that the JSON cannot be written
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        raise UsageError(f"--json {args.json}: no such directory")
    opt_levels = list(dict.fromkeys(args.opt_levels or [2]))
    kernel_modes = list(dict.fromkeys(args.kernels or [bench.DEFAULT_KERNELS]))
    searches = list(dict.fromkeys(args.searches or ["greedy"]))
    with step_progress(sys.stderr) as bar:
        def progress(event: bench.Progress) -> None:
            bar.update(event.fraction, f"{event.index + 1}/{event.count} {event.model}: "
                       f"{event.step}")

        results = bench.run_bench(names, quick=args.quick, peers=peers, opt_levels=opt_levels,
                                  kernels=kernel_modes, threads=args.threads,
                                  progress=progress, searches=searches,
                                  tuning_db=args.tuning_db, pet=args.pet)
    print(markdown_table(results))
    if args.json:
        document = {
            "kiln": kiln.__version__, "torch": torch.__version__, "quick": args.quick,
            "threads": args.threads or torch.get_num_threads(), "opt_levels": opt_levels,
            "kernels": kernel_modes, "searches": searches, "peers": peers,
            "tuning_db": args.tuning_db, "pet": args.pet,
            "results": [r.to_dict() for r in results],
        }
        try:
            with open(args.json, "w") as f:
                json.dump(document, f, indent=2)
        except OSError as err:
            print(f"kiln: error: cannot write {args.json}: {err.strerror}", file=sys.stderr)
            return 1
    # a model or kiln itself failing is a failed run; a peer that could not run is not
    failed = any(r.error is not None or any(c.error for c in r.contenders if bench.is_kiln(c.name))
                 for r in results)
    return 1 if failed else 0


def markdown_table(results: Sequence[BenchResult]) -> str:
    """One row per model and kiln opt level; each peer gets a latency and a speedup column;
    notes (skips, errors, fallbacks) follow the table."""
    peers = list(dict.fromkeys(c.name for r in results for c in r.contenders[1:]
                               if not bench.is_kiln(c.name)))
    header = ["model", "eager ms", "kiln ms", "speedup"]
    for peer in peers:  # (kiln / peer: the paired ratio, rounds kiln was faster in)
        header += [f"{peer} ms", f"{peer} speedup", f"kiln / {peer} (faster in)"]
    header += ["kiln GFLOP/s (% peak)", "max abs err", "rel err", "compile s",
               "nodes before→after", "planned / intermediates MiB"]
    rows: list[list[str]] = []
    notes: list[str] = []
    for r in results:
        if r.error is not None:
            rows.append([r.model, "error"] + [""] * (len(header) - 2))
            notes.append(f"{r.model}: {r.error}")
            continue
        rows += _rows(r, peers)
        for c in r.contenders[1:]:
            if c.error is not None or c.note:
                notes.append(f"{r.model}, {c.name}: {c.error or c.note}")
            notes += [f"{r.model}, {c.name}: {f}" for f in (c.kiln.fallbacks if c.kiln else [])]
            rate = r.gflops(c) if bench.is_kiln(c.name) else None
            if rate and r.peak_gflops and rate > r.peak_gflops:
                notes.append(f"{r.model}, {c.name}: {rate:.0f} GFLOP/s is above the FMA peak "
                             f"({r.peak_gflops:.0f}): the FLOPs are those of one eager call, "
                             "and kiln does not run all of them (work on weights alone, such "
                             "as a projection of a position table, is folded at compile time)")
    table = markdown(header, rows)
    return "\n".join([table] + ([""] + [f"* {n}" for n in notes] if notes else []))


def _rows(r: BenchResult, peers: Sequence[str]) -> list[list[str]]:
    kilns = [c for c in r.contenders if bench.is_kiln(c.name)]
    rows = []
    for k in kilns:
        label = r.model if len(kilns) == 1 else f"{r.model} {k.name.removeprefix('kiln')}"
        row = [label, _ms(r.contenders[0].median_ms), _ms(k.median_ms), _x(k.speedup)]
        for peer in peers:
            p = r.contender(peer)
            paired = r.paired(k.name, peer) if p else None
            row += [_ms(p.median_ms), _x(p.speedup)] if p else ["", ""]
            row += [str(paired) if paired else ""]
        rate = r.gflops(k)
        share = f" ({rate / r.peak_gflops:.0%})" if rate and r.peak_gflops else ""
        row += [f"{rate:.0f}{share}" if rate else ""]
        row += [_num(k.max_abs_err, ".1e"), _num(k.rel_err, ".1e"), _num(k.compile_s, ".2f")]
        stats = k.kiln
        row += [f"{stats.nodes_before}→{stats.nodes_after}",
                f"{_mib(stats.planned_peak_bytes)} / {_mib(stats.intermediate_bytes)}"
                ] if stats else ["", ""]
        rows.append(row)
    return rows


def _num(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _ms(x: float | None) -> str:
    return _num(x, ".3f")


def _x(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def split_names(values: Sequence[str] | None) -> list[str]:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]``, duplicates dropped, order kept."""
    parts = (p.strip() for v in values or [] for p in v.split(","))
    return list(dict.fromkeys(p for p in parts if p))


def check_model(name: str) -> None:
    try:
        models.get(name)
    except ValueError as err:
        raise UsageError(str(err)) from None
