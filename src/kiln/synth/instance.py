"""A law on concrete types: shapes for its tensor variables, values for its numbers and
attribute variables, and the two sides built as kiln graphs.

    law:       (mm (mm ?x ?w1) ?w2) -> (mm ?x (mm ?w1 ?w2))
    instance:  x: f32[2, 3], w1: f32[3, 2], w2: f32[2, 2]
    graphs:    src = mm(mm(x, w1), w2), dst = mm(x, mm(w1, w2)), inputs x, w1, w2 in that order

`find_instances` samples small shapes (seeded, so the result is deterministic) until the
source side type-checks, choosing attribute variables from what the operand types allow
(a permutation of the operand's rank, a split of a real dimension, ...). The instances feed
the type check of rule files (both sides must have one type), the proofs over concrete
shapes, and the randomized checks.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kiln.ir.attrs import Attrs, attrs_class_of
from kiln.ir.builder import GraphBuilder
from kiln.ir.graph import Graph, Value
from kiln.ir.infer import InferenceError
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType
from kiln.rewrite.law import (
    App,
    AttrFn,
    AttrFnKind,
    Cond,
    CondKind,
    Law,
    Lit,
    PVar,
    Term,
    term_variables,
)

NUMBER_CONDITIONS = frozenset({CondKind.NUMBER, CondKind.FINITE_NONZERO, CondKind.POW2,
                               CondKind.POW2_AT_LEAST_ONE, CondKind.NORMAL_RECIPROCAL})


class LawError(ValueError):
    """A law that cannot be instantiated as written (unknown attribute, missing value, ...)."""


@dataclass(frozen=True)
class Instance:
    tensors: Mapping[str, TensorType]
    numbers: Mapping[str, bool | int | float]
    attrs: Mapping[str, Any]

    def describe(self) -> str:
        parts = [f"{k}: {v}" for k, v in self.tensors.items()]
        parts += [f"{k} = {v!r}" for k, v in {**self.numbers, **self.attrs}.items()]
        return ", ".join(parts)


@dataclass(frozen=True)
class Roles:
    """What each variable of a law stands for."""

    tensors: tuple[str, ...]
    numbers: tuple[str, ...]
    attrs: tuple[str, ...]


def roles(law: Law) -> Roles:
    numbers = {c.args[0].name for c in law.when
               if c.kind in NUMBER_CONDITIONS and isinstance(c.args[0], PVar)}
    operands: dict[str, None] = {}
    attrs: dict[str, None] = {}
    for term in law.src:
        _collect(term, operands, attrs)
    tensors = tuple(v for v in operands if v not in numbers)
    return Roles(tensors, tuple(v for v in operands if v in numbers), tuple(attrs))


def _collect(term: Term, operands: dict[str, None], attrs: dict[str, None]) -> None:
    if isinstance(term, PVar):
        operands.setdefault(term.name)
    elif isinstance(term, App):
        for arg in term.args:
            _collect(arg, operands, attrs)
        for _, value in term.attrs:
            for name in term_variables(value):
                attrs.setdefault(name)


# --- building the two sides ----------------------------------------------------------------

# picks a value for an attribute variable: (op, key, operand types, attributes known so far)
Chooser = Callable[[Op, str, Sequence[TensorType], Mapping[str, Any]], Any]


class _Sides:
    """Builds a law's terms into one GraphBuilder, binding attribute variables as it goes."""

    def __init__(self, law: Law, instance: Instance, choose: Chooser | None,
                 weights: Mapping[str, torch.Tensor]) -> None:
        self.law = law
        self.builder = GraphBuilder("cpu")
        self.env: dict[str, Value] = {}
        self.attrs: dict[str, Any] = dict(instance.attrs)
        self.choose = choose
        for name, type_ in instance.tensors.items():
            if name in weights:  # a weight is a constant, as the rule's pattern asks
                self.env[name] = self.builder.constant(name, weights[name])
            else:
                self.env[name] = self.builder.input(name, type_)
        for name, value in instance.numbers.items():
            self.env[name] = self.builder.scalar(value)

    def term(self, term: Term) -> Value:
        if isinstance(term, PVar):
            if term.name not in self.env and isinstance(self.attrs.get(term.name), (int, float)):
                return self.builder.scalar(self.attrs[term.name])  # an attribute as a number
            if term.name not in self.env:
                raise LawError(f"law {self.law.name}: ?{term.name} is not bound by the source")
            return self.env[term.name]
        if isinstance(term, Lit):
            return self.builder.scalar(term.value)
        if isinstance(term, AttrFn):
            numbers = [self.number(a) for a in term.args]
            return self.builder.scalar(apply_attr_fn(term.kind, numbers))
        operands = [self.term(a) for a in term.args]
        attrs = self.make_attrs(term, [v.type for v in operands])
        node = self.builder.node(term.op, *operands, attrs=attrs)
        if term.output >= len(node.types):
            raise LawError(f"law {self.law.name}: {term.op.text} has no output {term.output}")
        return node.out(term.output)

    def number(self, term: Term) -> bool | int | float:
        if isinstance(term, Lit):
            return term.value
        value = self.term(term)
        if not isinstance(term, PVar) or value.node.op is not Op.SCALAR:
            raise LawError(f"law {self.law.name}: {term} is not a number operand")
        return value.node.attrs.value  # type: ignore[attr-defined]

    def make_attrs(self, term: App, operand_types: Sequence[TensorType]) -> Attrs:
        cls = attrs_class_of(term.op)
        fields = {f.name: f for f in dataclasses.fields(cls)} if cls.__name__ != "NoAttrs" \
            else {}
        given = dict(term.attrs)
        unknown = sorted(set(given) - set(fields))
        if unknown:
            raise LawError(f"law {self.law.name}: {term.op.text} has no attribute "
                           f"{', '.join(unknown)} (it has: {', '.join(fields) or 'none'})")
        missing = [k for k, f in fields.items()
                   if k not in given and f.default is dataclasses.MISSING]
        if missing:
            raise LawError(f"law {self.law.name}: {term.op.text} needs "
                           f"{', '.join(':' + k for k in missing)} (a value or a ?variable)")
        values: dict[str, Any] = {}
        # values written in the law first, so that a chosen value can depend on them
        for key in sorted(given, key=lambda k: (isinstance(given[k], PVar), k != "dim")):
            values[key] = self.attr_value(given[key], term.op, key, operand_types, values)
        return cls(**values)

    def attr_value(self, value: Any, op: Op, key: str, types: Sequence[TensorType],
                   known: Mapping[str, Any]) -> Any:
        if isinstance(value, PVar):
            if value.name not in self.attrs:
                if self.choose is None:
                    raise LawError(f"law {self.law.name}: no value for ?{value.name}")
                self.attrs[value.name] = self.choose(op, key, types, known)
            return self.attrs[value.name]
        if isinstance(value, AttrFn) and value.kind in _TYPE_FNS:
            var, *rest = value.args
            if not isinstance(var, PVar) or var.name not in self.env:
                raise LawError(f"law {self.law.name}: ({value.kind.value} ...) needs a tensor "
                               "variable bound by the source")
            return apply_type_fn(value.kind, self.env[var.name].type, rest)
        if isinstance(value, AttrFn):
            args = [self.attr_value(a, op, key, types, known) for a in value.args]
            return apply_attr_fn(value.kind, args)
        if isinstance(value, tuple):
            return tuple(self.attr_value(v, op, key, types, known) for v in value)
        return value


