"""Proofs of laws with z3: a law is *proven* when src ≠ dst is unsatisfiable, *refuted* with
a counterexample when it is satisfiable, and *unknown* when z3 gives up within the limit.

    prove_real(law, instances)   does the law hold for real numbers?
    prove_by_axioms(law, ...)    TASO's method alone
    prove_exact(law)             is it bit-identical in float32?
    check_axioms()               does each axiom of kiln.synth.axioms hold concretely?

prove_real tries, in turn (the cheap and the strong first):

1. **axioms for every shape** (TASO's method): tensors are an uninterpreted sort, ops
   uninterpreted functions, constrained by the ∀-axioms of `kiln.synth.axioms`; the law's
   variables are free constants; z3 searches by E-matching within a fixed count of resource
   units (EVERY_SHAPE_RLIMIT: deterministic, unlike a time). Unsat: the law holds for
   *every* shape (and every value of an attribute the law leaves as a ?variable), detail
   "holds for every shape". The axioms themselves are checked on small shapes by
   check_axioms; laws are type-checked by kiln.synth.instance.
2. **integer points**: every element and number fixed to a small integer, a few times; z3
   then only evaluates, exactly, and a difference refutes the law ("at an integer point").
   This finds what the symbolic search stalls on: relu(s*y) = s*relu(y) is false for s < 0.
3. **reals on shapes**: each tensor variable becomes an array of z3 Reals of the instance's
   shape, both sides are computed element by element (`kiln.synth.concrete`), and some
   element is asserted to differ. Unsat on every instance proves the law *for those shapes*
   (and those attribute values); a law that uses only elementwise ops is checked on
   one-element tensors without an instance, which proves it for every shape. Sat gives a
   counterexample; where the law uses an opaque function (exp, tanh, ...) the difference may
   come from treating it as arbitrary, and the result is unknown instead. Where z3 does not
   decide in half its time (products of many variables under relu), the sides are tried
   again with each product of variables as a free variable (`kiln.synth.linearize`): unsat
   there proves the law too.
4. **axioms on shapes**, only where the reals did not decide: the shapes of the law's
   subterms on the first instance are asserted too (guarded axioms and splits need them),
   and unsat means the law holds for those shapes ("holds for the shapes ...").

Real semantics establishes equality up to rounding: ``(x+y)+z -> x+(y+z)`` is proven. Number
operands are symbolic Reals, constrained by the conditions (finite-nonzero, pow2 and
normal-reciprocal: c ≠ 0; pow2-ge-1: c ≥ 1); the type conditions (float, int, weight,
same-type, channel-bias, guard) are reflected in the instances and not asserted. The proof
holds where both sides are defined (no division by 0, rsqrt of a positive number). Integer
tensors are treated as reals too: that proves integer laws whose ops are ring operations
(add, sub, mul, neg: they wrap modulo 2**n alike on both sides), e.g. x*0 -> 0; it says
nothing about overflow in division or comparisons, and floor division is unsupported.

prove_exact decides bit-identity with z3's float32 theory (`kiln.synth.fp`, which explains
how numbers are rounded): NaN equals NaN, +0.0 differs from -0.0. Integer tensors are
bitvectors of their dtype's width (wrapping, as ATen's integer ops). Laws over elementwise
ops are checked on one-element tensors (which covers every shape); other laws need
instances, and contractions on floats are unsupported (the library picks the summation
order).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import z3

from kiln.ir.ops import OpGroup
from kiln.ir.types import DType, TensorType
from kiln.rewrite.law import CondKind, Law, PVar
from kiln.synth import fp
from kiln.synth.axioms import (
    AXIOMS,
    Axiom,
    Example,
    concrete_examples,
)
from kiln.synth.concrete import (
    Domain,
    RealDomain,
    Tensor,
    Unsupported,
    evaluate,
)
from kiln.synth.instance import Instance, roles
from kiln.synth.linearize import Linearizer
from kiln.synth.proof import (
    NumberMaker,
    Proof,
    ProofStatus,
    describe_shapes,
    real_env,
    real_numbers,
)
from kiln.synth.prove_axioms import AXIOM_RLIMIT, EVERY_SHAPE_RLIMIT, by_axioms

# --- public API ------------------------------------------------------------------------------

def prove_real(law: Law, instances: Sequence[Instance] = (), time_limit_s: float = 10.0
               ) -> Proof:
    """Does ``law`` hold over the reals? The axioms for every shape first, then a few
    integer points and the reals on the instances' shapes, then the axioms on an instance's
    shapes where the reals did not decide (module doc)."""
    start = time.monotonic()
    # the resource count decides (~0.1-0.3 s); the time is a backstop for a loaded machine
    axioms = by_axioms(law, instances[0] if instances else None, False, EVERY_SHAPE_RLIMIT,
                        time_limit_s)
    if axioms.status is ProofStatus.PROVEN:
        return _timed(axioms, start)
    cases = _one_element_instance(law, instances) or list(instances)
    if not cases:
        return _timed(Proof(ProofStatus.UNKNOWN, "axioms", f"axioms: {axioms.detail}; no "
                            "instances for the reals on shapes"), start)
    method = _shapes_method(law, cases, instances)
    for instance in cases:
        point = _refute_at_points(law, instance)
        if point is not None:
            return _timed(Proof(ProofStatus.REFUTED, method,
                                f"at an integer point: {point.detail}"), start)
    proof = Proof(ProofStatus.PROVEN, "")
    for instance in cases:
        # at least a quarter of the limit, however long the axiom search took on a busy
        # machine (its resource count, not the clock, decides it)
        left = max(time_limit_s / 2 - (time.monotonic() - start), time_limit_s / 4)
        proof = _prove_on_instance(law, instance, RealDomain(), real_numbers, left)
        if proof.status is not ProofStatus.PROVEN:
            break
    if proof.status is ProofStatus.PROVEN:
        detail = "; ".join(filter(None, [proof.detail, f"axioms: {axioms.detail}"]))
        return _timed(Proof(ProofStatus.PROVEN, method, detail), start)
    if proof.status is not ProofStatus.REFUTED and instances:
        left = time_limit_s - (time.monotonic() - start)
        shapes = by_axioms(law, instances[0], True, AXIOM_RLIMIT, left)
        if shapes.status is ProofStatus.PROVEN:
            return _timed(shapes, start)
    detail = proof.detail + (f" (axioms: {axioms.detail})" if proof.status is
                             ProofStatus.UNKNOWN else "")
    return _timed(Proof(proof.status, method, detail), start)


def prove_by_axioms(law: Law, instances: Sequence[Instance] = (), time_limit_s: float = 10.0
                    ) -> Proof:
    """TASO's method alone: unsat under the axioms is PROVEN for every shape; else, with the
    first instance's shapes asserted, PROVEN for those shapes; else UNKNOWN."""
    instance = instances[0] if instances else None
    every = by_axioms(law, instance, False, AXIOM_RLIMIT, time_limit_s / 2)
    if every.status is not ProofStatus.UNKNOWN or instance is None:
        return every
    return by_axioms(law, instance, True, AXIOM_RLIMIT, time_limit_s / 2)


