"""`kiln rules ...` and `kiln synth ...`: print, prove and generate rewrite rules.

    kiln rules print -o rules.txt       every hand-written rule's laws, in the rule text format
    kiln rules check                     prove or check each law; exit 1 when one is refuted
    kiln synth verify my-rules.txt       the same checks on a rule file
    kiln synth generate --max-ops 3 -o rules.txt   TASO's generator: enumerate, prove, write

The table has one row per law: its declared tag, the verdict, the tag the evidence
supports, how it was decided and, for a refuted law, the counterexample.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from kiln.cli.errors import UsageError
from kiln.cli.output import StepProgress
from kiln.rewrite.law import Law
from kiln.rewrite.rule import Rule
from kiln.synth.text import RuleTextError, load_rules, print_rules


class SynthUnavailable(Exception):
    """z3 is missing: the proofs need the ``synth`` extra."""


def hand_laws(names: Sequence[str] = ()) -> list[tuple[Law, Rule]]:
    """Every hand-written rule's laws (or those of the named rules), with their rule."""
    from kiln.rules import ALL_RULES, rule_named

    rules = [rule_named(n) for n in names] if names else list(ALL_RULES)
    return [(law, rule) for rule in rules for law in rule.laws]


def print_hand_rules(out: TextIO) -> int:
    laws = [law for law, _ in hand_laws()]
    header = ("kiln's hand-written rules (kiln.rules), as laws in the rule text format.\n"
              "Written by `kiln rules print`; `kiln synth verify FILE` checks a file like it.")
    out.write(print_rules(laws, header))
    return 0


def check_hand_rules(names: Sequence[str], time_limit_s: float, out: TextIO,
                     json_path: str | None = None) -> int:
    return _check_all(hand_laws(names), time_limit_s, out, json_path)


def verify_file(path: str, time_limit_s: float, out: TextIO,
                json_path: str | None = None) -> int:
    from kiln.rules import rule_of_law

    laws = load_rules(path)  # RuleTextError: the caller prints it, naming the line
    # a law with a hand-written rule's guard is checked where that rule fires
    items = [(law, rule_of_law(law.name) if _has_guard(law) else None) for law in laws]
    return _check_all(items, time_limit_s, out, json_path)


def _has_guard(law: Law) -> bool:
    return any(c.kind.text == "guard" for c in law.when)


def _check_all(items: Sequence[tuple[Law, Rule | None]], time_limit_s: float, out: TextIO,
               json_path: str | None) -> int:
    check_law = _checker()
    start = time.perf_counter()
    verdicts = []
    width = max([len(law.name) for law, _ in items] + [4])
    out.write(f"{'rule':<{width}}  {'tag':<9}  {'verdict':<8}  {'evidence':<9}  how\n")
    for law, rule in items:
        verdict = check_law(law, rule, time_limit_s)
        verdicts.append(verdict)
        evidence = verdict.evidence.value if verdict.evidence else "-"
        out.write(f"{law.name:<{width}}  {law.safety.value:<9}  {verdict.status.value:<8}  "
                  f"{evidence:<9}  {verdict.method} ({verdict.seconds:.1f} s)\n")
        if verdict.detail and verdict.status.value in ("refuted", "unknown"):
            out.write(f"{'':<{width}}  {verdict.detail}\n")
        out.flush()
    counts = Counter(v.status.value for v in verdicts)
    summary = ", ".join(f"{counts[s]} {s}" for s in ("proven", "checked", "refuted", "unknown"))
    out.write(f"\n{len(verdicts)} laws: {summary} ({time.perf_counter() - start:.0f} s)\n")
    if json_path:
        Path(json_path).write_text(json.dumps([_as_json(v) for v in verdicts], indent=1))
    return 1 if counts["refuted"] else 0


def _as_json(verdict) -> dict[str, object]:  # noqa: ANN001
    return {"rule": verdict.law.name, "tag": verdict.law.safety.value,
            "verdict": verdict.status.value,
            "evidence": verdict.evidence.value if verdict.evidence else None,
            "method": verdict.method, "detail": verdict.detail,
            "seconds": round(verdict.seconds, 3)}


def _checker() -> Callable:
    try:
        from kiln.synth.check import check_law
    except ImportError as err:  # z3 is an optional dependency
        raise SynthUnavailable(f"proofs need z3 ({err}); install kiln's synth extra: "
                               "pip install 'kiln[synth]'") from None
    return check_law



def generate_rules(max_ops: int, op_names: Sequence[str], seed: int, time_limit_s: float,
                   output: str, err: TextIO) -> int:
    """Run the generator with a progress bar on ``err``; write the proven rules to
    ``output`` and print the counts."""
    try:
        from kiln.synth.enumerate import DEFAULT_OPS, OPS_BY_NAME
        from kiln.synth.generate import generate, write_rules
    except ImportError as error:
        raise SynthUnavailable(f"generating rules needs z3 ({error}); install kiln's synth "
                               "extra: pip install 'kiln[synth]'") from None
    unknown = [n for n in op_names if n not in OPS_BY_NAME]
    if unknown:
        raise ValueError(f"unknown op {unknown[0]!r} for the generator; known: "
                         f"{', '.join(OPS_BY_NAME)}")
    ops = tuple(OPS_BY_NAME[n] for n in op_names) if op_names else DEFAULT_OPS
    update, close = _stage_progress(err)
    try:
        result = generate(max_ops=max_ops, ops=ops, seed=seed, time_limit_s=time_limit_s,
                          progress=update)
    finally:
        close()
    write_rules(result, output)
    err.write(result.summary() + "\n")
    err.write(f"{len(result.laws)} proven rules written to {output} "
              f"({result.seconds['total']:.0f} s)\n")
    return 0