_TYPE_FNS = frozenset({AttrFnKind.SHAPE_OF, AttrFnKind.DTYPE_OF, AttrFnKind.SIZE})


def apply_type_fn(kind: AttrFnKind, type_: TensorType, args: Sequence[Any]) -> Any:
    """shape-of, dtype-of or (size ?x d) of a tensor of type ``type_``."""
    if kind is AttrFnKind.SHAPE_OF:
        return type_.shape
    if kind is AttrFnKind.DTYPE_OF:
        return type_.dtype
    return type_.shape[args[0]]


def apply_attr_fn(kind: AttrFnKind, args: Sequence[Any]) -> Any:
    if kind is AttrFnKind.COMPOSE:
        inner, outer = args
        return tuple(inner[d] for d in outer)
    if kind is AttrFnKind.INVERSE:
        return 1.0 / args[0]
    if kind is AttrFnKind.PLUS_ONE:
        return args[0] + 1
    raise LawError(f"unknown attribute function {kind}")


@dataclass(frozen=True)
class Built:
    """Both sides of a law on one instance; the graphs share their inputs' order."""

    instance: Instance
    src: Graph
    dst: Graph


def build(law: Law, instance: Instance, choose: Chooser | None = None,
          weights: Mapping[str, torch.Tensor] | None = None) -> Built:
    """The law's two sides as graphs over the instance's tensor variables: graph inputs in
    the instance's order, except those given in ``weights``, which become constants (with
    those values). InferenceError: a side does not type-check on this instance."""
    weights = weights or {}
    sides = _Sides(law, instance, choose, weights)
    src_out = [sides.term(t) for t in law.src]
    attrs = dict(sides.attrs)
    dst_sides = _Sides(law, dataclasses.replace(instance, attrs=attrs), None, weights)
    dst_out = [dst_sides.term(t) for t in law.dst]
    bound = dataclasses.replace(instance, attrs=attrs)
    return Built(bound, sides.builder.build(*src_out), dst_sides.builder.build(*dst_out))