def prove_exact(law: Law, time_limit_s: float = 10.0, instances: Sequence[Instance] = ()
                ) -> Proof:
    """Is ``law`` bit-identical? Float tensors in float32 (RNE; NaN = NaN, +0.0 ≠ -0.0),
    integer tensors as bitvectors of their width (64 without an instance); kiln.synth.fp.

    Elementwise laws are checked on one-element tensors (which covers every shape); others
    on the first of ``instances``' shapes, or UNSUPPORTED without one."""
    start = time.monotonic()
    cases = _one_element_instance(law, instances) or list(instances)[:1]
    if not cases:
        return Proof(ProofStatus.UNSUPPORTED, "exact", "not elementwise "
                     f"({_non_elementwise(law)}): give an instance for the shapes")
    try:
        domain, numbers = _exact_domain(law, cases[0])
    except Unsupported as err:
        return Proof(ProofStatus.UNSUPPORTED, "exact", str(err))
    where = "scalars" if _elementwise(law) else "on shapes " + describe_shapes(cases[0])
    proof = _prove_on_instance(law, cases[0], domain, numbers, time_limit_s)
    return _timed(Proof(proof.status, f"{domain.name} {where}", proof.detail), start)


def _exact_domain(law: Law, instance: Instance) -> tuple[Domain, NumberMaker]:
    """float32 for float tensors, bitvectors for integer ones (a law mixing both, or one on
    bool tensors, is unsupported)."""
    declared = {c.args[0].name for c in law.when
                if c.kind is CondKind.INT and isinstance(c.args[0], PVar)}
    types = instance.tensors
    ints = {n for n, t in types.items() if n in declared or not t.dtype.is_floating}
    if not ints:
        return fp.FloatDomain(), _float_numbers
    if ints != set(types):
        raise Unsupported(f"integer tensors ({', '.join(sorted(ints))}) with float ones")
    dtypes = {types[n].dtype for n in ints if not types[n].dtype.is_floating}
    if DType.BOOL in dtypes:
        raise Unsupported("bool tensors")
    bits = max((d.itemsize * 8 for d in dtypes), default=64)

    def numbers(law: Law, name: str) -> tuple[Any, list[z3.BoolRef]]:
        kinds = {c.kind for c in law.when if c.args and c.args[0] == PVar(name)}
        return fp.int_number_variable(name, kinds, bits)

    return fp.IntDomain(bits), numbers