def _stage_progress(err: TextIO):  # -> (update(stage, done, total), close())
    bar = StepProgress(err)

    def update(stage: str, done: int, total: int) -> None:
        fraction = done / total if total else 0.0
        tenth = int(fraction * 10) if total else done // 20000  # log lines every 10%
        count = f"{done}/{total}" if total else f"{done} graphs"
        bar.update(fraction, f"{stage:<9} {count}", key=(stage, tenth))

    return update, bar.close


# --- the command line: kiln rules ..., kiln synth ... ----------------------------------------

def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add `kiln rules` and `kiln synth` to the ``kiln`` parser."""
    r = commands.add_parser("rules", help="kiln's hand-written rules: print them as rule text, "
                            "or prove and check each", epilog="example: kiln rules check")
    rules = r.add_subparsers(title="rules commands", required=True, metavar="COMMAND")
    rp = rules.add_parser("print", help="every rule's laws in the rule text format "
                          "(docs/rules.md)", epilog="example: kiln rules print -o rules.txt")
    rp.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: stdout)")
    rp.set_defaults(run=_rules_print)
    rc = rules.add_parser(
        "check", help="prove (z3) or check every rule; exit code 1 when one is refuted",
        description="For each law of each hand-written rule: a z3 proof in real arithmetic "
        "(axioms for every shape, or the concrete semantics on small shapes), bit-identity "
        "for exact rules (z3's floating-point theory on scalars and runs on special values), "
        "and NaN/inf/signed-zero behaviour for ieee rules. Prints proven / checked / refuted "
        "/ unknown per law with the tag the evidence supports.",
        epilog="example: kiln rules check --rule conv-bn --time-limit 5 --json verdicts.json")
    rc.add_argument("--rule", nargs="+", action="extend", metavar="NAME",
                    help="only these rules (default: all)")
    _add_check_options(rc)
    rc.set_defaults(run=_rules_check)

    s = commands.add_parser("synth", help="rule files: generate, or verify a file of rules in "
                            "kiln's rule text format",
                            epilog="example: kiln synth generate --max-ops 2 -o rules.txt")
    synth = s.add_subparsers(title="synth commands", required=True, metavar="COMMAND")
    sv = synth.add_parser("verify", help="parse, type-check, prove and check a rule file",
                          epilog="example: kiln synth verify my-rules.txt --json verdicts.json")
    sv.add_argument("file", metavar="FILE", help="a rule file (grammar: docs/rules.md)")
    _add_check_options(sv)
    sv.set_defaults(run=lambda args: _guarded(lambda: verify_file(
        args.file, args.time_limit, sys.stdout, args.json)))
    sg = synth.add_parser(
        "generate", help="TASO's rule generator: every graph of up to N ops, paired by "
        "fingerprint, pruned, proven, tagged, written as a rule file",
        epilog="example: kiln synth generate --max-ops 3 -o rules.txt")
    sg.add_argument("--max-ops", type=int, default=3, metavar="N",
                    help="operators per graph, at most (default 3)")
    sg.add_argument("--ops", default="", metavar="A,B,...",
                    help="the operator set (default: add, mul, smul, mm, transpose, conv, "
                         "conv_relu, relu, cat0, cat1, split0, split1)")
    sg.add_argument("--seed", type=int, default=0, help="fingerprint seed (default 0)")
    sg.add_argument("--time-limit", type=float, default=2.0, metavar="SECONDS",
                    help="z3's limit per proof (default 2)")
    sg.add_argument("-o", "--output", required=True, metavar="FILE", help="the rule file")
    sg.set_defaults(run=_synth_generate)


def _add_check_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--time-limit", type=float, default=10.0, metavar="SECONDS",
                   help="z3's limit per proof (default 10); past it a proof is unknown")
    p.add_argument("--json", metavar="FILE", help="also write the verdicts to FILE")


def _rules_print(args: argparse.Namespace) -> int:
    if not args.output:
        return print_hand_rules(sys.stdout)
    try:
        with open(args.output, "w") as out:
            return print_hand_rules(out)
    except OSError as err:
        raise UsageError(f"cannot write {args.output}: {err.strerror}") from None


def _rules_check(args: argparse.Namespace) -> int:
    from kiln.rules import rule_named

    for name in args.rule or ():
        try:
            rule_named(name)
        except KeyError as err:
            raise UsageError(err.args[0]) from None
    return _guarded(lambda: check_hand_rules(args.rule or (), args.time_limit, sys.stdout,
                                             args.json))


def _synth_generate(args: argparse.Namespace) -> int:
    if args.max_ops < 1:
        raise UsageError(f"--max-ops must be at least 1, got {args.max_ops}")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        raise UsageError(f"-o {args.output}: no such directory")
    names = [n.strip() for n in args.ops.split(",") if n.strip()]
    try:
        return _guarded(lambda: generate_rules(args.max_ops, names, args.seed,
                                               args.time_limit, args.output, sys.stderr))
    except ValueError as err:
        raise UsageError(str(err)) from None


def _guarded(job: Callable[[], int]) -> int:
    """A bad rule file or a missing z3 is the user's to fix: one line, no traceback."""
    try:
        return job()
    except (RuleTextError, SynthUnavailable) as err:
        raise UsageError(str(err)) from None