def weight_names(law: Law) -> frozenset[str]:
    return frozenset(c.args[0].name for c in law.when
                     if c.kind is CondKind.WEIGHT and isinstance(c.args[0], PVar))


def sample_weights(law: Law, instance: Instance, gen: torch.Generator
                   ) -> dict[str, torch.Tensor]:
    """Random values for the law's weights on this instance."""
    return {name: _random(instance.tensors[name], gen) for name in weight_names(law)
            if name in instance.tensors}


def _random(type_: TensorType, gen: torch.Generator) -> torch.Tensor:
    if type_.dtype.is_floating:
        return torch.randn(type_.shape, generator=gen, dtype=type_.dtype.torch)
    return torch.randint(-5, 6, type_.shape, generator=gen).to(type_.dtype.torch)


# --- finding instances ---------------------------------------------------------------------

def find_instances(law: Law, count: int = 3, tries: int = 600, seed: int = 0,
                   accept: Callable[[Built], bool] | None = None) -> list[Built]:
    """Up to ``count`` instances with different shapes on which the source type-checks and
    the conditions hold (``accept`` adds a test on the source graph, whose weights are
    constants: e.g. that a hand rule fires on it). The destination is not required to
    type-check here: `type_errors` reports where it does not."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    role = roles(law)
    found: list[Built] = []
    seen: set[tuple[Any, ...]] = set()
    for _ in range(tries):
        instance = _sample(law, role, rng)
        try:
            built = _build_src_only(law, instance, _chooser(rng))
            if accept is not None:
                weights = sample_weights(law, built.instance, gen)
                built = _build_src_only(law, built.instance, None, weights)
        except (InferenceError, LawError, ValueError, IndexError, RuntimeError):
            continue
        if not _runs_as_declared(built, gen):
            continue
        key = tuple(sorted((k, v.shape) for k, v in built.instance.tensors.items()))
        key += tuple(sorted((k, repr(v)) for k, v in built.instance.attrs.items()))
        if key in seen or not _conditions_hold(law, built) or (accept and not accept(built)):
            continue
        seen.add(key)
        found.append(built)
        if len(found) == count:
            break
    return found


def _runs_as_declared(built: Built, gen: torch.Generator) -> bool:
    """Does the source run, with results of the types it declares? ATen's shape functions
    accept some operands its kernels treat otherwise (a batch norm whose statistics have
    another channel count): such an instance is not a program kiln sees."""
    inputs = [_random(node.type, gen) for node in built.src.inputs]
    try:
        results = interpret(built.src, inputs)
    except (RuntimeError, ValueError, IndexError):
        return False
    return all(isinstance(r, torch.Tensor) and tuple(r.shape) == v.type.shape
               for r, v in zip(results, built.src.outputs))


def _build_src_only(law: Law, instance: Instance, choose: Chooser | None,
                    weights: Mapping[str, torch.Tensor] | None = None) -> Built:
    sides = _Sides(law, instance, choose, weights or {})
    src_out = [sides.term(t) for t in law.src]
    bound = dataclasses.replace(instance, attrs=dict(sides.attrs))
    graph = sides.builder.build(*src_out)
    return Built(bound, graph, graph)


def type_errors(law: Law, builts: Sequence[Built]) -> list[str]:
    """Where both sides type-check with different types, per instance; or, when the
    destination type-checks on none of them, why not (empty: no error).

    A destination that fails on some shapes only is allowed: the rewrite engine checks
    every replacement's type and does not apply the law there."""
    errors, failures = [], []
    for built in builts:
        try:
            full = build(law, built.instance)
        except (InferenceError, LawError) as err:
            failures.append(f"on {built.instance.describe()}: dst does not type-check: "
                            f"{str(err).splitlines()[0]}")
            continue
        src_types = [v.type for v in full.src.outputs]
        dst_types = [v.type for v in full.dst.outputs]
        if src_types != dst_types:
            shown = ", ".join(str(t) for t in src_types), ", ".join(str(t) for t in dst_types)
            errors.append(f"on {built.instance.describe()}: src gives {shown[0]}, "
                          f"dst gives {shown[1]}")
    if failures and len(failures) == len(builts):
        errors.append(failures[0])
    return errors


