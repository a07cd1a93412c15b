"""TASO-style axioms: tensors as an uninterpreted sort, ops as uninterpreted functions, and
∀-quantified equations between them that hold for every shape where both sides are defined.

    mm-assoc:     ∀x,y,z. mm(mm(x, y), z) = mm(x, mm(y, z))
    cat-head:     ∀d,x,y. head(d, size(x, d), cat(d, x, y)) = x

Each axiom is written once, as a function of an `Algebra`, and read two ways:

* `Symbolic`: z3 terms over the sort ``Tensor``; `symbolic_axioms` turns every axiom into a
  ``ForAll`` (with its sides as patterns) for `kiln.synth.prove.prove_real`.
* `Concrete`: numpy arrays of z3 Reals on the small shapes listed with the axiom
  (`Axiom.examples`), so that `kiln.synth.prove.check_axioms` can check each axiom
  against the concrete semantics, as TASO's validate_axioms.py does.

The vocabulary: add, mul (broadcasting), num(r) (a number, broadcast), recip (1/x), mm,
relu, permute(p, x) with compose(p, q) and is_identity(p), cat(d, x, y), split as
head(d, n, x) / tail(d, n, x) with size(x, d), conv(attrs, x, w) (no bias; attrs built by
conv_attrs(stride, padding, dilation, groups)), chan(b) (a bias vector viewed as one value
per channel of dimension 1), view(shape, x) with shape_of(x), and any other unary op as
an opaque function.
Sub, neg, div, addmm, batch_norm, conv with bias, addmm_act and conv_act are defined from
these (kiln.synth.prove encodes them so).

Broadcasting: an axiom that would relate a well-typed side to a meaningless one when an
operand broadcasts (permute(p, x + y) = permute(p, x) + permute(p, y) with a vector y) is
guarded by same_shape(x, y) (shape_of equal) or rank(x) = n. prove_real asserts shape_of,
rank and size of a law's subterms only from an instance, so a guarded axiom applies to a
law only on an instance's shapes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import z3

from kiln.ir.ops import Op
from kiln.synth.concrete import RealDomain, Tensor, conv, elementwise, scalar, symbolic_tensor

TENSOR = z3.DeclareSort("Tensor")
INT = z3.IntSort()
REAL = z3.RealSort()


class Symbolic:
    """The vocabulary as uninterpreted z3 functions; attribute values interned as Ints."""

    def __init__(self) -> None:
        self.perms: dict[tuple[int, ...], int] = {}
        self.values: dict[Any, int] = {}

    def fn(self, name: str, *sorts: z3.SortRef) -> z3.FuncDeclRef:
        return z3.Function(name, *sorts)

    def add(self, a: Any, b: Any) -> Any:
        return self.fn("add", TENSOR, TENSOR, TENSOR)(a, b)

    def mul(self, a: Any, b: Any) -> Any:
        return self.fn("mul", TENSOR, TENSOR, TENSOR)(a, b)

    def num(self, r: Any) -> Any:
        return self.fn("num", REAL, TENSOR)(r)

    def recip(self, a: Any) -> Any:
        return self.fn("recip", TENSOR, TENSOR)(a)

    def mm(self, a: Any, b: Any) -> Any:
        return self.fn("mm", TENSOR, TENSOR, TENSOR)(a, b)

    def relu(self, a: Any) -> Any:
        return self.fn("relu", TENSOR, TENSOR)(a)

    def unary(self, name: str, a: Any) -> Any:
        return self.fn(name, TENSOR, TENSOR)(a)

    def permute(self, p: Any, a: Any) -> Any:
        return self.fn("permute", INT, TENSOR, TENSOR)(p, a)

    def perm(self, dims: tuple[int, ...]) -> Any:
        return z3.IntVal(self.perms.setdefault(tuple(dims), 1000 + len(self.perms)))

    def compose(self, p: Any, q: Any) -> Any:
        return self.fn("compose", INT, INT, INT)(p, q)

    def is_identity(self, p: Any) -> Any:
        return self.fn("is_identity", INT, z3.BoolSort())(p)

    def cat(self, d: Any, a: Any, b: Any) -> Any:
        return self.fn("cat", INT, TENSOR, TENSOR, TENSOR)(d, a, b)

    def head(self, d: Any, n: Any, a: Any) -> Any:
        return self.fn("head", INT, INT, TENSOR, TENSOR)(d, n, a)

    def tail(self, d: Any, n: Any, a: Any) -> Any:
        return self.fn("tail", INT, INT, TENSOR, TENSOR)(d, n, a)

    def size(self, a: Any, d: Any) -> Any:
        return self.fn("size", TENSOR, INT, INT)(a, d)

    def value(self, v: Any) -> Any:
        """An attribute value (a tuple, an int, ...) as an Int: equal values, equal Ints."""
        if isinstance(v, z3.ExprRef):
            return v
        return z3.IntVal(self.values.setdefault(repr(v), 5000 + len(self.values)))

    def conv_attrs(self, stride: Any, padding: Any, dilation: Any, groups: Any) -> Any:
        f = self.fn("conv_attrs", INT, INT, INT, INT, INT)
        return f(self.value(stride), self.value(padding), self.value(dilation), groups)

    def conv(self, attrs: Any, x: Any, w: Any) -> Any:
        return self.fn("conv", INT, TENSOR, TENSOR, TENSOR)(attrs, x, w)

    def chan(self, b: Any) -> Any:
        return self.fn("chan", TENSOR, TENSOR)(b)

    def view(self, shape: Any, a: Any) -> Any:
        return self.fn("view", INT, TENSOR, TENSOR)(self.value(shape), a)

    def shape_of(self, a: Any) -> Any:
        return self.fn("shape_of", TENSOR, INT)(a)

    def rank(self, a: Any) -> Any:
        return self.fn("rank", TENSOR, INT)(a)

    def same_shape(self, *ts: Any) -> Any:
        return z3.And([self.shape_of(t) == self.shape_of(ts[0]) for t in ts[1:]])

    def ground_facts(self) -> list[z3.BoolRef]:
        """What the interned permutations are: identities, and their compositions."""
        for p, q in list(itertools.product(self.perms, repeat=2)):
            if len(p) == len(q):
                self.perm(tuple(p[i] for i in q))
        facts = []
        for p in self.perms:
            identity = z3.BoolVal(p == tuple(range(len(p))))
            facts.append(self.is_identity(self.perm(p)) == identity)
            for q in self.perms:
                if len(p) == len(q):
                    composed = self.perm(tuple(p[i] for i in q))
                    facts.append(self.compose(self.perm(p), self.perm(q)) == composed)
        return facts


class Concrete:
    """The same vocabulary on numpy arrays of z3 Reals (for checking the axioms)."""

    def __init__(self) -> None:
        self.domain = RealDomain()

    def _map(self, op: Op, *ts: Tensor) -> Tensor:
        return elementwise(lambda *es: self.domain.apply(op, None, *es), *ts)

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return self._map(Op.ADD, a, b)

    def mul(self, a: Tensor, b: Tensor) -> Tensor:
        return self._map(Op.MUL, a, b)

    def num(self, r: Any) -> Tensor:
        return scalar(r)

    def recip(self, a: Tensor) -> Tensor:
        return self._map(Op.RECIPROCAL, a)

    def mm(self, a: Tensor, b: Tensor) -> Tensor:
        out = np.empty((a.shape[0], b.shape[1]), dtype=object)
        for i, j in itertools.product(range(a.shape[0]), range(b.shape[1])):
            out[i, j] = self.domain.sum([a[i, k] * b[k, j] for k in range(a.shape[1])])
        return out

    def relu(self, a: Tensor) -> Tensor:
        return self._map(Op.RELU, a)

    def unary(self, name: str, a: Tensor) -> Tensor:
        f = self.domain.function(name)
        return elementwise(f, a)

    def permute(self, p: tuple[int, ...], a: Tensor) -> Tensor:
        return np.transpose(a, p)

    def perm(self, dims: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(dims)

    def compose(self, p: tuple[int, ...], q: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(p[i] for i in q)

    def is_identity(self, p: tuple[int, ...]) -> Any:
        return z3.BoolVal(p == tuple(range(len(p))))

    def cat(self, d: int, a: Tensor, b: Tensor) -> Tensor:
        return np.concatenate((a, b), axis=d)

    def head(self, d: int, n: int, a: Tensor) -> Tensor:
        return np.take(a, range(n), axis=d)

    def tail(self, d: int, n: int, a: Tensor) -> Tensor:
        return np.take(a, range(n, a.shape[d]), axis=d)

    def size(self, a: Tensor, d: int) -> int:
        return a.shape[d]

    def conv_attrs(self, stride: Any, padding: Any, dilation: Any, groups: int) -> tuple:
        return (stride, padding, dilation, groups)

    def conv(self, attrs: tuple, x: Tensor, w: Tensor) -> Tensor:
        return conv(self.domain, x, w, None, *attrs)

    def chan(self, b: Tensor) -> Tensor:
        return b.reshape((1, b.shape[0], 1, 1))

    def view(self, shape: tuple[int, ...], a: Tensor) -> Tensor:
        return a.reshape(shape)

    def shape_of(self, a: Tensor) -> tuple[int, ...]:
        return a.shape

    def rank(self, a: Tensor) -> int:
        return a.ndim

    def same_shape(self, *ts: Tensor) -> Any:
        return z3.BoolVal(all(t.shape == ts[0].shape for t in ts))


Algebra = Any  # Symbolic or Concrete: the axioms only call the methods both have


@dataclass(frozen=True)
class Axiom:
    """∀ variables. guard ⇒ lhs = rhs, with example values for checking it concretely.

    ``variables`` are (name, kind) with kind "tensor", "int", "real" or "attr" (an attribute
    value: an Int in z3, a Python value in the examples). ``body(alg, *vars)`` returns
    (lhs, rhs) or (lhs, rhs, guard). ``examples()`` lists one value per variable: a shape for
    a tensor, None for a real (a fresh z3 Real), the value otherwise.
    """

    name: str
    variables: tuple[tuple[str, str], ...]
    body: Callable[..., tuple[Any, ...]]
    examples: Callable[[], list[tuple[Any, ...]]]


def _vars(spec: str) -> tuple[tuple[str, str], ...]:
    """'x y:tensor d:int' -> (('x', 'tensor'), ('y', 'tensor'), ('d', 'int')); the kind of a
    name without one is the next name's kind that has one."""
    out: list[tuple[str, str]] = []
    pending: list[str] = []
    for item in spec.split():
        name, _, kind = item.partition(":")
        pending.append(name)
        if kind:
            out += [(n, kind) for n in pending]
            pending = []
    return tuple(out)


