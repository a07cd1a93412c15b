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

import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import z3

from kiln.ir.ops import Op, OpGroup
from kiln.ir.types import DType, TensorType
from kiln.rewrite.law import App, AttrFn, AttrFnKind, CondKind, Law, Lit, PVar, Term
from kiln.synth import fp
from kiln.synth.axioms import (
    AXIOMS,
    TENSOR,
    Axiom,
    Example,
    concrete_examples,
    prepared_axioms,
)
from kiln.synth.concrete import (
    Domain,
    Env,
    RealDomain,
    Tensor,
    Unsupported,
    evaluate,
    scalar,
    symbolic_tensor,
)
from kiln.synth.instance import Instance, roles
from kiln.synth.linearize import Linearizer


class ProofStatus(enum.Enum):
    PROVEN = "proven"
    REFUTED = "refuted"
    UNKNOWN = "unknown"  # z3 gave up within the time limit, or no method applied
    UNSUPPORTED = "unsupported"  # an op or condition outside the model (detail says which)


@dataclass(frozen=True)
class Proof:
    status: ProofStatus
    method: str  # "axioms", "reals on shapes x:(2, 3) w:(3, 2)", "float32 scalars", ...
    detail: str = ""  # why unknown/unsupported; for REFUTED, the counterexample
    seconds: float = 0.0


# --- public API ------------------------------------------------------------------------------

