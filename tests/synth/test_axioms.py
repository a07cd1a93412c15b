"""kiln.synth.axioms, checked against the concrete semantics (as TASO's validate_axioms.py)."""

from __future__ import annotations

import z3

from kiln.synth.axioms import AXIOMS, Axiom, Symbolic, _vars, prepared_axioms, symbolic_axioms
from kiln.synth.prove import ProofStatus, check_axioms


def test_every_axiom_holds_on_its_examples():
    results = check_axioms()
    assert [name for name, _ in results] == [a.name for a in AXIOMS]
    wrong = [(name, p) for name, p in results if p.status is not ProofStatus.PROVEN]
    assert not wrong
    assert all(p.method.startswith("reals on ") for _, p in results)


def test_a_wrong_axiom_is_refuted():
    mm_comm = Axiom("mm-comm", _vars("x y:tensor"), lambda a, x, y: (a.mm(x, y), a.mm(y, x)),
                    lambda: [((2, 2), (2, 2))])
    # TASO's wrong grouped-convolution axiom, in our vocabulary: a weight concatenated along
    # the output channels is not two convolutions when groups = 2
    grouped = Axiom(
        "conv-cat-weight-grouped", _vars("x w v:tensor"),
        lambda a, x, w, v: (
            a.conv(a.conv_attrs((1, 1), (0, 0), (1, 1), 2), x, a.cat(0, w, v)),
            a.cat(1, a.conv(a.conv_attrs((1, 1), (0, 0), (1, 1), 2), x, w),
                  a.conv(a.conv_attrs((1, 1), (0, 0), (1, 1), 2), x, v))),
        lambda: [((1, 2, 2, 2), (2, 1, 1, 1), (2, 1, 1, 1))])
    results = dict(check_axioms(axioms=(AXIOMS[0], mm_comm, grouped)))
    assert results["add-comm"].status is ProofStatus.PROVEN
    assert results["mm-comm"].status is ProofStatus.REFUTED
    assert "on x:(2, 2) y:(2, 2)" in results["mm-comm"].detail
    assert "src " in results["mm-comm"].detail
    assert results["conv-cat-weight-grouped"].status is ProofStatus.REFUTED


def test_axioms_become_quantified_formulas():
    formulas = symbolic_axioms(Symbolic())
    assert len(formulas) == len(AXIOMS)
    assert all(z3.is_quantifier(f) for f in formulas)
    with_patterns = [f for f in formulas if f.num_patterns() > 0]
    assert len(with_patterns) >= len(AXIOMS) - 2


def test_prepared_axioms_are_built_once_and_a_laws_values_intern_after_theirs() -> None:
    alg, formulas = prepared_axioms()
    fresh = Symbolic()
    assert [str(f) for f in formulas] == [str(f) for f in symbolic_axioms(fresh)]
    assert alg.perms == fresh.perms and alg.values == fresh.values
    law_value = alg.perm((3, 1, 0, 2))  # a law's own permutation: a new number
    assert law_value.as_long() not in fresh.perms.values()
    again, same = prepared_axioms()
    assert same is formulas
    assert (3, 1, 0, 2) not in again.perms  # the first law's values are not the next one's