# example shapes
_S2 = [(2, 3), (1, 2)]
_S = [(2,), (2, 3), (1, 2, 2)]


def _same(k: int, shapes: list[tuple[int, ...]] = _S) -> Callable[[], list[tuple]]:
    return lambda: [(s,) * k for s in shapes]


def _with_real(k: int) -> Callable[[], list[tuple]]:
    return lambda: [(s,) * k + (None,) for s in _S]


def _cat_examples(extra: int = 0) -> list[tuple]:
    """(d, x, y) with x, y equal except along d."""
    cases = []
    for shape in [(2, 3), (1, 2, 2)]:
        for d in range(len(shape)):
            other = tuple(n + 1 if i == d else n for i, n in enumerate(shape))
            cases.append((d, shape, other) + (None,) * extra)
    return cases


def _cat_pairs() -> list[tuple]:
    return [(d, x, x, y, y) for d, x, y in _cat_examples()]


_CONV = [((1, 1), (0, 0), (1, 1)), ((2, 1), (1, 1), (1, 1)), ((1, 1), (1, 0), (2, 1))]


def _conv_examples(x_c: int = 2, w_in: int = 2, out: int = 2, groups: int = 1) -> list[tuple]:
    return [(s, p, d, groups, (1, x_c, 4, 3), (out, w_in, 2, 2)) for s, p, d in _CONV]