def prove_real(law: Law, instances: Sequence[Instance] = (), time_limit_s: float = 10.0
               ) -> Proof:
    """Does ``law`` hold over the reals? The axioms for every shape first, then a few
    integer points and the reals on the instances' shapes, then the axioms on an instance's
    shapes where the reals did not decide (module doc)."""
    start = time.monotonic()
    # the resource count decides (~0.1-0.3 s); the time is a backstop for a loaded machine
    axioms = _by_axioms(law, instances[0] if instances else None, False, EVERY_SHAPE_RLIMIT,
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
        left = time_limit_s / 2 - (time.monotonic() - start)
        proof = _prove_on_instance(law, instance, RealDomain(), _real_numbers, left)
        if proof.status is not ProofStatus.PROVEN:
            break
    if proof.status is ProofStatus.PROVEN:
        detail = "; ".join(filter(None, [proof.detail, f"axioms: {axioms.detail}"]))
        return _timed(Proof(ProofStatus.PROVEN, method, detail), start)
    if proof.status is not ProofStatus.REFUTED and instances:
        left = time_limit_s - (time.monotonic() - start)
        shapes = _by_axioms(law, instances[0], True, AXIOM_RLIMIT, left)
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
    every = _by_axioms(law, instance, False, AXIOM_RLIMIT, time_limit_s / 2)
    if every.status is not ProofStatus.UNKNOWN or instance is None:
        return every
    return _by_axioms(law, instance, True, AXIOM_RLIMIT, time_limit_s / 2)


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
    where = "scalars" if _elementwise(law) else "on shapes " + _describe_shapes(cases[0])
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


# --- method 1: axioms ------------------------------------------------------------------------

def _by_axioms(law: Law, instance: Instance | None, with_shapes: bool, rlimit: int,
               time_limit_s: float) -> Proof:
    """Unsat under the axioms: the law holds for every shape. ``with_shapes``: the
    instance's shapes asserted too (shape_of, rank and size of the law's subterms, which
    guarded axioms and splits need): it holds for those shapes."""
    encoder = _AxiomEncoder(law, instance)
    try:
        src = [encoder.term(t) for t in law.src]
        dst = [encoder.term(t) for t in law.dst]
    except Unsupported as err:
        return Proof(ProofStatus.UNSUPPORTED, "axioms", str(err))
    goal = z3.Not(z3.And([a == b for a, b in zip(src, dst)]))
    assertions = encoder.axioms + encoder.alg.ground_facts() + encoder.conditions + \
        encoder.structural
    facts = encoder.shape_facts() if with_shapes else []
    if with_shapes and not facts:
        return Proof(ProofStatus.UNKNOWN, "axioms", "no shapes to assert")
    result, reason = _axiom_check(assertions + facts + [goal], rlimit, time_limit_s)
    if result != z3.unsat:
        return Proof(ProofStatus.UNKNOWN, "axioms", f"not decided by the axioms ({reason})")
    if not with_shapes:
        return Proof(ProofStatus.PROVEN, "axioms", "holds for every shape")
    return Proof(ProofStatus.PROVEN, "axioms",
                 f"holds for the shapes {_describe_shapes(instance)}")


# z3's resource units for one axiom search: a count, not a time, so that a proof does not
# come and go with the machine's load (a wall-clock limit stays as a backstop). Every law
# the axioms prove for every shape (kiln's hand laws, the generated ones) takes under
# 200,000 (about 0.1 s here, where a failing search spends all of it); the search with
# an instance's shapes asserted runs only where the reals did not decide, and gets more.
EVERY_SHAPE_RLIMIT = 200_000
AXIOM_RLIMIT = 1_000_000


def _axiom_check(assertions: list[z3.BoolRef], rlimit: int, time_limit_s: float
                 ) -> tuple[Any, str]:
    # a fresh context: E-matching's order follows the terms' ids, which in the process's
    # context depend on every term made before (other laws'); a copy numbers them afresh.
    # (A law whose search ends near the limit can still come out either way from one
    # process to the next: z3's order is not fully reproducible.)
    context = z3.Context()
    solver = z3.Solver(ctx=context)
    solver.set("rlimit", rlimit)
    solver.set("timeout", max(1, int(time_limit_s * 1000)))
    # E-matching on the axioms' patterns only; the instance limit also keeps z3 out of a
    # loop that its timeout does not interrupt (seen with relu(x+y) = relu(x)+relu(y))
    solver.set("smt.mbqi", False)
    solver.set("smt.qi.max_instances", 20000)
    solver.add([a.translate(context) for a in assertions])
    result = solver.check()
    if result == z3.sat:
        return result, "not implied"
    reason = solver.reason_unknown()
    # z3 names the same exhausted count "canceled", "push canceled" or "max. resource limit
    # exceeded" depending on where it stopped: one wording keeps rule files reproducible
    return result, "its limit reached" if "cancel" in reason or "limit" in reason or \
        reason == "timeout" else reason


class _AxiomEncoder:
    """A law's terms as terms of the axioms' vocabulary (kiln.synth.axioms)."""

    def __init__(self, law: Law, instance: Instance | None) -> None:
        self.alg, self.axioms = prepared_axioms()
        self.instance = instance
        role = roles(law)
        self.numbers = set(role.numbers) | set(instance.numbers if instance else ())
        self.attr_vars = set(role.attrs)  # an attribute used as an operand is a number
        self.conditions = _real_conditions(law, {n: z3.Real(n) for n in self.numbers})
        self.encoded: list[tuple[Term, Any]] = []
        self.structural: list[z3.BoolRef] = []  # true for every shape: ATen's own rules
        self.law = law

    def term(self, term: Term) -> Any:
        if isinstance(term, PVar) and term.name not in self.numbers | self.attr_vars:
            out = z3.Const(term.name, TENSOR)
        elif isinstance(term, (PVar, Lit, AttrFn)):
            return self.alg.num(self.number(term))
        else:
            out = self.app(term)
        self.encoded.append((term, out))
        return out

    def number(self, term: Any) -> Any:
        if isinstance(term, Lit):
            return z3.RealVal(int(term.value) if isinstance(term.value, bool) else term.value)
        if isinstance(term, PVar):
            return z3.Real(term.name)
        if isinstance(term, AttrFn) and term.kind is AttrFnKind.INVERSE:
            return 1 / self.number(term.args[0])
        if isinstance(term, AttrFn) and term.kind is AttrFnKind.PLUS_ONE:
            return self.number(term.args[0]) + 1
        if isinstance(term, (int, float)):
            return z3.RealVal(term)
        raise Unsupported(f"{term} is not a number")

    def attr(self, value: Any) -> Any:
        """An attribute as an Int: a ?variable is a symbol, a value is interned."""
        if isinstance(value, PVar):
            return z3.Int(f"attr_{value.name}")
        if isinstance(value, AttrFn) and value.kind is AttrFnKind.COMPOSE:
            return self.alg.compose(*[self.attr(a) for a in value.args])
        if isinstance(value, AttrFn) and value.kind is AttrFnKind.SHAPE_OF:
            return self.alg.shape_of(self.term(value.args[0]))
        if isinstance(value, tuple) and any(isinstance(v, (PVar, AttrFn)) for v in value):
            raise Unsupported("a tuple attribute with ?variables inside")
        return self.alg.value(value)

    def app(self, t: App) -> Any:
        a = self.alg
        args = [self.term(x) for x in t.args]
        attrs = dict(t.attrs)
        if t.op in _SIMPLE:
            return _SIMPLE[t.op](a, *args)
        if t.op is Op.DIV and attrs.get("rounding_mode") is None:
            return a.mul(args[0], a.recip(args[1]))
        if t.op is Op.PERMUTE:
            dims = _need(t, "dims")
            p = a.perm(dims) if isinstance(dims, tuple) else self.attr(dims)
            return a.permute(p, args[0])
        if t.op is Op.VIEW:
            return a.view(self.attr(_need(t, "shape")), args[0])
        if t.op is Op.CAT:
            return self.cat(self.int_attr(_need(t, "dim")), args)
        if t.op is Op.SPLIT:
            return self.split(t, args[0])
        if t.op in (Op.ADDMM, Op.ADDMM_ACT):
            return self.addmm(t, args)
        if t.op in (Op.CONVOLUTION, Op.CONV_ACT):
            return self.conv(t, args)
        if t.op is Op.BATCH_NORM:
            return self.batch_norm(t, args)
        if t.op.is_a(OpGroup.ELEMENTWISE | OpGroup.UNARY) and len(args) == 1 and \
                all(not isinstance(v, (PVar, AttrFn)) for v in attrs.values()):
            return a.unary(t.op.text + "".join(f"_{v}" for v in attrs.values()), args[0])
        raise Unsupported(f"{t.op.text} is outside the axioms' vocabulary")

    def int_attr(self, value: Any) -> Any:
        if isinstance(value, PVar):
            return z3.Int(f"attr_{value.name}")
        if isinstance(value, AttrFn) and value.kind is AttrFnKind.SIZE:
            tensor, dim = value.args
            return self.alg.size(self.term(tensor), self.int_attr(dim))
        if isinstance(value, int):
            return z3.IntVal(value)
        raise Unsupported(f"{value!r} as an integer attribute")

    def scaled(self, x: Any, factor: Any) -> Any:
        return x if isinstance(factor, (int, float)) and factor == 1 else \
            self.alg.mul(x, self.alg.num(self.number(factor)))

    def addmm(self, t: App, args: list[Any]) -> Any:
        bias, x, w = args
        y = self.alg.add(self.scaled(bias, t.attr("beta", 1)),
                         self.scaled(self.alg.mm(x, w), t.attr("alpha", 1)))
        return self.activation(t, y)

    def activation(self, t: App, y: Any) -> Any:
        act = t.attr("activation")
        if act is None:
            return y
        if isinstance(act, PVar):
            raise Unsupported("an activation given as a ?variable")
        if act is Op.RELU:
            return self.alg.relu(y)
        args = t.attr("act_args", ())
        return self.alg.unary(act.text + "".join(f"_{v}" for v in args), y)

    def conv(self, t: App, args: list[Any]) -> Any:
        a = self.alg
        if t.attr("transposed", False) is not False:
            raise Unsupported("a transposed (or possibly transposed) convolution")
        keys = ("stride", "padding", "dilation", "groups")
        if any(t.attr(k) is None for k in keys):
            raise Unsupported(f"{t.op.text} without {', '.join(keys)}")
        attrs = a.conv_attrs(*[self.attr(t.attr(k)) for k in keys[:3]],
                             self.int_attr(t.attr("groups")))
        y = a.conv(attrs, args[0], args[1])
        rest = args[2:]
        has_bias = t.attr("has_bias", len(rest) > 0) if t.op is Op.CONV_ACT else bool(rest)
        if has_bias:
            y = a.add(y, self.chan(rest[0]))
        if t.op is Op.CONV_ACT and t.attr("has_residual"):
            y = a.add(y, rest[-1])
        return self.activation(t, y) if t.op is Op.CONV_ACT else y

    def batch_norm(self, t: App, args: list[Any]) -> Any:
        a = self.alg
        x, gamma, beta, mean, var = args
        eps = a.num(self.number(t.attr("eps")))
        scale = a.unary("rsqrt", a.add(var, eps))
        centred = a.add(x, a.mul(self.chan(mean), a.num(z3.RealVal(-1))))
        return a.add(a.mul(a.mul(centred, self.chan(scale)), self.chan(gamma)),
                     self.chan(beta))

    def chan(self, vector: Any) -> Any:
        """A per-channel operand (a conv bias, a batch norm's parameters): 1-d in ATen."""
        self.structural.append(self.alg.rank(vector) == 1)
        return self.alg.chan(vector)

    def cat(self, dim: Any, args: list[Any]) -> Any:
        out = args[-1]
        for x in reversed(args[:-1]):
            out = self.alg.cat(dim, x, out)
        return out

    def split(self, t: App, x: Any) -> Any:
        sizes = _need(t, "sizes")
        if isinstance(sizes, PVar) and self.instance is not None:
            sizes = self.instance.attrs.get(sizes.name, sizes)
        if not isinstance(sizes, tuple):
            raise Unsupported("split sizes as a ?variable without an instance")
        dim = self.int_attr(_need(t, "dim"))
        rest = x
        for size in sizes[:t.output]:
            rest = self.alg.tail(dim, self.int_attr(size), rest)
        if t.output == len(sizes) - 1:
            return rest
        return self.alg.head(dim, self.int_attr(sizes[t.output]), rest)

    def shape_facts(self) -> list[z3.BoolRef]:
        """shape_of, rank and size of every encoded subterm on the instance (none without
        one, or where the instance does not fit the law)."""
        if self.instance is None:
            return []
        env = _real_env(self.law, self.instance, RealDomain())
        facts = []
        try:
            for term, encoded in self.encoded:
                shape = evaluate(term, env).shape
                facts += [self.alg.shape_of(encoded) == self.alg.value(tuple(shape)),
                          self.alg.rank(encoded) == len(shape)]
                facts += [self.alg.size(encoded, d) == n for d, n in enumerate(shape)]
        except (Unsupported, ValueError, IndexError):
            return []
        return facts


def _need(t: App, key: str) -> Any:
    if t.attr(key) is None:
        raise Unsupported(f"{t.op.text} without :{key}")
    return t.attr(key)


_SIMPLE: dict[Op, Callable[..., Any]] = {
    Op.ADD: lambda a, x, y: a.add(x, y),
    Op.MUL: lambda a, x, y: a.mul(x, y),
    Op.SUB: lambda a, x, y: a.add(x, a.mul(y, a.num(z3.RealVal(-1)))),
    Op.NEG: lambda a, x: a.mul(x, a.num(z3.RealVal(-1))),
    Op.MM: lambda a, x, y: a.mm(x, y),
    Op.RELU: lambda a, x: a.relu(x),
    Op.CLONE: lambda a, x: x,
    Op.TO_LAYOUT: lambda a, x: x,
}


# --- method 2: concrete shapes ---------------------------------------------------------------

NumberMaker = Callable[[Law, str], tuple[Any, list[z3.BoolRef]]]


def _real_numbers(law: Law, name: str) -> tuple[Any, list[z3.BoolRef]]:
    value = z3.Real(name)
    return value, _real_conditions(law, {name: value})


def _float_numbers(law: Law, name: str) -> tuple[Any, list[z3.BoolRef]]:
    kinds = {c.kind for c in law.when if c.args and c.args[0] == PVar(name)}
    return fp.number_variable(name, kinds)


def _real_conditions(law: Law, numbers: dict[str, Any]) -> list[z3.BoolRef]:
    out = []
    for cond in law.when:
        arg = cond.args[0] if cond.args else None
        if not isinstance(arg, PVar) or arg.name not in numbers:
            continue
        value = numbers[arg.name]
        if cond.kind in (CondKind.FINITE_NONZERO, CondKind.POW2, CondKind.NORMAL_RECIPROCAL):
            out.append(value != 0)
        elif cond.kind is CondKind.POW2_AT_LEAST_ONE:
            out.append(value >= 1)
    return out


def _real_env(law: Law, instance: Instance, domain: Domain,
              make_number: NumberMaker = _real_numbers) -> Env:
    numbers: dict[str, Tensor] = {}
    constraints: list[z3.BoolRef] = []
    for name in sorted(set(roles(law).numbers) | set(instance.numbers)):
        value, more = make_number(law, name)
        numbers[name] = scalar(value)
        constraints += more
    tensors = {n: symbolic_tensor(domain, n, t.shape) for n, t in instance.tensors.items()}
    domain.assumptions += constraints
    return Env(domain, tensors, numbers, dict(instance.attrs))


def _prove_on_instance(law: Law, instance: Instance, domain: Domain,
                       make_number: NumberMaker, time_limit_s: float) -> Proof:
    env = _real_env(law, instance, domain, make_number)
    env.dtypes = {n: t.dtype for n, t in instance.tensors.items()}
    try:
        src = [evaluate(t, env) for t in law.src]
        dst = [evaluate(t, env) for t in law.dst]
    except Unsupported as err:
        return Proof(ProofStatus.UNSUPPORTED, "", str(err))
    except (ValueError, IndexError) as err:  # numpy: the shapes do not fit the ops
        return Proof(ProofStatus.UNKNOWN, "", f"the sides do not evaluate on "
                     f"{_describe_shapes(instance)}: {err}")
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
    env = _real_env(law, instance, domain)
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


def _describe_shapes(instance: Instance) -> str:
    parts = [f"{n}:{t.shape}" for n, t in instance.tensors.items()]
    parts += [f"{n}={v!r}" for n, v in instance.attrs.items()]
    return " ".join(parts)


def _shapes_method(law: Law, cases: Sequence[Instance], given: Sequence[Instance]) -> str:
    if _elementwise(law):
        return "reals on one element (elementwise: that covers every shape)"
    return "reals on shapes " + "; ".join(_describe_shapes(c) for c in cases)


def _timed(proof: Proof, start: float) -> Proof:
    return Proof(proof.status, proof.method, proof.detail, time.monotonic() - start)


__all__ = ["Proof", "ProofStatus", "check_axioms", "prove_by_axioms", "prove_exact",
           "prove_real"]
