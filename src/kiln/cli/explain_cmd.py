"""`kiln explain`: the IR after capture and after each pass, a rule's story, the kernels."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

import kiln
from kiln import bench, models
from kiln.cli.bench_cmd import check_model
from kiln.cli.errors import UsageError
from kiln.ir import Graph, print_graph
from kiln.options import SEARCH_STRATEGIES
from kiln.passes.pipeline import PIPELINE, PassRecord, run_pipeline
from kiln.rules import rule_named


def add_command(commands: argparse._SubParsersAction) -> None:
    e = commands.add_parser("explain", help="the IR after capture and after each pass",
                            epilog="example: kiln explain bert --quick --rule merge-parallel-addmm")
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
    e.add_argument("--pet", action="store_true",
                   help="run the PET pass (partially equivalent mutants with corrections); "
                        "its summary says what it tried and applied")
    e.add_argument("--kernels", action="store_true",
                   help="the kernels with generated kernels on: generated (C source and "
                        "schedule) or library, covering every computing node")
    e.set_defaults(run=_explain)



def _explain(args: argparse.Namespace) -> int:
    if (args.model is None) == (args.ir is None):
        raise UsageError("give a MODEL or --ir FILE (one of them)")
    if args.check and args.ir is None:
        raise UsageError("--check needs --ir FILE")
    if args.model is not None:
        check_model(args.model)
    options = kiln.Options(opt_level=args.opt_level, fast_math=args.fast_math,
                           search=args.search, pet=args.pet)
    if args.rule is not None:
        try:
            rule_named(args.rule)
        except KeyError as err:
            raise UsageError(err.args[0]) from None
    enabled = [p.name for p in PIPELINE if options.opt_level >= p.min_level
               and (p.name != "pet" or options.pet)]
    if args.after == "pet" and not options.pet:
        raise UsageError("pass 'pet' runs only with --pet")
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
            if record.pet is not None:
                title += f"; {record.pet.describe()}"
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
    from kiln.frontend.export import import_model

    return import_model(model, inputs).graph


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