AXIOMS: tuple[Axiom, ...] = (
    Axiom("add-comm", _vars("x y:tensor"), lambda a, x, y: (a.add(x, y), a.add(y, x)),
          lambda: _same(2)() + [((2, 3), (3,)), ((2, 3), ())]),
    Axiom("add-assoc", _vars("x y z:tensor"),
          lambda a, x, y, z: (a.add(a.add(x, y), z), a.add(x, a.add(y, z))), _same(3)),
    Axiom("mul-comm", _vars("x y:tensor"), lambda a, x, y: (a.mul(x, y), a.mul(y, x)),
          lambda: _same(2)() + [((2, 3), ())]),
    Axiom("mul-assoc", _vars("x y z:tensor"),
          lambda a, x, y, z: (a.mul(a.mul(x, y), z), a.mul(x, a.mul(y, z))), _same(3)),
    Axiom("distrib", _vars("x y z:tensor"),
          lambda a, x, y, z: (a.mul(a.add(x, y), z), a.add(a.mul(x, z), a.mul(y, z))),
          _same(3)),
    Axiom("add-zero", _vars("x:tensor"), lambda a, x: (a.add(x, a.num(z3.RealVal(0))), x),
          _same(1)),
    Axiom("mul-one", _vars("x:tensor"), lambda a, x: (a.mul(x, a.num(z3.RealVal(1))), x),
          _same(1)),
    Axiom("num-add", _vars("r s:real"),
          lambda a, r, s: (a.add(a.num(r), a.num(s)), a.num(r + s)), lambda: [(None, None)]),
    Axiom("num-mul", _vars("r s:real"),
          lambda a, r, s: (a.mul(a.num(r), a.num(s)), a.num(r * s)), lambda: [(None, None)]),
    Axiom("recip-num", _vars("r:real"),
          lambda a, r: (a.recip(a.num(r)), a.num(1 / r), r != 0), lambda: [(None,)]),
    Axiom("mm-assoc", _vars("x y z:tensor"),
          lambda a, x, y, z: (a.mm(a.mm(x, y), z), a.mm(x, a.mm(y, z))),
          lambda: [((2, 3), (3, 2), (2, 2)), ((1, 2), (2, 3), (3, 1))]),
    Axiom("mm-add-right", _vars("x y z:tensor"),
          lambda a, x, y, z: (a.mm(x, a.add(y, z)), a.add(a.mm(x, y), a.mm(x, z)),
                              a.same_shape(y, z)),
          lambda: [((2, 3), (3, 2), (3, 2))]),
    Axiom("mm-add-left", _vars("x y z:tensor"),
          lambda a, x, y, z: (a.mm(a.add(x, y), z), a.add(a.mm(x, z), a.mm(y, z)),
                              a.same_shape(x, y)),
          lambda: [((2, 3), (2, 3), (3, 2))]),
    Axiom("mm-scale-right", _vars("x y:tensor r:real"),
          lambda a, x, y, r: (a.mul(a.mm(x, y), a.num(r)), a.mm(x, a.mul(y, a.num(r)))),
          lambda: [((2, 3), (3, 2), None)]),
    Axiom("mm-scale-left", _vars("x y:tensor r:real"),
          lambda a, x, y, r: (a.mul(a.mm(x, y), a.num(r)), a.mm(a.mul(x, a.num(r)), y)),
          lambda: [((2, 3), (3, 2), None)]),
    Axiom("permute-compose", _vars("p q:attr x:tensor"),
          lambda a, p, q, x: (a.permute(q, a.permute(p, x)), a.permute(a.compose(p, q), x)),
          lambda: [(p, q, (2, 3, 4)) for p in [(1, 2, 0), (0, 2, 1)]
                   for q in [(2, 0, 1), (1, 0, 2)]]),
    Axiom("permute-identity", _vars("p:attr x:tensor"),
          lambda a, p, x: (a.permute(p, x), x, a.is_identity(p)),
          lambda: [((0, 1), (2, 3)), ((0, 1, 2), (2, 3, 4))]),
    Axiom("transpose-mm", _vars("x y:tensor"),
          lambda a, x, y: (a.permute(a.perm((1, 0)), a.mm(x, y)),
                           a.mm(a.permute(a.perm((1, 0)), y), a.permute(a.perm((1, 0)), x))),
          lambda: [((2, 3), (3, 4))]),
    Axiom("permute-add", _vars("p:attr x y:tensor"),
          lambda a, p, x, y: (a.permute(p, a.add(x, y)),
                              a.add(a.permute(p, x), a.permute(p, y)), a.same_shape(x, y)),
          lambda: [((1, 0), (2, 3), (2, 3)), ((2, 0, 1), (1, 2, 3), (1, 2, 3))]),
    Axiom("permute-mul", _vars("p:attr x y:tensor"),
          lambda a, p, x, y: (a.permute(p, a.mul(x, y)),
                              a.mul(a.permute(p, x), a.permute(p, y)), a.same_shape(x, y)),
          lambda: [((1, 0), (2, 3), (2, 3)), ((2, 0, 1), (1, 2, 3), (1, 2, 3))]),
    Axiom("permute-scale", _vars("p:attr x:tensor r:real"),
          lambda a, p, x, r: (a.permute(p, a.mul(x, a.num(r))),
                              a.mul(a.permute(p, x), a.num(r))),
          lambda: [((1, 0), (2, 3), None), ((2, 0, 1), (1, 2, 3), None)]),
    Axiom("permute-relu", _vars("p:attr x:tensor"),
          lambda a, p, x: (a.permute(p, a.relu(x)), a.relu(a.permute(p, x))),
          lambda: [((1, 0), (2, 3)), ((2, 0, 1), (1, 2, 3))]),
    Axiom("relu-idempotent", _vars("x:tensor"), lambda a, x: (a.relu(a.relu(x)), a.relu(x)),
          _same(1)),
    Axiom("relu-cat", _vars("d:int x y:tensor"),
          lambda a, d, x, y: (a.relu(a.cat(d, x, y)), a.cat(d, a.relu(x), a.relu(y))),
          _cat_examples),
    Axiom("cat-head", _vars("d:int x y:tensor"),
          lambda a, d, x, y: (a.head(d, a.size(x, d), a.cat(d, x, y)), x), _cat_examples),
    Axiom("cat-tail", _vars("d:int x y:tensor"),
          lambda a, d, x, y: (a.tail(d, a.size(x, d), a.cat(d, x, y)), y), _cat_examples),
    Axiom("split-cat", _vars("d n:int x:tensor"),
          lambda a, d, n, x: (a.cat(d, a.head(d, n, x), a.tail(d, n, x)), x),
          lambda: [(d, n, (3, 2)) for d in range(2) for n in range(1, 2 + d)]),
    Axiom("cat-assoc", _vars("d:int x y z:tensor"),
          lambda a, d, x, y, z: (a.cat(d, a.cat(d, x, y), z), a.cat(d, x, a.cat(d, y, z))),
          lambda: [(d, x, y, y) for d, x, y, _ in _cat_examples(extra=1)]),
    Axiom("conv-scale-input", _vars("s p d:attr g:int x w:tensor r:real"),
          lambda a, s, p, d, g, x, w, r: (
              a.mul(a.conv(a.conv_attrs(s, p, d, g), x, w), a.num(r)),
              a.conv(a.conv_attrs(s, p, d, g), a.mul(x, a.num(r)), w)),
          lambda: [e + (None,) for e in _conv_examples()]),
    Axiom("size-cat", _vars("d:int x y:tensor"),
          lambda a, d, x, y: (a.size(a.cat(d, x, y), d), a.size(x, d) + a.size(y, d)),
          _cat_examples),
    Axiom("cat-add", _vars("d:int x y z w:tensor"),
          lambda a, d, x, y, z, w: (a.cat(d, a.add(x, y), a.add(z, w)),
                                    a.add(a.cat(d, x, z), a.cat(d, y, w)),
                                    z3.And(a.same_shape(x, y), a.same_shape(z, w))),
          _cat_pairs),
    Axiom("cat-mul", _vars("d:int x y z w:tensor"),
          lambda a, d, x, y, z, w: (a.cat(d, a.mul(x, y), a.mul(z, w)),
                                    a.mul(a.cat(d, x, z), a.cat(d, y, w)),
                                    z3.And(a.same_shape(x, y), a.same_shape(z, w))),
          _cat_pairs),
    Axiom("cat-scale", _vars("d:int x y:tensor r:real"),
          lambda a, d, x, y, r: (a.mul(a.cat(d, x, y), a.num(r)),
                                 a.cat(d, a.mul(x, a.num(r)), a.mul(y, a.num(r)))),
          lambda: _cat_examples(extra=1)),
    Axiom("cat-row-bias", _vars("u v x y:tensor"),
          lambda a, u, v, x, y: (a.add(a.cat(0, u, v), a.cat(1, x, y)),
                                 a.cat(1, a.add(u, x), a.add(v, y)),
                                 _ranks(a, (u, 1), (v, 1), (x, 2), (y, 2))),
          lambda: [((2,), (3,), (2, 2), (2, 3))]),
    Axiom("cat-chan-bias", _vars("u v x y:tensor"),
          lambda a, u, v, x, y: (a.add(a.cat(1, x, y), a.chan(a.cat(0, u, v))),
                                 a.cat(1, a.add(x, a.chan(u)), a.add(y, a.chan(v))),
                                 _ranks(a, (u, 1), (v, 1), (x, 4), (y, 4))),
          lambda: [((2,), (1,), (1, 2, 2, 2), (1, 1, 2, 2))]),
    Axiom("chan-add", _vars("x y:tensor"),
          lambda a, x, y: (a.chan(a.add(x, y)), a.add(a.chan(x), a.chan(y)),
                           _ranks(a, (x, 1), (y, 1))),
          lambda: [((3,), (3,))]),
    Axiom("chan-mul", _vars("x y:tensor"),
          lambda a, x, y: (a.chan(a.mul(x, y)), a.mul(a.chan(x), a.chan(y)),
                           _ranks(a, (x, 1), (y, 1))),
          lambda: [((3,), (3,))]),
    Axiom("mm-cat-right", _vars("x y z:tensor"),
          lambda a, x, y, z: (a.mm(x, a.cat(1, y, z)), a.cat(1, a.mm(x, y), a.mm(x, z))),
          lambda: [((2, 3), (3, 2), (3, 1))]),
    Axiom("mm-cat-left", _vars("x y z:tensor"),
          lambda a, x, y, z: (a.mm(a.cat(0, x, y), z), a.cat(0, a.mm(x, z), a.mm(y, z))),
          lambda: [((2, 3), (1, 3), (3, 2))]),
    Axiom("mm-cat-inner", _vars("x y z w:tensor"),
          lambda a, x, y, z, w: (a.add(a.mm(x, y), a.mm(z, w)),
                                 a.mm(a.cat(1, x, z), a.cat(0, y, w))),
          lambda: [((2, 2), (2, 3), (2, 1), (1, 3))]),
    Axiom("conv-add-weight", _vars("s p d:attr g:int x w v:tensor"),
          lambda a, s, p, d, g, x, w, v: (
              a.conv(a.conv_attrs(s, p, d, g), x, a.add(w, v)),
              a.add(a.conv(a.conv_attrs(s, p, d, g), x, w),
                    a.conv(a.conv_attrs(s, p, d, g), x, v)), a.same_shape(w, v)),
          lambda: [e + (e[-1],) for e in _conv_examples()]),
    Axiom("conv-add-input", _vars("s p d:attr g:int x w v:tensor"),
          lambda a, s, p, d, g, x, w, v: (
              a.conv(a.conv_attrs(s, p, d, g), a.add(x, v), w),
              a.add(a.conv(a.conv_attrs(s, p, d, g), x, w),
                    a.conv(a.conv_attrs(s, p, d, g), v, w)), a.same_shape(x, v)),
          lambda: [e + (e[-2],) for e in _conv_examples(x_c=4, w_in=2, out=2, groups=2)]),
    Axiom("conv-scale", _vars("s p d:attr g:int x w:tensor r:real"),
          lambda a, s, p, d, g, x, w, r: (
              a.mul(a.conv(a.conv_attrs(s, p, d, g), x, w), a.num(r)),
              a.conv(a.conv_attrs(s, p, d, g), x, a.mul(w, a.num(r)))),
          lambda: [e + (None,) for e in _conv_examples()]),
    Axiom("conv-cat-weight", _vars("s p d:attr x w v:tensor"),  # groups = 1 only
          lambda a, s, p, d, x, w, v: (
              a.conv(a.conv_attrs(s, p, d, 1), x, a.cat(0, w, v)),
              a.cat(1, a.conv(a.conv_attrs(s, p, d, 1), x, w),
                    a.conv(a.conv_attrs(s, p, d, 1), x, v))),
          lambda: [e[:3] + e[4:] + ((1,) + e[5][1:],) for e in _conv_examples()]),
    Axiom("conv-cat-batch", _vars("s p d:attr g:int x v w:tensor"),
          lambda a, s, p, d, g, x, v, w: (
              a.conv(a.conv_attrs(s, p, d, g), a.cat(0, x, v), w),
              a.cat(0, a.conv(a.conv_attrs(s, p, d, g), x, w),
                    a.conv(a.conv_attrs(s, p, d, g), v, w))),
          lambda: [e[:5] + (e[4], e[5]) for e in _conv_examples()]),
    Axiom("mm-rank", _vars("x y:tensor"), lambda a, x, y: (a.rank(a.mm(x, y)), 2),
          lambda: [((2, 3), (3, 1))]),
    Axiom("view-own-shape", _vars("x:tensor"), lambda a, x: (a.view(a.shape_of(x), x), x),
          lambda: [((2, 3),), ((1, 2, 2),)]),
    Axiom("view-view", _vars("s t:attr x:tensor"),
          lambda a, s, t, x: (a.view(t, a.view(s, x)), a.view(t, x)),
          lambda: [((3, 2), (6,), (2, 3)), ((1, 6), (2, 1, 3), (2, 3))]),
)


