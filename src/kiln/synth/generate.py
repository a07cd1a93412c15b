"""TASO's rule generator with kiln's ops: enumerate, fingerprint, prune, prove, tag, write.

    result = generate(max_ops=3, seed=0, progress=lambda stage, done, total: ...)
    write_rules(result, "src/kiln/synth/generated/taso_ops_3.txt")

1. `kiln.synth.enumerate` builds every graph of up to ``max_ops`` ops over a pool of inputs;
2. `kiln.synth.fingerprint` evaluates each on random integers, pairs graphs with equal
   outputs (src: the larger graph, dst: the first, smallest one found) and prunes pairs
   that follow from smaller ones or from renaming;
3. each surviving pair becomes a `Law` (inputs are ?variables, the number input a
   ``(number ?s)``, attributes literal) named ``gen-<ops>-<n>``;
4. `prove_real` proves it (on the enumeration's shapes, by TASO's axioms first), in worker
   processes; only proven laws go to the rule file;
5. its safety tag is the evidence of `kiln.synth.check`'s comparisons on random and special
   float32 inputs, on the enumeration's instance (bit-identical: exact, and for elementwise
   laws only if `prove_exact` proves it; NaN/inf/±0 in the same places: ieee; else
   fast_math). check_law
   itself (new instances, more runs) takes ~5x longer; `kiln synth verify` runs it on the
   written file.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType
from kiln.rewrite.law import EXACT, FAST_MATH, IEEE, App, C, CondKind, Law, PVar, Safety, Term
from kiln.synth.enumerate import (
    DEFAULT_OPS,
    DEFAULT_POOL,
    Candidate,
    Enumerator,
    OpSpec,
    Role,
    Tensor,
    Var,
)
from kiln.synth.fingerprint import Pair, Pairing, draw_inputs, evaluate, fingerprint, renamed
from kiln.synth.instance import Instance, build
from kiln.synth.prove import Proof, ProofStatus, prove_exact, prove_real
from kiln.synth.text import ParsedLaw, RuleTextError, check_types, print_rules
from kiln.synth.workers import DeadlinePool

# progress(stage, done, total): ("enumerate", graphs so far, 0), every 2000 graphs, then
# ("enumerate", graphs, graphs) when done; ("prove", laws decided so far, candidate laws)
Progress = Callable[[str, int, int], None]

NUMBER_VALUE = 3.0  # the number input's value in the instance a law is proven on


@dataclass(frozen=True)
class Outcome:
    law: Law  # with its safety tag and provenance
    proof: Proof
    type_error: str = ""  # proven on the enumeration's shapes; other shapes type it apart

    @property
    def status(self) -> str:
        return "types differ" if self.type_error else self.proof.status.value

    @property
    def proven(self) -> bool:
        return self.proof.status is ProofStatus.PROVEN and not self.type_error


@dataclass
class GenerationResult:
    max_ops: int
    seed: int
    ops: tuple[str, ...]
    pool: tuple[Var, ...]
    time_limit_s: float
    laws: list[Law]  # proven, in a deterministic order
    unproven: list[Outcome]  # refuted, unknown, unsupported or types differ, with why
    graphs: int = 0  # graphs enumerated
    candidates: int = 0  # pairs left after pruning
    pruned: dict[str, int] = field(default_factory=dict)
    by_mix: dict[str, int] = field(default_factory=dict)  # proven laws by op mix
    by_status: dict[str, int] = field(default_factory=dict)
    by_safety: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # enumerate, prove, total

    def summary(self) -> str:
        lines = [f"{len(self.laws)} proven rules with up to {self.max_ops} ops "
                 f"(seed {self.seed}) in {self.seconds.get('total', 0):.1f} s: "
                 f"{self.graphs} graphs, {self.candidates} candidate rules"]
        lines.append("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in self.seconds.items()))
        lines.append("proofs: " + ", ".join(f"{k} {v}" for k, v in self.by_status.items()))
        lines.append("safety: " + ", ".join(f"{k} {v}" for k, v in self.by_safety.items()))
        lines.append("pruned: " + ", ".join(f"{k} {v}" for k, v in self.pruned.items()))
        lines.append("kinds: " + ", ".join(f"{k} {v}" for k, v in taso_kinds(self.laws).items()))
        lines.append("by op mix: " + ", ".join(f"{k} {v}" for k, v in self.by_mix.items()))
        return "\n".join(lines)


def generate(max_ops: int = 3, ops: Sequence[OpSpec] = DEFAULT_OPS, seed: int = 0,
             time_limit_s: float = 2.0, progress: Progress | None = None,
             pool: Sequence[Var] = DEFAULT_POOL, workers: int | None = None
             ) -> GenerationResult:
    """Generate and prove the rules of up to ``max_ops`` ops (module doc). ``time_limit_s``
    is per proof (z3's limits are wall-clock: on a busy machine a law near the limit may
    come out unknown); ``workers`` proof processes (default: the CPUs, at most 2). A pair
    is final when the enumeration finds it (later graphs prune only later pairs), so its
    proof starts then, beside the enumeration."""
    start = time.perf_counter()
    counts = _Counts()
    namer = _Namer()
    with _Provers(workers or min(2, os.cpu_count() or 1), time_limit_s) as provers:
        for pair in iter_pairs(max_ops, ops, seed, pool, progress, counts):
            # named in the enumeration's order: a proof that flips (a z3 time limit on a
            # busy machine) moves no other rule's name
            law = namer(to_law(pair, pool))
            provers.submit(law, instance_of(law, pool))
        enumerated = time.perf_counter()
        outcomes = provers.outcomes(progress)
    done = time.perf_counter()
    proven = [o.law for o in outcomes if o.proven]
    result = GenerationResult(
        max_ops, seed, tuple(s.name for s in ops), tuple(pool), time_limit_s, proven,
        [o for o in outcomes if not o.proven], graphs=counts.graphs,
        candidates=len(outcomes), pruned=counts.pruned)
    result.by_mix = dict(Counter(op_mix(law) for law in proven).most_common())
    result.by_status = dict(Counter(o.status for o in outcomes).most_common())
    result.by_safety = dict(Counter(law.safety.value for law in proven).most_common())
    result.seconds = {"enumerate": enumerated - start, "prove": done - enumerated,
                      "total": done - start}
    return result


@dataclass
class _Counts:
    graphs: int = 0
    pruned: dict[str, int] = field(default_factory=dict)


def enumerate_pairs(max_ops: int, ops: Sequence[OpSpec], seed: int, pool: Sequence[Var],
                    progress: Progress | None = None) -> tuple[list[Pair], int, dict[str, int]]:
    """Candidate rules (pruned pairs), the number of graphs, and the pruning counts."""
    counts = _Counts()
    pairs = list(iter_pairs(max_ops, ops, seed, pool, progress, counts))
    return pairs, counts.graphs, counts.pruned


def iter_pairs(max_ops: int, ops: Sequence[OpSpec], seed: int, pool: Sequence[Var],
               progress: Progress | None = None, counts: _Counts | None = None
               ) -> Iterator[Pair]:
    """Each candidate rule (a pruned pair, renamed) as soon as the enumeration finds it;
    ``counts`` gets the number of graphs and the pruning counts at the end."""
    inputs = draw_inputs(pool, seed)
    enumerator = Enumerator(pool, ops, inputs, evaluate, fingerprint)
    pairing = Pairing(pool, seed)
    for zero_ops in _variable_graphs(enumerator):
        pairing.add(zero_ops)
    yield from (renamed(p) for p in pairing.pairs)
    found = len(pairing.pairs)
    graphs = 0
    for num_ops in range(1, max_ops + 1):
        for candidate in enumerator.graphs(num_ops):
            graphs += 1
            pairing.add(candidate)
            if len(pairing.pairs) > found:
                yield from (renamed(p) for p in pairing.pairs[found:])
                found = len(pairing.pairs)
            if progress is not None and graphs % 2000 == 0:
                progress("enumerate", graphs, 0)
    if progress is not None:
        progress("enumerate", graphs, graphs)
    if counts is not None:
        counts.graphs, counts.pruned = graphs, dict(pairing.pruned)


def _variable_graphs(enumerator: Enumerator) -> list[Candidate]:
    """Graphs of no ops whose outputs are one or two inputs (split(cat(x1, x2)) -> x1, x2)."""
    tensors = [t for t in enumerator.inputs if t.var is not None and
               t.var.role is not Role.NUMBER]
    ones = [Candidate((t,), 0) for t in tensors]
    twos = [Candidate((a, b), 0) for i, a in enumerate(tensors) for b in tensors[i + 1:]]
    return ones + twos


# --- pairs to laws -----------------------------------------------------------------------------

def to_law(pair: Pair, pool: Sequence[Var]) -> Law:
    """The pair as a law over canonical variable names; numbers get ``(number ?s)``, and
    a law with a split asks its same-class inputs to have one type (the split's literal
    sizes are halves of the enumeration's shapes)."""
    mapping = dict(pair.renaming)
    def rename(name: str) -> str:
        return mapping.get(name, name)
    src = tuple(t.term(rename) for t in pair.src)
    dst = tuple(t.term(rename) for t in pair.dst)
    names = sorted(set(mapping.values()))
    by_name = {v.name: v for v in pool}
    when = [C(CondKind.NUMBER, PVar(n)) for n in names if by_name[n].role is Role.NUMBER]
    if any(t.spec is not None and t.spec.op is Op.SPLIT for out in pair.src + pair.dst
           for t in _walk(out)):
        classes: dict[tuple, list[str]] = {}
        for n in names:
            if by_name[n].role is not Role.NUMBER:
                classes.setdefault(by_name[n].klass, []).append(n)
        when += [C(CondKind.SAME_TYPE, PVar(group[0]), PVar(other))
                 for group in classes.values() for other in group[1:]]
    provenance = (("origin", "generated"), ("fingerprint", pair.fingerprint),
                  ("ops", f"{pair.src_ops} -> {pair.dst_ops}"))
    return Law(f"candidate-{pair.fingerprint}", src, dst, FAST_MATH, tuple(when), provenance)


def _walk(t: Tensor):  # noqa: ANN202 - a generator of tensors
    yield t
    for operand in t.operands:
        yield from _walk(operand)


def instance_of(law: Law, pool: Sequence[Var]) -> Instance:
    """The enumeration's shapes for the law's inputs (f32), its number a fixed value."""
    by_name = {v.name: v for v in pool}
    tensors, numbers = {}, {}
    for name in law.variables():
        var = by_name[name]
        if var.role is Role.NUMBER:
            numbers[name] = NUMBER_VALUE
        else:
            tensors[name] = TensorType(var.shape, DType.F32)
    return Instance(tensors, numbers, {})


def op_mix(law: Law) -> str:
    """The law's op names, sorted (conv_act and permute by what they are here)."""
    names = set()
    for term in law.src + law.dst:
        names |= _op_names(term)
    return "+".join(sorted(names)) or "none"


def _op_names(term: Term) -> set[str]:
    if not isinstance(term, App):
        return set()
    name = {Op.CONV_ACT: "conv_relu", Op.PERMUTE: "transpose", Op.CONVOLUTION: "conv"}.get(
        term.op, term.op.text)
    return {name}.union(*(_op_names(a) for a in term.args))


class _Namer:
    """gen-<op mix>-<n>, n counting within the mix in the laws' order (the candidates', so
    that the rule file's numbers have gaps where a candidate was not proven)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, law: Law) -> Law:
        mix = op_mix(law).replace("+", ".")
        self.counts[mix] += 1
        return Law(f"gen-{mix}-{self.counts[mix]}", law.src, law.dst, law.safety, law.when,
                   law.provenance)


# --- proofs and tags -------------------------------------------------------------------------

class _Provers:
    """Proofs run as laws are submitted: in ``workers`` processes (forked when entered,
    before the enumeration has grown the parent; a proof past DEADLINE_FACTOR times its
    limit, plus DEADLINE_SLACK_S, has its worker killed and runs again, then is unknown),
    or at the end in this one for a single worker. `outcomes` waits for all of them, in
    submission order."""

    def __init__(self, workers: int, time_limit_s: float) -> None:
        self.time_limit_s = time_limit_s
        self.jobs: list[tuple[Law, Instance, float]] = []
        self.pool = DeadlinePool(_prove_one, workers, DEADLINE_FACTOR * time_limit_s +
                                 DEADLINE_SLACK_S, _stopped, _worker_init) \
            if workers > 1 else None

    def __enter__(self) -> _Provers:
        if self.pool is not None:
            self.pool.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.__exit__(*exc)

    def submit(self, law: Law, instance: Instance) -> None:
        job = (law, instance, self.time_limit_s)
        if self.pool is None:
            self.jobs.append(job)
        else:
            self.pool.submit(job)

    def outcomes(self, progress: Progress | None) -> list[Outcome]:
        if self.pool is not None:
            return self.pool.results(lambda done, total: _report(progress, done, total))
        outcomes: list[Outcome] = []
        for job in self.jobs:
            outcomes.append(_prove_one(job))
            _report(progress, len(outcomes), len(self.jobs))
        return outcomes


# a proof's own limits: prove_real's, prove_exact's in the tag, and the type check (~0.2 s)
DEADLINE_FACTOR = 2
DEADLINE_SLACK_S = 3.0


def _stopped(job: tuple[Law, Instance, float], why: str) -> Outcome:
    law, instance, _ = job
    provenance = law.provenance + (("proof", f"unknown: {why}"),
                                   ("instance", instance.describe()))
    return Outcome(Law(law.name, law.src, law.dst, FAST_MATH, law.when, provenance),
                   Proof(ProofStatus.UNKNOWN, "z3", why))


def _report(progress: Progress | None, done: int, total: int) -> None:
    if progress is not None:
        progress("prove", done, total)


def _worker_init() -> None:
    torch.set_num_threads(1)


def _prove_one(job: tuple[Law, Instance, float]) -> Outcome:
    law, instance, time_limit_s = job
    try:
        proof = prove_real(law, [instance], time_limit_s)
    except Exception as err:  # noqa: BLE001 - z3 and the encoders raise many kinds
        proof = Proof(ProofStatus.UNKNOWN, "z3", f"the prover failed: {type(err).__name__}")
    safety = FAST_MATH
    type_error = ""
    if proof.status is ProofStatus.PROVEN:
        safety = tag(law, instance, time_limit_s)
        type_error = _type_error(law, proof)
    method = proof.method + (f" ({proof.detail})" if proof.detail and
                             proof.status is ProofStatus.PROVEN else "")
    provenance = law.provenance + (("proof", f"{proof.status.value}: {method}"),
                                   ("instance", instance.describe()))
    tagged = Law(law.name, law.src, law.dst, safety, law.when, provenance)
    return Outcome(tagged, proof, type_error)


def _type_error(law: Law, proof: Proof) -> str:
    """Where the law's sides have different types on other shapes (kiln.synth.text's check
    of a rule file), or "". A law the axioms prove holds for every shape (a split's for
    every shape with its sizes), so its sides agree wherever both type-check; the others
    were proven on the enumeration's shapes only, and get the rule file's check."""
    if proof.method == "axioms" and Op.SPLIT not in law.ops():
        return ""
    try:
        check_types(ParsedLaw(law, 0))
    except RuleTextError as err:
        return err.message
    return ""


TAG_TRIALS = 4  # input sets per law: alternately random and with special values


def tag(law: Law, instance: Instance, time_limit_s: float, seed: int = 0) -> Safety:
    """The strongest tag the runs support: check_law's comparisons (kiln.synth.check) on the
    enumeration's instance (and its number operands at other values), built once and run on
    random and on special float32 inputs (bit-identical: exact, and for an elementwise law
    only if prove_exact proves it; NaN, ±inf and ±0 in the same places where no
    intermediate overflowed: ieee; else fast_math)."""
    tags = [_run_tag(law, dataclasses.replace(instance, numbers=numbers), seed)
            for numbers in _number_values(instance)]
    evidence = min(tags, key=lambda t: _STRENGTH[t])
    if evidence is EXACT and _elementwise(law):
        exact = prove_exact(law, time_limit_s, [instance])
        if exact.status is not ProofStatus.PROVEN:  # refuted, or z3 ran out of time
            return IEEE
    return evidence


_STRENGTH = {FAST_MATH: 1, IEEE: 2, EXACT: 3}
OTHER_NUMBERS = (-0.1, 1e4)  # a number operand's values in the tag's runs, after NUMBER_VALUE


def _number_values(instance: Instance) -> list[dict[str, bool | int | float]]:
    if not instance.numbers:
        return [{}]
    return [dict(instance.numbers)] + [{k: v for k in instance.numbers}
                                       for v in OTHER_NUMBERS]


def _run_tag(law: Law, instance: Instance, seed: int) -> Safety:
    from kiln.synth.check import (  # the comparisons check_law judges by
        bit_identical,
        ieee_difference,
        ill_conditioned,
        random_input,
    )

    wide = dataclasses.replace(instance, tensors={k: TensorType(t.shape, DType.F64)
                                                  for k, t in instance.tensors.items()})
    try:
        narrow_sides, wide_sides = build(law, instance), build(law, wide)
    except Exception:  # noqa: BLE001 - a side that does not build gets the weakest tag
        return FAST_MATH
    gen = torch.Generator().manual_seed(seed)
    bits = ieee = True
    for trial in range(TAG_TRIALS):
        special = trial % 2 == 1
        inputs = [random_input(node.type, gen, special) for node in narrow_sides.src.inputs]
        try:
            src, dst = interpret(narrow_sides.src, inputs), interpret(narrow_sides.dst, inputs)
            wide_inputs = [x.double() for x in inputs]
            wsrc = interpret(wide_sides.src, wide_inputs)
            wdst = interpret(wide_sides.dst, wide_inputs)
        except RuntimeError:
            return FAST_MATH
        for a, b, wa, wb in zip(src, dst, wsrc, wdst):
            bits = bits and bit_identical(a, b)
            if special and ieee:
                rounding = ill_conditioned(a, wa) | ill_conditioned(b, wb)
                ieee = not ieee_difference(a, b, rounding)
    return EXACT if bits and ieee else IEEE if ieee else FAST_MATH


def _elementwise(law: Law) -> bool:
    from kiln.ir.ops import OpGroup

    return all(op.is_a(OpGroup.ELEMENTWISE) for op in law.ops())


# --- TASO's kinds of rule ----------------------------------------------------------------------

def taso_kinds(laws: Sequence[Law]) -> dict[str, int]:
    """How many laws of each kind TASO's paper names (a law may be of several kinds)."""
    kinds = {
        "matmul associativity": lambda m: m == {"mm"},
        "matmul distributivity": lambda m: "mm" in m and m & {"add", "mul"} == {"add"},
        "matmul with scalar": lambda m: "mm" in m and "mul" in m,
        "concat/split algebra": lambda m: bool(m & {"cat", "split"}),
        "conv linearity": lambda m: bool(m & {"conv", "conv_relu"}) and bool(m & {"add", "mul"}),
        "conv+relu": lambda m: "conv_relu" in m or {"conv", "relu"} <= m,
        "conv with concat/split": lambda m: bool(m & {"conv", "conv_relu"})
        and bool(m & {"cat", "split"}),
        "transpose": lambda m: "transpose" in m,
    }
    counts: Counter[str] = Counter()
    for law in laws:
        mix = set(op_mix(law).split("+"))
        for kind, test in kinds.items():
            if test(mix):
                counts[kind] += 1
    return {kind: counts[kind] for kind in kinds}