_RANKS = (0, 1, 2, 2, 3, 4, 4)
# the ranks an operand slot takes (op, operand index): most shapes fail elsewhere
_SLOT_RANKS: dict[tuple[Op, int], tuple[int, ...]] = {
    (Op.MM, 0): (2,), (Op.MM, 1): (2,), (Op.BMM, 0): (3,), (Op.BMM, 1): (3,),
    (Op.ADDMM, 0): (1, 1, 2), (Op.ADDMM, 1): (2,), (Op.ADDMM, 2): (2,),
    (Op.CONVOLUTION, 0): (4,), (Op.CONVOLUTION, 1): (4,), (Op.CONVOLUTION, 2): (1,),
    (Op.CONV_ACT, 0): (4,), (Op.CONV_ACT, 1): (4,),
    (Op.BATCH_NORM, 0): (4, 2), (Op.BATCH_NORM, 1): (1,), (Op.BATCH_NORM, 2): (1,),
    (Op.BATCH_NORM, 3): (1,), (Op.BATCH_NORM, 4): (1,),
}


def _rank_hints(law: Law) -> dict[str, tuple[int, ...]]:
    hints: dict[str, tuple[int, ...]] = {}

    def visit(term: Term) -> None:
        if not isinstance(term, App):
            return
        for i, arg in enumerate(term.args):
            if isinstance(arg, PVar) and (term.op, i) in _SLOT_RANKS:
                hints.setdefault(arg.name, _SLOT_RANKS[term.op, i])
            visit(arg)
    for term in law.src:
        visit(term)
    return hints


def _sample(law: Law, role: Roles, rng: random.Random) -> Instance:
    kinds = {c.args[0].name: c.kind for c in law.when
             if c.kind in (CondKind.FLOAT, CondKind.INT) and isinstance(c.args[0], PVar)}
    hints = _rank_hints(law) if rng.random() < 0.8 else {}
    uniform = rng.random() < 0.6  # one size for every dimension makes contractions line up
    size = rng.choice((2, 3))
    tensors = {}
    for name in role.tensors:
        rank = rng.choice(hints.get(name, _RANKS))
        dims = tuple(size if uniform else rng.choice((1, 2, 3)) for _ in range(rank))
        dtype = DType.I64 if kinds.get(name) is CondKind.INT else DType.F32
        tensors[name] = TensorType(dims, dtype)
    numbers = {name: _sample_number(law, name, tensors, rng) for name in role.numbers}
    return Instance(tensors, numbers, {})


def _sample_number(law: Law, name: str, tensors: Mapping[str, TensorType],
                   rng: random.Random) -> bool | int | float:
    kinds = {c.kind for c in law.when if c.args and c.args[0] == PVar(name)}
    if CondKind.POW2_AT_LEAST_ONE in kinds:
        return rng.choice((2.0, 4.0, 1.0))
    if CondKind.POW2 in kinds:
        return rng.choice((2.0, 0.5, -4.0, 0.25))
    return rng.choice((3.0, -1.5, 0.1, 7.0))


