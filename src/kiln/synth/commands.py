"""What `kiln rules ...` and `kiln synth verify` do, apart from parsing the command line.

    kiln rules print -o rules.txt       every hand-written rule's laws, in the rule text format
    kiln rules check                     prove or check each law; exit 1 when one is refuted
    kiln synth verify my-rules.txt       the same checks on a rule file
    kiln synth generate --max-ops 3 -o rules.txt   TASO's generator: enumerate, prove, write

The table has one row per law: its declared tag, the verdict, the tag the evidence
supports, how it was decided and, for a refuted law, the counterexample.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from kiln.rewrite.law import Law
from kiln.rewrite.rule import Rule
from kiln.synth.text import load_rules, print_rules


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
    bar = _StageBar(err)
    result = generate(max_ops=max_ops, ops=ops, seed=seed, time_limit_s=time_limit_s,
                      progress=bar.update)
    bar.close()
    write_rules(result, output)
    err.write(result.summary() + "\n")
    err.write(f"{len(result.laws)} proven rules written to {output} "
              f"({result.seconds['total']:.0f} s)\n")
    return 0


class _StageBar:
    """One line per stage, redrawn in place on a terminal, every 10% elsewhere."""

    WIDTH = 24

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last: tuple[str, int] = ("", -1)

    def update(self, stage: str, done: int, total: int) -> None:
        fraction = done / total if total else 0.0
        tenth = int(fraction * 10) if total else done // 20000
        if not self.tty and (stage, tenth) == self.last:
            return
        self.last = (stage, tenth)
        filled = round(fraction * self.WIDTH)
        count = f"{done}/{total}" if total else f"{done} graphs"
        line = f"{stage:<9} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {count}"
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