# --- the rule file -------------------------------------------------------------------------

def write_rules(result: GenerationResult, path: str | Path) -> None:
    """The proven laws as a rule file (kiln.synth.text), with a header saying how they were
    made and what was found."""
    pool = ", ".join(f"{v.name}: {'number' if v.role is Role.NUMBER else list(v.shape)}"
                     for v in result.pool)
    header = [f"Generated by kiln.synth.generate: max_ops={result.max_ops}, "
              f"seed={result.seed}, ops: {' '.join(result.ops)}",
              f"pool: {pool}; proof time limit {result.time_limit_s} s",
              "TASO's method: every graph of up to max_ops ops over a pool of inputs, "
              "fingerprinted on random integers;",
              "graphs with equal fingerprints paired and pruned, each pair proven by z3 "
              "(kiln.synth.prove.prove_real) and tagged by runs on special values.",
              f"{result.graphs} graphs, {result.candidates} candidate rules, "
              f"{len(result.laws)} proven (only these are listed).",
              "proof status: " + ", ".join(f"{k} {v}" for k, v in result.by_status.items()),
              "safety: " + ", ".join(f"{k} {v}" for k, v in result.by_safety.items()),
              "TASO's kinds: " + ", ".join(f"{k} {v}" for k, v in
                                           taso_kinds(result.laws).items()),
              "by op mix:"]
    mixes = [f"{k} {v}" for k, v in result.by_mix.items()]
    for at in range(0, len(mixes), 6):
        header.append("  " + ", ".join(mixes[at:at + 6]))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(print_rules(result.laws, "\n".join(header)))


__all__ = ["GenerationResult", "Outcome", "enumerate_pairs", "generate", "instance_of",
           "iter_pairs", "taso_kinds", "to_law", "write_rules"]