def _ranks(a: Algebra, *pairs: tuple[Any, int]) -> Any:
    return z3.And([z3.BoolVal(a.rank(t) == n) if isinstance(a, Concrete) else a.rank(t) == n
                   for t, n in pairs])


# --- reading the axioms ----------------------------------------------------------------------

def _is_pattern(e: z3.ExprRef) -> bool:
    """A usable E-matching pattern: uninterpreted applications, variables and numerals."""
    if z3.is_var(e) or z3.is_int_value(e) or z3.is_rational_value(e):
        return True
    if not z3.is_app(e) or e.decl().kind() != z3.Z3_OP_UNINTERPRETED:
        return False
    return all(_is_pattern(c) for c in e.children())


def _symbols(e: z3.ExprRef) -> set[str]:
    if z3.is_const(e) and e.decl().kind() == z3.Z3_OP_UNINTERPRETED:
        return {str(e)}
    return set().union(*(_symbols(c) for c in e.children())) if z3.is_app(e) else set()


def symbolic_axioms(alg: Symbolic, axioms: tuple[Axiom, ...] = AXIOMS) -> list[z3.BoolRef]:
    """Each axiom as a z3 ForAll whose patterns are its sides (where a side can be one)."""
    out = []
    sorts = {"tensor": TENSOR, "int": INT, "attr": INT, "real": REAL}
    for axiom in axioms:
        names = [f"{axiom.name}.{n}" for n, _ in axiom.variables]
        consts = [z3.Const(n, sorts[k]) for n, (_, k) in zip(names, axiom.variables)]
        lhs, rhs, *guard = axiom.body(alg, *consts)
        body = lhs == rhs if not guard else z3.Implies(guard[0], lhs == rhs)
        patterns = [side for side in (lhs, rhs) if z3.is_app(side) and not z3.is_const(side)
                    and _is_pattern(side) and _symbols(side) >= set(names)]
        out.append(z3.ForAll(consts, body, patterns=patterns))
    return out


