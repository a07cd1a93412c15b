"""TASO's method as a prover: a law's terms in the axioms' vocabulary (kiln.synth.axioms), and
z3's E-matching search for src != dst under the axioms, for every shape or with an
instance's shapes asserted. `kiln.synth.prove.prove_real` calls it first and last."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import z3

from kiln.ir.ops import Op, OpGroup
from kiln.rewrite.law import App, AttrFn, AttrFnKind, Law, Lit, PVar, Term
from kiln.synth.axioms import TENSOR, prepared_axioms
from kiln.synth.concrete import RealDomain, Unsupported, evaluate
from kiln.synth.instance import Instance, roles
from kiln.synth.proof import Proof, ProofStatus, describe_shapes, real_conditions, real_env


def by_axioms(law: Law, instance: Instance | None, with_shapes: bool, rlimit: int,
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
                 f"holds for the shapes {describe_shapes(instance)}")


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
        self.conditions = real_conditions(law, {n: z3.Real(n) for n in self.numbers})
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
        env = real_env(self.law, self.instance, RealDomain())
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


__all__ = ["AXIOM_RLIMIT", "EVERY_SHAPE_RLIMIT", "by_axioms"]
