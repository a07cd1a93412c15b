"""The ``kiln`` command line.

    kiln bench --models mlp,resnet18 --quick --peers inductor --json out.json
    kiln explain resnet18 --quick --after fold
    kiln explain bert --quick --rule merge-parallel-addmm
    kiln explain gpt2 --quick --kernels
    kiln explain --ir fuzz-failures/seed0-graph12-O2.kir --check
    kiln fuzz --graphs 10000 --jobs 8 --seed 1 --out fuzz-out --json fuzz.json
    kiln rules check --rule conv-bn --time-limit 5
    kiln synth verify my-rules.txt
    kiln synth generate --max-ops 3 -o rules.txt
    kiln --version

User mistakes (unknown model, pass or peer) print one line to stderr and exit 2, no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

import torch

import kiln
from kiln import bench, models
from kiln.bench import BenchResult
from kiln.ir import Graph, print_graph
from kiln.options import SEARCH_STRATEGIES
from kiln.passes.pipeline import PIPELINE, PassRecord, run_pipeline
from kiln.rules import rule_named
from kiln.synth import commands as synth_commands

USAGE_ERROR = 2


class UsageError(Exception):
    """A mistake in the command line; reported without a traceback, exit code 2."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version and argparse's own errors
        return exit_.code if isinstance(exit_.code, int) else USAGE_ERROR
    # torch's pytree warns about its own deprecated LeafSpec inside torch.export; not ours to fix
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
    try:
        return args.run(args)
    except UsageError as err:
        print(f"kiln: error: {err}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        return 130  # the shell's code for SIGINT


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kiln", description=kiln.__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kiln {kiln.__version__}")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    b = commands.add_parser("bench", help="eager vs kiln (vs peers): latency, error, memory")
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
    b.add_argument("--json", metavar="FILE", help="also write every number to FILE")
    b.add_argument("--threads", type=int, metavar="N", help="torch intra-op threads")
    b.set_defaults(run=_bench)

    e = commands.add_parser("explain", help="the IR after capture and after each pass")
    e.add_argument("model", metavar="MODEL", nargs="?",
                   help=f"one of {', '.join(models.names())}")
    e.add_argument("--ir", metavar="FILE",
                   help="explain the graph in IR text FILE instead of a model (a `kiln fuzz` "
                        "reproducer: weights and inputs from FILE's .pt beside it, if any)")
    e.add_argument("--check", action="store_true",
                   help="with --ir: compile at every fuzz configuration and compare with the "
                        "reference interpreter on the file's inputs (exit 1 if any differs)")
    e.add_argument("--quick", action="store_true", help="the small variant")
    e.add_argument("--after", metavar="PASS",
                   help=f"only the IR after PASS ({', '.join(p.name for p in PIPELINE)})")
    e.add_argument("--counts-only", action="store_true", help="op counts, no IR")
    e.add_argument("--opt-level", type=int, default=2, choices=range(4), metavar="N",
                   help="which passes run (default: 2)")
    e.add_argument("--rule", metavar="NAME",
                   help="where rewrite rule NAME fired, and why it did not elsewhere")
    e.add_argument("--fast-math", action="store_true",
                   help="also run rules that hold for real numbers only")
    e.add_argument("--search", choices=list(SEARCH_STRATEGIES), default="greedy",
                   help="how the rules are applied (default: greedy); the search pass shows "
                        "the estimated cost before and after and the rewrites it chose")
    e.add_argument("--kernels", action="store_true",
                   help="the kernels with generated kernels on: generated (C source and "
                        "schedule) or library, covering every computing node")
    e.set_defaults(run=_explain)

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

    synth_commands.add_commands(commands, UsageError)
    return parser


# -- kiln bench ------------------------------------------------------------------------------------


