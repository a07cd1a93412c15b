"""kiln.synth.generate: TASO's generator over kiln ops finds known rules, prunes what
follows from smaller ones, proves what it writes, and writes the same file for a seed."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from kiln.ir.ops import Op
from kiln.rewrite.law import App, Law, term_variables
from kiln.synth import enumerate as en
from kiln.synth.fingerprint import draw_inputs, evaluate
from kiln.synth.generate import (
    GenerationResult,
    enumerate_pairs,
    generate,
    instance_of,
    to_law,
    write_rules,
)
from kiln.synth.prove import ProofStatus, prove_real
from kiln.synth.text import (
    check_types,
    load_rules,
    parse_rules,
    parse_rules_at,
    print_rules,
    print_term,
)

GENERATED = Path(__file__).parents[2] / "src/kiln/synth/generated/taso_ops_3.txt"


def pool(*names: str) -> tuple[en.Var, ...]:
    return tuple(v for v in en.DEFAULT_POOL if v.name in names)


POOL_2D = pool("x1", "w1", "w2", "w3")


def normal(src: str, dst: str) -> str:
    """The rule's text with its variables named by first appearance: ?a, ?b, ..."""
    names: dict[str, str] = {}
    return re.sub(r"\?\w+", lambda m: names.setdefault(m.group(0), f"?{chr(97 + len(names))}"),
                  f"{src} => {dst}")


def has_rule(result: GenerationResult, a: str, b: str) -> bool:
    """Is a <-> b a generated law (either direction, any names of its variables)?"""
    found = {normal(" ".join(map(print_term, law.src)), " ".join(map(print_term, law.dst)))
             for law in result.laws}
    return normal(a, b) in found or normal(b, a) in found


@pytest.fixture(scope="module")
def small() -> GenerationResult:
    return generate(max_ops=2, ops=(en.MM, en.TRANSPOSE, en.ADD, en.RELU), seed=0,
                    pool=POOL_2D, workers=1)


def test_a_seed_gives_the_same_rules(small: GenerationResult) -> None:
    again = generate(max_ops=2, ops=(en.MM, en.TRANSPOSE, en.ADD, en.RELU), seed=0,
                     pool=POOL_2D, workers=1)
    assert print_rules(again.laws) == print_rules(small.laws)
    assert small.laws and small.graphs > 100


def test_proofs_in_worker_processes_beside_the_enumeration_give_the_same_rules(
        small: GenerationResult) -> None:
    progress: list[tuple[str, int, int]] = []
    parallel = generate(max_ops=2, ops=(en.MM, en.TRANSPOSE, en.ADD, en.RELU), seed=0,
                        pool=POOL_2D, workers=2,
                        progress=lambda *step: progress.append(step))
    assert print_rules(parallel.laws) == print_rules(small.laws)
    assert [o.law.name for o in parallel.unproven] == [o.law.name for o in small.unproven]
    # the enumeration finishes before the proofs are counted, each proof counted once
    stages = [stage for stage, _, _ in progress]
    assert stages.index("prove") > max(i for i, s in enumerate(stages) if s == "enumerate")
    total = len(parallel.laws) + len(parallel.unproven)
    assert [done for stage, done, _ in progress if stage == "prove"] == \
        list(range(1, total + 1))


def test_transpose_of_transpose(small: GenerationResult) -> None:
    assert has_rule(small, "(permute :dims (1 0) (permute :dims (1 0) ?w1))", "?w1")


def test_commutativity_is_canonical_order_not_a_rule(small: GenerationResult) -> None:
    # add takes its operands in term order, so add(w2, w1) is never built: commutativity
    # is the enumeration's canonical order, not a generated rule
    assert not has_rule(small, "(add ?w1 ?w2)", "(add ?w2 ?w1)")
    assert not any(law.src == law.dst for law in small.laws)


def test_rules_print_parse_and_are_proven(small: GenerationResult) -> None:
    assert parse_rules(print_rules(small.laws)) == small.laws
    for law in small.laws:
        assert law.name.startswith("gen-")
        provenance = dict(law.provenance)
        assert provenance["origin"] == "generated"
        assert provenance["proof"].startswith("proven")
        assert provenance["fingerprint"]
    assert small.by_status["proven"] == len(small.laws)


def candidates(max_ops: int, ops: tuple[en.OpSpec, ...], names: tuple[str, ...]
               ) -> list[Law]:
    """The candidate laws of a small enumeration (not proven: quicker)."""
    pairs, _, _ = enumerate_pairs(max_ops, ops, 0, pool(*names))
    return [to_law(p, pool(*names)) for p in pairs]


def find(laws: list[Law], a: str, b: str) -> Law:
    """The law a <-> b, proven on the enumeration's shapes."""
    for law in laws:
        text = normal(" ".join(map(print_term, law.src)), " ".join(map(print_term, law.dst)))
        if text in (normal(a, b), normal(b, a)):
            instance = instance_of(law, en.DEFAULT_POOL)
            assert prove_real(law, [instance], 5.0).status is ProofStatus.PROVEN
            return law
    raise AssertionError(f"no rule {a} <-> {b}")