def check_axioms(time_limit_s: float = 10.0, axioms: Sequence[Axiom] = AXIOMS
                 ) -> list[tuple[str, Proof]]:
    """Each axiom checked on its example shapes with Reals for the elements (TASO's
    validate_axioms.py): PROVEN when it holds on every example, REFUTED with the example and
    element where it does not. ``time_limit_s`` is per axiom."""
    results = []
    for axiom in axioms:
        start = time.monotonic()
        proof = Proof(ProofStatus.PROVEN, "")
        examples = concrete_examples(axiom)
        for example in examples:
            proof = _check_example(example, time_limit_s - (time.monotonic() - start))
            if proof.status is not ProofStatus.PROVEN:
                proof = Proof(proof.status, "", f"on {example.describe}: {proof.detail}")
                break
        method = f"reals on {len(examples)} examples"
        results.append((axiom.name, _timed(Proof(proof.status, method, proof.detail), start)))
    return results


def _check_example(example: Example, time_limit_s: float) -> Proof:
    if any(z3.is_false(z3.simplify(a)) for a in example.assumptions):
        return Proof(ProofStatus.UNKNOWN, "", "the example does not meet the axiom's guard")
    domain = example.domain
    return _compare([example.lhs], [example.rhs], example.assumptions, domain, time_limit_s,
                    lambda m: _show_variables(domain, m, example.values))


# --- the reals on shapes ---------------------------------------------------------------

def _float_numbers(law: Law, name: str) -> tuple[Any, list[z3.BoolRef]]:
    kinds = {c.kind for c in law.when if c.args and c.args[0] == PVar(name)}
    return fp.number_variable(name, kinds)


def _prove_on_instance(law: Law, instance: Instance, domain: Domain,
                       make_number: NumberMaker, time_limit_s: float) -> Proof:
    env = real_env(law, instance, domain, make_number)
    env.dtypes = {n: t.dtype for n, t in instance.tensors.items()}
    try:
        src = [evaluate(t, env) for t in law.src]
        dst = [evaluate(t, env) for t in law.dst]
    except Unsupported as err:
        return Proof(ProofStatus.UNSUPPORTED, "", str(err))
    except (ValueError, IndexError) as err:  # numpy: the shapes do not fit the ops
        return Proof(ProofStatus.UNKNOWN, "", f"the sides do not evaluate on "
                     f"{describe_shapes(instance)}: {err}")
    names = dict(env.tensors, **env.numbers)
    if not isinstance(domain, RealDomain):
        return _compare(src, dst, domain.assumptions, domain, time_limit_s,
                        lambda m: _show_variables(domain, m, names))
    direct = _compare(src, dst, domain.assumptions, domain, time_limit_s / 2,
                      lambda m: _show_variables(domain, m, names))
    if direct.status is not ProofStatus.UNKNOWN:
        return direct
    return _linear_compare(src, dst, domain.assumptions, time_limit_s / 2) or direct


def _linear_compare(src: list[Any], dst: list[Any], assumptions: list[z3.BoolRef],
                    time_limit_s: float) -> Proof | None:
    """PROVEN where the sides cannot differ with their products of variables as free
    variables (kiln.synth.linearize), else None."""
    pairs = [(a[idx], b[idx]) for a, b in zip(src, dst) if not isinstance(a, int)
             for idx in np.ndindex(a.shape)]
    rewrite = Linearizer()
    solver = z3.Solver()
    solver.set("timeout", max(1, int(time_limit_s * 1000)))
    solver.add([rewrite(a) for a in assumptions])
    solver.add(z3.Or([rewrite(a) != rewrite(b) for a, b in pairs]))
    solver.add(rewrite.facts)
    if solver.check() == z3.unsat:
        return Proof(ProofStatus.PROVEN, "", f"with its {len(rewrite.monomials)} products "
                     "of variables as free variables")
    return None


POINTS = 3  # integer points tried before the reals on shapes
POINT_RANGE = 3  # their elements and numbers are integers in [-3, 3]


def _refute_at_points(law: Law, instance: Instance, seed: int = 0) -> Proof | None:
    """A counterexample at a few integer points, or None. Each point fixes every element
    and number, so z3 only evaluates (exactly: rationals) where the symbolic search may
    stall on nonlinear terms, e.g. relu(s*y) = s*relu(y), false for s < 0, on the outputs
    of a convolution. Not tried where an opaque function (exp, tanh, ...) is involved."""
    domain = RealDomain()
    env = real_env(law, instance, domain)
    try:
        src = [evaluate(t, env) for t in law.src]
        dst = [evaluate(t, env) for t in law.dst]
    except (Unsupported, ValueError, IndexError):
        return None
    if domain.opaque:
        return None
    variables = [e for t in env.tensors.values() for e in np.asarray(t).flat]
    variables += [np.asarray(t).item() for t in env.numbers.values()]
    variables = [v for v in variables if z3.is_const(v) and
                 v.decl().kind() == z3.Z3_OP_UNINTERPRETED]
    rng = np.random.default_rng(seed)
    names = dict(env.tensors, **env.numbers)
    for _ in range(POINTS):
        values = rng.integers(-POINT_RANGE, POINT_RANGE + 1, len(variables))
        point = [v == int(n) for v, n in zip(variables, values)]
        proof = _compare(src, dst, domain.assumptions + point, domain, 1.0,
                         lambda m: _show_variables(domain, m, names))
        if proof.status is ProofStatus.REFUTED:
            return proof
    return None