_PREPARED: dict[tuple[Axiom, ...], tuple[dict, dict, list[z3.BoolRef]]] = {}


def prepared_axioms(axioms: tuple[Axiom, ...] = AXIOMS) -> tuple[Symbolic, list[z3.BoolRef]]:
    """A fresh `Symbolic` that already holds the axioms' interned attribute values, and the
    axioms as `symbolic_axioms` gives them. Building the ForAlls walks every pattern in
    Python (most of an easy proof's time), so it happens once per process; a law's own
    values intern after the axioms', which keeps the axioms' numbers valid for every law."""
    if axioms not in _PREPARED:
        alg = Symbolic()
        formulas = symbolic_axioms(alg, axioms)
        _PREPARED[axioms] = (dict(alg.perms), dict(alg.values), formulas)
    perms, values, formulas = _PREPARED[axioms]
    alg = Symbolic()
    alg.perms, alg.values = dict(perms), dict(values)
    return alg, formulas


@dataclass(frozen=True)
class Example:
    """One axiom on concrete values: the two sides, what must hold, and a description."""

    lhs: Any
    rhs: Any
    assumptions: list[z3.BoolRef]
    describe: str
    domain: RealDomain
    values: dict[str, Tensor]  # the variables' values, for showing a counterexample


def concrete_examples(axiom: Axiom) -> list[Example]:
    """The axiom's sides on each of its example values, with fresh Reals in the tensors."""
    out = []
    for values in axiom.examples():
        alg = Concrete()
        args = []
        shown = []
        tensors = {}
        for (name, kind), value in zip(axiom.variables, values):
            if kind == "tensor":
                tensors[name] = symbolic_tensor(alg.domain, name, value)
                args.append(tensors[name])
                shown.append(f"{name}:{value}")
            elif kind == "real":
                args.append(z3.Real(name))
                tensors[name] = scalar(args[-1])
            else:
                args.append(value)
                shown.append(f"{name}={value}")
        lhs, rhs, *guard = axiom.body(alg, *args)
        out.append(Example(lhs, rhs, list(guard) + alg.domain.assumptions, " ".join(shown),
                           alg.domain, tensors))
    return out