def _bench(args: argparse.Namespace) -> int:
    names = _split(args.models) or models.names()
    for name in names:
        _check_model(name)
    peers = _split(args.peers)
    unknown = [p for p in peers if p not in bench.PEERS]
    if unknown:
        raise UsageError(f"unknown peer {unknown[0]!r}; known peers: {', '.join(bench.PEERS)}")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be at least 1, got {args.threads}")
    # find out now, not after minutes of benchmarking, that the JSON cannot be written
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        raise UsageError(f"--json {args.json}: no such directory")
    opt_levels = list(dict.fromkeys(args.opt_levels or [2]))
    kernel_modes = list(dict.fromkeys(args.kernels or [bench.DEFAULT_KERNELS]))
    searches = list(dict.fromkeys(args.searches or ["greedy"]))
    bar = ProgressBar(sys.stderr)
    try:
        results = bench.run_bench(names, quick=args.quick, peers=peers, opt_levels=opt_levels,
                                  kernels=kernel_modes, threads=args.threads,
                                  progress=bar.update, searches=searches)
    finally:
        bar.close()
    print(markdown_table(results))
    if args.json:
        document = {
            "kiln": kiln.__version__, "torch": torch.__version__, "quick": args.quick,
            "threads": args.threads or torch.get_num_threads(), "opt_levels": opt_levels,
            "kernels": kernel_modes, "searches": searches, "peers": peers,
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


# -- kiln fuzz -------------------------------------------------------------------------------------


def fuzz_configs():  # -> tuple[kiln.fuzz.check.Config, ...]
    from kiln.fuzz.check import CONFIGS

    return CONFIGS


def _fuzz(args: argparse.Namespace) -> int:
    from kiln.fuzz.driver import FuzzSettings, run_fuzz

    known = [c.name for c in fuzz_configs()]
    configs = _split(args.configs) or known
    unknown = [c for c in configs if c not in known]
    if unknown:
        raise UsageError(f"unknown configuration(s) {', '.join(unknown)}; known: "
                         f"{', '.join(known)}")
    if args.graphs < 0 or args.jobs < 0 or args.kernel_every < 1 or args.max_ops < 1:
        raise UsageError("--graphs and --jobs must be >= 0, --kernel-every and --max-ops >= 1")
    settings = FuzzSettings(graphs=args.graphs, seed=args.seed, start=args.start,
                            jobs=args.jobs, configs=tuple(configs),
                            kernel_every=args.kernel_every, max_ops=args.max_ops,
                            out_dir=args.out, shrink=not args.no_shrink,
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


def _split(values: Sequence[str] | None) -> list[str]:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]``, duplicates dropped, order kept."""
    parts = (p.strip() for v in values or [] for p in v.split(","))
    return list(dict.fromkeys(p for p in parts if p))


def markdown_table(results: Sequence[BenchResult]) -> str:
    """One row per model and kiln opt level; each peer gets a latency and a speedup column;
    notes (skips, errors, fallbacks) follow the table."""
    peers = list(dict.fromkeys(c.name for r in results for c in r.contenders[1:]
                               if not bench.is_kiln(c.name)))
    header = ["model", "eager ms", "kiln ms", "speedup"]
    for peer in peers:
        header += [f"{peer} ms", f"{peer} speedup"]
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
    lines = _align([header, *rows])
    return "\n".join(lines + ([""] + [f"* {n}" for n in notes] if notes else []))


def _rows(r: BenchResult, peers: Sequence[str]) -> list[list[str]]:
    kilns = [c for c in r.contenders if bench.is_kiln(c.name)]
    rows = []
    for k in kilns:
        label = r.model if len(kilns) == 1 else f"{r.model} {k.name.removeprefix('kiln')}"
        row = [label, _ms(r.contenders[0].median_ms), _ms(k.median_ms), _x(k.speedup)]
        for peer in peers:
            p = r.contender(peer)
            row += [_ms(p.median_ms), _x(p.speedup)] if p else ["", ""]
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


def _align(table: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in table]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return lines


def _num(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _ms(x: float | None) -> str:
    return _num(x, ".3f")


def _x(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def _check_model(name: str) -> None:
    try:
        models.get(name)
    except ValueError as err:
        raise UsageError(str(err)) from None


class ProgressBar:
    """A one-line text bar, redrawn in place on a terminal and one line per step elsewhere."""

    WIDTH = 24

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.drawn = 0  # characters of the last in-place line, to blank it out

    def update(self, event: bench.Progress) -> None:
        filled = round(event.fraction * self.WIDTH)
        line = (f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {event.fraction:4.0%} "
                f"{event.index + 1}/{event.count} {event.model}: {event.step}")
        if self.tty:
            self.stream.write("\r" + line.ljust(self.drawn))
            self.drawn = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\r" + " " * self.drawn + "\r")
            self.stream.flush()


# -- kiln explain ----------------------------------------------------------------------------------


def _explain(args: argparse.Namespace) -> int:
    if (args.model is None) == (args.ir is None):
        raise UsageError("give a MODEL or --ir FILE (one of them)")
    if args.check and args.ir is None:
        raise UsageError("--check needs --ir FILE")
    if args.model is not None:
        _check_model(args.model)
    options = kiln.Options(opt_level=args.opt_level, fast_math=args.fast_math,
                           search=args.search)
    if args.rule is not None:
        try:
            rule_named(args.rule)
        except KeyError as err:
            raise UsageError(err.args[0]) from None
    enabled = [p.name for p in PIPELINE if options.opt_level >= p.min_level]
    if args.after is not None and args.after not in enabled:
        known = ", ".join(p.name for p in PIPELINE)
        if any(p.name == args.after for p in PIPELINE):
            raise UsageError(f"pass {args.after!r} does not run at opt level {args.opt_level}; "
                             f"passes that do: {', '.join(enabled)}")
        raise UsageError(f"unknown pass {args.after!r}; known passes: {known}")
    if args.ir is not None:
        case = _read_ir(args.ir)
        graph = case.graph
    else:
        model, inputs = models.build(args.model, quick=args.quick)
        try:
            graph = capture(model, inputs)
        except Exception as err:  # noqa: BLE001 - say what failed, without a traceback
            print(f"kiln: error: cannot capture {args.model}: {bench.describe_error(err)}",
                  file=sys.stderr)
            return 1
    if args.kernels:
        show_kernels(graph, options, args.counts_only)
        return 0
    traced = [args.rule] if args.rule else []
    _, records, snapshots = run_pipeline(graph, options, keep_snapshots=True,
                                         trace_rules=traced)
    if args.rule is not None:
        print(explain_rule(args.rule, graph, records, options))
        return 0
    if args.after is None:
        _show(f"captured: {len(graph.nodes)} nodes", graph, args.counts_only)
    for record, snapshot in zip(records, snapshots, strict=True):
        if args.after in (None, record.name):
            title = f"after {record.name}: {record.nodes_before} -> {record.nodes_after} nodes"
            fired = ", ".join(f"{name} x{s.fired}" for name, s in record.rules.items() if s.fired)
            if record.search is not None:
                title += f"; {record.search.describe()}"
            _show(title + (f"; rules fired: {fired}" if fired else ""), snapshot,
                  args.counts_only)
    if args.check:
        return _check_ir(case)
    return 0


def _read_ir(path: str):  # -> kiln.fuzz.case.Case
    from kiln.fuzz.repro import read_repro
    from kiln.ir import ParseError, VerificationError, verify

    try:
        case, note = read_repro(path)
        verify(case.graph)
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror}") from None
    except (ParseError, VerificationError, ValueError) as err:
        raise UsageError(f"{path} is not a valid kiln graph: {err}") from None
    if note:
        print(f"== {path}: {note} ==")
    return case


def _check_ir(case) -> int:  # case: kiln.fuzz.case.Case
    import tempfile

    from kiln.fuzz.check import CONFIGS, check_case

    print(f"== check: inputs {case.describe_inputs()} ==")
    with tempfile.TemporaryDirectory(prefix="kiln-explain-") as cache:
        outcome = check_case(case, CONFIGS, cache)
    if not outcome.valid:
        print(f"the reference interpreter cannot run these inputs: {outcome.invalid_reason}")
        return 1
    failed = {f.config: f for f in outcome.failures}
    for config in CONFIGS:
        print(f"{config.name:<14} {failed[config.name] if config.name in failed else 'agrees'}")
    return 1 if failed else 0


def explain_rule(name: str, graph: Graph, records: Sequence[PassRecord],
                 options: kiln.Options) -> str:
    """Where rule ``name`` fired in the pipeline, and at each node with its root op where it
    did not, the part of the pattern or guard that failed."""
    rule = rule_named(name)
    roots = ", ".join(sorted(op.text for op in rule.pattern.root_ops() or ()))
    lines = [f"rule {name} ({rule.safety.value}; root op {roots})"]
    passes = [r for r in records if name in r.rules]
    if not passes:
        why = ("it is fast_math: add --fast-math" if not rule.enabled(options.fast_math)
               else f"no pass at opt level {options.opt_level} runs it")
        lines.append(f"  not run: {why}")
        return "\n".join(lines)
    for record in passes:
        fired = [e.node for e in record.trace if e.fired]
        missed = [e for e in record.trace if not e.fired]
        lines.append(f"  in pass {record.name}: fired {len(fired)} time(s)"
                     + (f" at {', '.join(fired)}" if fired else ""))
        for event in missed:
            lines.append(f"    not at {event.node}: {event.reason}")
    return "\n".join(lines)


def capture(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Graph:
    """The kiln Graph that kiln.compile would optimize: torch.export, frozen weights, import."""
    from kiln.frontend.export import _freeze
    from kiln.frontend.importer import import_fx

    with torch.no_grad():
        program = torch.export.export(model, inputs).run_decompositions()
    frozen, _ = _freeze(program)
    return import_fx(program.graph_module, frozen).graph


def show_kernels(graph: Graph, options: kiln.Options, brief: bool = False) -> None:
    """Compile with generated kernels on and print every kernel; ``brief``: no C, no trace."""
    import dataclasses

    from kiln.engine import compile_graph

    # the compiler and kernel cache come from the environment (CC, KILN_CACHE_DIR)
    options = dataclasses.replace(kiln.Options.from_env(), opt_level=options.opt_level,
                                  fast_math=options.fast_math, generated_kernels=True)
    kernels = compile_graph(graph, options, range(len(graph.inputs))).report.kernels
    generated = sum(k.kind == "generated" for k in kernels)
    print(f"== kernels: {generated} generated, {len(kernels) - generated} library ==")
    for k in kernels:
        print(k)
        if k.decision:
            print(f"  decision: {k.decision}")
        if k.kind == "generated" and not brief:
            print("  schedule:\n" + _indent(k.trace or ""))
            print("  source:\n" + _indent(k.source or ""))


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.strip().splitlines())


def _show(title: str, graph: Graph, counts_only: bool) -> None:
    counts = graph.op_counts()
    print(f"== {title} ==")
    print(f"ops ({sum(counts.values())}, constants and scalars not counted): "
          + ", ".join(f"{op}: {n}" for op, n in counts.items()))
    if not counts_only:
        print(print_graph(graph))


if __name__ == "__main__":
    sys.exit(main())