def _compare(src: list[Any], dst: list[Any], assumptions: list[z3.BoolRef], domain: Domain,
             time_limit_s: float, show: Callable[[z3.ModelRef], str]) -> Proof:
    """PROVEN when no element of src differs from dst under the assumptions."""
    pairs = []
    for i, (a, b) in enumerate(zip(src, dst)):
        if isinstance(a, int) or isinstance(b, int):  # sizes, in the size axioms
            if a != b:
                return Proof(ProofStatus.REFUTED, "", f"output {i}: {a} != {b}")
            continue
        if a.shape != b.shape:
            return Proof(ProofStatus.REFUTED, "", f"output {i}: shape {a.shape} != {b.shape}")
        pairs += [((i, idx), a[idx], b[idx]) for idx in np.ndindex(a.shape)]
    differs = [z3.Not(domain.same(a, b)) for _, a, b in pairs]
    if not differs:
        return Proof(ProofStatus.PROVEN, "")
    solver = domain.solver(time_limit_s)
    solver.add(assumptions)
    solver.add(z3.Or(differs))
    result = solver.check()
    if result == z3.unsat:
        return Proof(ProofStatus.PROVEN, "")
    if result != z3.sat:
        return Proof(ProofStatus.UNKNOWN, "", f"z3: {solver.reason_unknown()}")
    model = solver.model()
    where = next((at, a, b) for at, a, b in pairs
                 if z3.is_true(model.eval(z3.Not(domain.same(a, b)), model_completion=True)))
    (out, index), a, b = where
    at = f"output {out}" + (f" {index}" if index else "")
    text = f"{show(model)}; at {at}: src {domain.show(model, a)}, dst {domain.show(model, b)}"
    if domain.opaque:
        return Proof(ProofStatus.UNKNOWN, "", f"a difference if {', '.join(sorted(domain.opaque))}"
                     f" may be any function (not decided for the real one): {text}")
    return Proof(ProofStatus.REFUTED, "", text)


def _show_variables(domain: Domain, model: z3.ModelRef, values: dict[str, Tensor]) -> str:
    parts = []
    for name, tensor in values.items():
        shown = np.frompyfunc(lambda e: domain.show(model, e), 1, 1)(tensor)
        text = shown if isinstance(shown, str) else str(np.asarray(shown).tolist())
        parts.append(f"{name} = {text.replace(chr(39), '')}")
    return ", ".join(parts)


# --- helpers ---------------------------------------------------------------------------------

def _elementwise(law: Law) -> bool:
    return all(op.is_a(OpGroup.ELEMENTWISE) for op in law.ops())


def _non_elementwise(law: Law) -> str:
    return ", ".join(sorted(op.text for op in law.ops() if not op.is_a(OpGroup.ELEMENTWISE)))


def _one_element_instance(law: Law, instances: Sequence[Instance]) -> list[Instance]:
    """For an elementwise law, one instance with 0-d tensors (each output element is the law
    on the elements it reads, broadcast or not, so it holds for every shape if it holds for
    one element, and a one-element counterexample fills any shape); otherwise none."""
    if not _elementwise(law):
        return []
    role = roles(law)
    attrs = dict(instances[0].attrs) if instances else {}
    declared = {c.args[0].name for c in law.when if c.kind is CondKind.INT
                and isinstance(c.args[0], PVar)}
    default = {n: DType.I64 if n in declared else DType.F32 for n in role.tensors}
    dtypes = {n: instances[0].tensors[n].dtype if instances and n in instances[0].tensors
              else default[n] for n in role.tensors}
    return [Instance({n: TensorType((), dtypes[n]) for n in role.tensors}, {}, attrs)]


def _shapes_method(law: Law, cases: Sequence[Instance], given: Sequence[Instance]) -> str:
    if _elementwise(law):
        return "reals on one element (elementwise: that covers every shape)"
    return "reals on shapes " + "; ".join(describe_shapes(c) for c in cases)


def _timed(proof: Proof, start: float) -> Proof:
    return Proof(proof.status, proof.method, proof.detail, time.monotonic() - start)


__all__ = ["Proof", "ProofStatus", "check_axioms", "prove_by_axioms", "prove_exact",
           "prove_real"]
