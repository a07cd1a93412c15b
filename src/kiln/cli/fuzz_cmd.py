"""`kiln fuzz`: random graphs compiled every way, against the reference interpreter."""

from __future__ import annotations

import argparse
import sys

from kiln.cli.bench_cmd import split_names
from kiln.cli.errors import UsageError


def add_command(commands: argparse._SubParsersAction) -> None:
    f = commands.add_parser(
        "fuzz", help="random graphs, compiled every way, against the reference interpreter",
        description="Generate random well-typed graphs (every op kiln models; size-0, size-1 "
        "and broadcast dimensions; NaN, inf, signed zeros, subnormals; strided and aliased "
        "inputs), compile each at every configuration and compare with the reference "
        "interpreter. A failing graph is shrunk and written as IR text (FILE.kir, with its "
        "data in FILE.pt) that `kiln explain --ir FILE --check` reproduces. Exit code 1 when "
        "any graph fails.",
        epilog="example: kiln fuzz --graphs 100000 --jobs 16 --seed 1 --out fuzz-out "
               "--json fuzz.json")
    f.add_argument("--graphs", type=int, default=1000, metavar="N", help="how many (default 1000)")
    f.add_argument("--seed", type=int, default=0, metavar="S", help="the run's seed (default 0)")
    f.add_argument("--start", type=int, default=0, metavar="I",
                   help="index of the first graph (graph I of seed S is always the same)")
    f.add_argument("--jobs", type=int, default=1, metavar="J",
                   help="worker processes (default 1; 0 runs in this process)")
    f.add_argument("--configs", nargs="+", action="extend", metavar="NAME",
                   help="configurations to compile at (default: all of "
                        f"{', '.join(c.name for c in fuzz_configs())})")
    f.add_argument("--kernel-every", type=int, default=1, metavar="K",
                   help="run the configurations with generated kernels on every K-th graph "
                        "only (each new kernel is a C compiler run; default 1: every graph)")
    f.add_argument("--max-ops", type=int, default=6, metavar="N",
                   help="computing nodes per graph, at most (default 6)")
    f.add_argument("--ops", nargs="+", action="extend", metavar="OP",
                   help="the ops the graphs are built from, by IR name (default: every op "
                        "the generator makes; 'call' includes fused attention)")
    f.add_argument("--out", metavar="DIR", default="fuzz-failures",
                   help="where reproducers go (default fuzz-failures)")
    f.add_argument("--no-shrink", action="store_true", help="write failing graphs unshrunk")
    f.add_argument("--verify", action="store_true",
                   help="also verify the graph after every pass (about half as fast)")
    f.add_argument("--time-limit", type=float, default=0.0, metavar="SECONDS",
                   help="start no graph after this long")
    f.add_argument("--json", metavar="FILE", help="also write the summary to FILE")
    f.add_argument("--quiet", action="store_true", help="no progress line")
    f.set_defaults(run=_fuzz)



def fuzz_configs():  # -> tuple[kiln.fuzz.check.Config, ...]
    from kiln.fuzz.check import CONFIGS

    return CONFIGS


def _fuzz(args: argparse.Namespace) -> int:
    from kiln.fuzz.driver import FuzzSettings, run_fuzz

    known = [c.name for c in fuzz_configs()]
    configs = split_names(args.configs) or known
    unknown = [c for c in configs if c not in known]
    if unknown:
        raise UsageError(f"unknown configuration(s) {', '.join(unknown)}; known: "
                         f"{', '.join(known)}")
    ops = split_names(args.ops)
    try:
        from kiln.fuzz.table import GENERATED_OPS
        from kiln.ir.ops import Op

        unmade = [name for name in ops if Op.parse(name) not in GENERATED_OPS]
    except ValueError as err:
        raise UsageError(f"--ops: {err}") from None
    if unmade:
        raise UsageError(f"--ops: the generator makes no {', '.join(unmade)} (sources are "
                         "made as operands)")
    if args.graphs < 0 or args.jobs < 0 or args.kernel_every < 1 or args.max_ops < 1:
        raise UsageError("--graphs and --jobs must be >= 0, --kernel-every and --max-ops >= 1")
    settings = FuzzSettings(graphs=args.graphs, seed=args.seed, start=args.start,
                            jobs=args.jobs, configs=tuple(configs),
                            kernel_every=args.kernel_every, max_ops=args.max_ops,
                            ops=tuple(ops), out_dir=args.out, shrink=not args.no_shrink,
                            time_limit=args.time_limit, verify=args.verify)

    def progress(summary, result) -> None:  # (Summary, GraphResult)
        for failure in result.failures:
            print(f"\rFAIL graph {result.index}: {failure}", file=sys.stderr)
        if not args.quiet and (summary.graphs % 50 == 0 or result.failures):
            print(f"\r{summary.graphs} graphs, {summary.failed_graphs} failing, "
                  f"{summary.graphs / max(summary.seconds, 1e-9):.1f} graphs/s",
                  end="", file=sys.stderr, flush=True)

    summary = run_fuzz(settings, progress)
    if not args.quiet:
        print(file=sys.stderr)
    print(summary.text())
    if args.json:
        summary.write_json(args.json)
    return 1 if summary.failures else 0