def test_matmul_associativity() -> None:
    laws = candidates(3, (en.MM,), ("x1", "w1", "w2"))
    find(laws, "(mm (mm ?x1 ?w1) ?w2)", "(mm ?x1 (mm ?w1 ?w2))")


def test_transpose_of_a_product() -> None:
    laws = candidates(3, (en.MM, en.TRANSPOSE), ("w1", "w2"))
    find(laws, "(permute :dims (1 0) (mm ?w1 ?w2))",
         "(mm (permute :dims (1 0) ?w2) (permute :dims (1 0) ?w1))")


def test_the_same_law_is_kept_once_and_relu_relu_survives_pruning() -> None:
    result = generate(max_ops=2, ops=(en.RELU, en.ADD), seed=0, workers=1,
                      pool=pool("x1", "w1"))
    assert has_rule(result, "(relu (relu ?w1))", "(relu ?w1)")
    assert len([law for law in result.laws if "relu (relu" in print_rules([law])]) == 1


def test_merging_two_matmuls_of_one_input() -> None:
    laws = candidates(3, (en.MM, en.CAT1, en.SPLIT1), ("x1", "w1", "w2"))
    split = "(split :dim 1 :sizes (2 2) (mm ?x1 (cat :dim 1 ?w1 ?w2)))"
    merged = parse_rules(f"(rule r (src {split} (nth 1 {split})) (dst ?x1 ?x1) "
                         "(safety exact))")[0].src
    (merge,) = [law for law in laws if law.dst == merged]
    assert all(isinstance(t, App) and t.op is Op.MM for t in merge.src)
    # no multi-output law is single-output laws side by side, except where those are never
    # found alone (a split's outputs): split(cat(w1, w2)) -> w1, w2
    for law in laws:
        assert all(isinstance(t, App) for t in law.src), print_rules([law])
        assert len(law.src) == 1 or any(isinstance(t, App) and t.op is Op.SPLIT
                                        for t in law.src) or any(
            not set(term_variables(d)) <= set(term_variables(s))
            for s, d in zip(law.src, law.dst)), print_rules([law])
    split = "(split :dim 1 :sizes (2 2) (cat :dim 1 ?w1 ?w2))"
    inverse = parse_rules(f"(rule r (src {split} (nth 1 {split})) (dst ?w1 ?w2) "
                          "(safety exact))")[0]
    assert any(law.src == inverse.src and law.dst == inverse.dst for law in laws)
    assert prove_real(merge, [instance_of(merge, en.DEFAULT_POOL)], 5.0).status is \
        ProofStatus.PROVEN


@pytest.mark.parametrize("spec", en.ALL_OPS, ids=lambda s: s.name)
def test_fingerprint_values_are_what_kiln_computes(spec: en.OpSpec) -> None:
    """The numpy evaluator against kiln's ATen lowering, on every operand choice of the pool
    the op applies to (first draw)."""
    values = draw_inputs(en.DEFAULT_POOL, seed=3)
    enumerator = en.Enumerator(en.DEFAULT_POOL, [spec], values, evaluate,
                               lambda shape, v: repr((shape, v.tobytes())).encode())
    checked = 0
    for candidate in enumerator.graphs(1):
        (out, *_) = candidate.outputs
        operands = [_first_draw(a) for a in out.operands]
        expected = en.run_op(spec, out.attrs, operands)[out.output]
        got = out.values[0]
        if spec.op is Op.AVG_POOL2D:
            got = got / 9  # fingerprinted as a sum pool
        assert np.allclose(got, expected.numpy()), out.key
        checked += 1
    assert checked


def _first_draw(t: en.Tensor) -> object:
    value = t.values[0]
    return float(value) if t.var is not None and t.var.role is en.Role.NUMBER else \
        torch.from_numpy(np.ascontiguousarray(value))


def test_write_rules_round_trips(small: GenerationResult, tmp_path: Path) -> None:
    path = tmp_path / "rules.txt"
    write_rules(small, path)
    text = path.read_text()
    assert text.startswith("; Generated by kiln.synth.generate: max_ops=2, seed=0")
    assert load_rules(path) == small.laws


def test_the_committed_file_parses_and_lists_proven_rules() -> None:
    laws = parse_rules(GENERATED.read_text(), str(GENERATED))
    assert len(laws) >= 500
    assert all(dict(law.provenance)["proof"].startswith("proven") for law in laws)
    assert len({law.name for law in laws}) == len(laws)


def test_the_committed_file_type_checks() -> None:
    """load_rules' type check on every 12th rule (all of them: about 90 s)."""
    parsed = parse_rules_at(GENERATED.read_text(), str(GENERATED))
    for item in parsed[::12]:
        check_types(item, str(GENERATED))