def _chooser(rng: random.Random) -> Chooser:
    def choose(op: Op, key: str, types: Sequence[TensorType], known: Mapping[str, Any]) -> Any:
        shape = types[0].shape if types else ()
        rank = len(shape)
        if key == "dims" and op is Op.PERMUTE:
            return tuple(rng.sample(range(rank), rank))
        if key == "dims" and op is Op.SQUEEZE:
            return tuple(d for d in range(rank) if shape[d] == 1) or (0,)
        if key == "shape" and op is Op.EXPAND:
            return tuple(2 if d == 1 else d for d in shape)
        if key == "shape":
            return rng.choice(_reshapes(shape))
        if key == "dim":
            return rng.randrange(rank + (1 if op is Op.UNSQUEEZE else 0)) if rank else 0
        if key == "sizes":
            return _split_sizes(shape[known.get("dim", 0)] if rank else 1, rng)
        return _CONSTANT_CHOICES[key](rng) if key in _CONSTANT_CHOICES else _no_choice(op, key)
    return choose


def _no_choice(op: Op, key: str) -> Any:
    raise LawError(f"kiln cannot pick values for {op.text}'s :{key} on its own; "
                   f"write a value in the law")


def _reshapes(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    n = 1
    for d in shape:
        n *= d
    options = [shape, (n,), (1,) + shape]
    if len(shape) >= 2:
        options.append(shape[:-2] + (shape[-2] * shape[-1],))
    return options


def _split_sizes(extent: int, rng: random.Random) -> tuple[int, ...]:
    if extent < 2:
        return (extent,)
    cut = rng.randrange(1, extent)
    return (cut, extent - cut)


_CONSTANT_CHOICES: dict[str, Callable[[random.Random], Any]] = {
    "stride": lambda rng: rng.choice(((1, 1), (2, 2), (1, 2))),
    "padding": lambda rng: rng.choice(((0, 0), (1, 1))),
    "dilation": lambda rng: rng.choice(((1, 1), (2, 1))),
    "output_padding": lambda rng: (0, 0),
    "groups": lambda rng: 1,
    "transposed": lambda rng: False,
    "eps": lambda rng: 1e-5,
    "beta": lambda rng: 1,
    "alpha": lambda rng: 1,
    "activation": lambda rng: Op.RELU,
    "act_args": lambda rng: (),
    "has_bias": lambda rng: rng.random() < 0.5,
    "has_residual": lambda rng: False,
    "approximate": lambda rng: rng.choice(("none", "tanh")),
    "min": lambda rng: rng.choice((-1.0, None)),
    "max": lambda rng: rng.choice((1.0, 6.0)),
    "negative_slope": lambda rng: 0.01,
}


def _conditions_hold(law: Law, built: Built) -> bool:
    inst = built.instance
    for cond in law.when:
        if not _holds(cond, inst):
            return False
    return True


def _holds(cond: Cond, inst: Instance) -> bool:
    names = [a.name for a in cond.args if isinstance(a, PVar)]
    if cond.kind is CondKind.SAME_TYPE:
        types = [inst.tensors.get(n) for n in names]
        return None not in types and all(t == types[0] for t in types)
    if cond.kind is CondKind.FLOAT:
        t = inst.tensors.get(names[0])
        return t is None or t.dtype.is_floating
    if cond.kind is CondKind.INT:
        t = inst.tensors.get(names[0])
        return t is None or not t.dtype.is_floating
    return True



def rule_fires(rule: Any, built: Built) -> bool:
    """Does the hand-written ``rule`` fire on this instance's source graph (its pattern and
    its Python guard)? Used to find instances of a law where its rule applies."""
    from kiln.options import Options
    from kiln.rewrite.engine import apply_rules

    try:
        result = apply_rules(built.src, [rule], Options(fast_math=True))
    except (InferenceError, RuntimeError, ValueError):
        return False
    stats = result.stats.get(rule.name)
    return stats is not None and stats.fired > 0
