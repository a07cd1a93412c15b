"""Every small graph over a pool of inputs: the first step of TASO's rule generator.

    pool:    x1 x2: f32[3, 2]   w1 w2 w3: f32[2, 2]   i1 i2: f32[1, 2, 3, 3]
             k1 k2: f32[2, 2, 3, 3] (3x3 filters)   k3: f32[2, 2, 1, 3] (1x3)   s: a number
    ops:     add mul smul mm transpose conv conv_relu relu cat0 cat1 split0 split1
    graph:   (relu (mm ?x1 ?w1))           one op after another, each applied to the pool's
             (mm ?x1 (cat1 ?w1 ?w2))       inputs or to earlier results; the graph's outputs
                                           are the results no later op reads (its sinks)

`Enumerator.graphs(n)` visits every such graph of n ops once (the driver asks for 1 op, then
2, ..., so the first graph of a fingerprint is a smallest one), with each tensor's values on
random integer inputs (`kiln.synth.fingerprint`). A graph is visited once, not once per
order of its ops: an op that could move before earlier ops it does not read (their results
are not its operands) must sort after them by its term, so each DAG is built in one order.
No graph holds the same op twice (same op, operands and attributes), and commutative ops
take their operands in term order. A graph with a result equal (on the random inputs) to
another of its tensors is visited but not extended: every extension would repeat a rule
found for the smaller one.

Shapes type-check by kiln's own inference (`kiln.ir.infer`, cached per op and operand
shapes). Only connected graphs are visited (ops linked through the tensors they share):
unrelated parts side by side give only smaller rules side by side. A convolution reads
data computed from activations and a filter computed from filters (TASO's typing).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.ir.attrs import attrs_class_of
from kiln.ir.builder import GraphBuilder
from kiln.ir.infer import InferenceError
from kiln.ir.ops import Op
from kiln.ir.semantics import lower_to_aten, run_call
from kiln.ir.types import DType, TensorType
from kiln.rewrite.law import App, PVar, Term

Shape = tuple[int, ...]
AttrPairs = tuple[tuple[str, Any], ...]


class Role(enum.Enum):
    """What a pool input stands for; inputs of one role and shape are interchangeable."""

    TENSOR = "tensor"  # activations and 2-d weights: any operand
    FILTER = "filter"  # a convolution filter: never a convolution's data operand
    NUMBER = "number"  # a Python number operand (mul by a scalar)


@dataclass(frozen=True)
class Var:
    name: str
    shape: Shape  # () for a number
    role: Role = Role.TENSOR

    @property
    def klass(self) -> tuple[Shape, Role]:
        """Inputs of one class may be renamed into each other (canonical variable order)."""
        return (self.shape, self.role)


def _pool(prefix: str, count: int, shape: Shape, role: Role = Role.TENSOR) -> tuple[Var, ...]:
    return tuple(Var(f"{prefix}{i + 1}", shape, role) for i in range(count))


# TASO's pool (x: n×4, w: 4×4, images, 3×3 and 1×3 filters, a scalar) on smaller shapes: the
# prover's reals grow with the shapes, and kiln's type check of a rule file samples
# dimensions from 1..3, so a split's halves (3 + 3 rows, 1 + 1 columns) must come from there.
# Two x's: a law found on three x's is found on three w's (the same law on other shapes).
DEFAULT_POOL: tuple[Var, ...] = (
    _pool("x", 2, (3, 2)) + _pool("w", 3, (2, 2)) + _pool("i", 2, (1, 2, 3, 3))
    + _pool("k", 2, (2, 2, 3, 3), Role.FILTER) + (Var("k3", (2, 2, 1, 3), Role.FILTER),)
    + (Var("s", (), Role.NUMBER),)
)


# --- operators -----------------------------------------------------------------------------

AttrRule = Callable[[Sequence[Shape]], "AttrPairs | None"]  # None: does not apply


@dataclass(frozen=True)
class OpSpec:
    """One operator of the enumeration: a kiln op with attributes fixed (or computed from the
    operand shapes), e.g. ``conv``: convolution, stride 1, "same" padding, groups 1."""

    name: str
    op: Op
    arity: int
    attrs: AttrRule = field(default=lambda shapes: (), compare=False)
    outputs: int = 1
    commutative: bool = False  # operands in term order, never twice the same
    same_shapes: bool = False  # elementwise: operands of one shape (no broadcasting)
    distinct: bool = False  # never the same operand twice (cat)
    number_operand: int | None = None  # this operand is the pool's number, the others not
    data_operand: int | None = None  # convolution: data from activations, filter from filters
    ranks: tuple[int, ...] | None = None  # operand ranks that apply (all operands)


def _same_conv(shapes: Sequence[Shape], **extra: Any) -> AttrPairs | None:
    if len(shapes[1]) != 4 or shapes[1][2] % 2 == 0 or shapes[1][3] % 2 == 0:
        return None  # "same" padding needs an odd kernel
    padding = (shapes[1][2] // 2, shapes[1][3] // 2)
    return tuple(dict(stride=(1, 1), padding=padding, dilation=(1, 1), groups=1,
                      **extra).items())


def _conv_attrs(shapes: Sequence[Shape]) -> AttrPairs | None:
    return _same_conv(shapes, transposed=False, output_padding=(0, 0))


def _conv_relu_attrs(shapes: Sequence[Shape]) -> AttrPairs | None:
    return _same_conv(shapes, has_bias=False, has_residual=False, activation=Op.RELU)


def _split_attrs(dim: int) -> AttrRule:
    def attrs(shapes: Sequence[Shape]) -> AttrPairs | None:
        shape = shapes[0]
        if len(shape) <= dim or shape[dim] % 2 or shape[dim] == 0:
            return None
        half = shape[dim] // 2
        return (("dim", dim), ("sizes", (half, half)))
    return attrs


def _fixed(**attrs: Any) -> AttrRule:
    pairs = tuple(attrs.items())
    return lambda shapes: pairs


_POOL_WINDOW = dict(kernel=(3, 3), stride=(1, 1), padding=(1, 1), ceil_mode=False)

ADD = OpSpec("add", Op.ADD, 2, commutative=True, same_shapes=True)
MUL = OpSpec("mul", Op.MUL, 2, commutative=True, same_shapes=True)
SMUL = OpSpec("smul", Op.MUL, 2, number_operand=1)
MM = OpSpec("mm", Op.MM, 2, ranks=(2,))
TRANSPOSE = OpSpec("transpose", Op.PERMUTE, 1, _fixed(dims=(1, 0)), ranks=(2,))
CONV = OpSpec("conv", Op.CONVOLUTION, 2, _conv_attrs, data_operand=0, ranks=(4,))
CONV_RELU = OpSpec("conv_relu", Op.CONV_ACT, 2, _conv_relu_attrs, data_operand=0, ranks=(4,))
RELU = OpSpec("relu", Op.RELU, 1)
CAT0 = OpSpec("cat0", Op.CAT, 2, _fixed(dim=0), distinct=True)
CAT1 = OpSpec("cat1", Op.CAT, 2, _fixed(dim=1), distinct=True)
SPLIT0 = OpSpec("split0", Op.SPLIT, 1, _split_attrs(0), outputs=2)
SPLIT1 = OpSpec("split1", Op.SPLIT, 1, _split_attrs(1), outputs=2)
# pooling: 3x3 windows, stride 1, padding 1. Not in the default set: kiln's prover has no
# model of pooling (its rules come out unsupported, not proven); max_pool2d's indices
# (output 1) are never used.
AVG_POOL = OpSpec("avg_pool", Op.AVG_POOL2D, 1,
                  _fixed(**_POOL_WINDOW, count_include_pad=True, divisor_override=None),
                  ranks=(4,))
MAX_POOL = OpSpec("max_pool", Op.MAX_POOL2D, 1, _fixed(**_POOL_WINDOW, dilation=(1, 1)),
                  ranks=(4,))

DEFAULT_OPS: tuple[OpSpec, ...] = (ADD, MUL, SMUL, MM, TRANSPOSE, CONV, CONV_RELU, RELU,
                                   CAT0, CAT1, SPLIT0, SPLIT1)
ALL_OPS: tuple[OpSpec, ...] = DEFAULT_OPS + (AVG_POOL, MAX_POOL)
OPS_BY_NAME = {spec.name: spec for spec in ALL_OPS}


# --- tensors and graphs --------------------------------------------------------------------

class Tensor:
    """A pool input or one result of an op application, with its values on every draw."""

    __slots__ = ("key", "output", "shape", "values", "fp", "spec", "attrs", "operands", "var",
                 "roles", "at")

    def __init__(self, key: str, output: int, shape: Shape, values: Any, fp: bytes,
                 spec: OpSpec | None = None, attrs: AttrPairs = (),
                 operands: tuple[Tensor, ...] = (), var: Var | None = None) -> None:
        self.key = key  # the term as text: "(mm x1 (cat1 w1 w2))", "x1"; "#1" for output 1
        self.output = output  # which output of its op
        self.shape = shape
        self.values = values  # every draw stacked on a leading axis (kiln.synth.fingerprint)
        self.fp = fp  # fingerprint of the values and shape (kiln.synth.fingerprint)
        self.spec = spec
        self.attrs = attrs
        self.operands = operands
        self.var = var
        # the roles of the inputs it is computed from: a filter is made of filters
        self.roles = frozenset((var.role,)) if var is not None else \
            frozenset().union(*(o.roles for o in operands))
        self.at = -1  # the position of its op in the graph being built (-1: an input)

    def term(self, rename: Callable[[str], str] = lambda name: name) -> Term:
        """The tensor as a law's term over its inputs (renamed)."""
        if self.var is not None:
            return PVar(rename(self.var.name))
        assert self.spec is not None
        return App(self.spec.op, tuple(a.term(rename) for a in self.operands), self.attrs,
                   self.output)

    def __repr__(self) -> str:
        return f"<Tensor {self.key}>"


@dataclass(frozen=True)
class Candidate:
    """One enumerated graph: its outputs (sinks) and how many ops it has."""

    outputs: tuple[Tensor, ...]
    num_ops: int

    @property
    def fingerprint(self) -> tuple[bytes, ...]:
        return tuple(sorted(t.fp for t in self.outputs))


@dataclass
class _App:
    key: str
    outputs: tuple[Tensor, ...]
    operands: tuple[int, ...]  # positions in the tensor list


Evaluator = Callable[[OpSpec, AttrPairs, Sequence[Any]], tuple[Any, ...]]  # all draws at once
Hasher = Callable[[Shape, Any], bytes]


class Enumerator:
    """Depth-first enumeration of graphs; `graphs(n)` yields those with exactly n ops."""

    def __init__(self, pool: Sequence[Var], ops: Sequence[OpSpec], inputs: dict[str, Any],
                 evaluate: Evaluator, fingerprint: Hasher) -> None:
        self.ops = tuple(ops)
        self.evaluate = evaluate
        self.fingerprint = fingerprint
        self.types = _TypeCache()
        self.inputs = [Tensor(v.name, 0, v.shape, inputs[v.name],
                              fingerprint(v.shape, inputs[v.name]), var=v) for v in pool]
        self.number = next((t for t in self.inputs if t.var and t.var.role is Role.NUMBER),
                           None)
        self.visited = 0

    def graphs(self, num_ops: int) -> Iterator[Candidate]:
        tensors = list(self.inputs)
        seen = {t.fp: 1 for t in tensors}
        yield from self._extend(tensors, [], [0] * len(tensors), seen, num_ops)

    def _extend(self, tensors: list[Tensor], apps: list[_App], uses: list[int],
                seen: dict[bytes, int], num_ops: int) -> Iterator[Candidate]:
        comp, count = self._components(tensors, apps)
        left = num_ops - len(apps) - 1  # ops still to add after this one
        for spec in self.ops:
            for operands in self._operand_choices(spec, tensors):
                touched = {comp[i] for i in operands if comp[i] >= 0}
                if count - len(touched) > left:  # the ops could not end up connected
                    continue
                app = self._apply(spec, operands, tensors, apps)
                if app is None:
                    continue
                fresh = [t.fp for t in app.outputs]
                duplicate = any(fp in seen for fp in fresh) or len(set(fresh)) < len(fresh)
                tensors.extend(app.outputs)
                apps.append(app)
                uses.extend([0] * len(app.outputs))
                for i in app.operands:
                    uses[i] += 1
                for fp in fresh:
                    seen[fp] = seen.get(fp, 0) + 1
                if len(apps) == num_ops:
                    self.visited += 1
                    sinks = tuple(t for t, n in zip(tensors, uses) if n == 0 and t.spec)
                    if len({t.fp for t in sinks}) == len(sinks):
                        yield Candidate(sinks, num_ops)
                elif not duplicate:
                    yield from self._extend(tensors, apps, uses, seen, num_ops)
                for fp in fresh:
                    seen[fp] -= 1
                    if not seen[fp]:
                        del seen[fp]
                for i in app.operands:
                    uses[i] -= 1
                del uses[-len(app.outputs):]
                apps.pop()
                del tensors[-len(app.outputs):]

    def _components(self, tensors: list[Tensor], apps: list[_App]) -> tuple[list[int], int]:
        """Which connected part of the graph each tensor belongs to (-1: none), and how many
        parts there are. Ops are connected through the tensors they read or write; the
        number input connects nothing (graphs of unrelated parts give only rules that are
        smaller rules side by side)."""
        parent = list(range(len(apps)))

        def find(a: int) -> int:
            while parent[a] != a:
                a = parent[a]
            return a
        owner: dict[int, int] = {}
        position = {id(t): i for i, t in enumerate(tensors)}
        for a, app in enumerate(apps):
            touched = list(app.operands) + [position[id(t)] for t in app.outputs]
            for i in touched:
                if tensors[i] is self.number:
                    continue
                if i in owner:
                    parent[find(a)] = find(owner[i])
                else:
                    owner[i] = a
        comp = [-1] * len(tensors)
        for i, a in owner.items():
            comp[i] = find(a)
        return comp, len({find(a) for a in range(len(apps))})

    def _operand_choices(self, spec: OpSpec, tensors: list[Tensor]) -> Iterator[tuple[int, ...]]:
        candidates = [i for i, t in enumerate(tensors) if t.var is None or
                      t.var.role is not Role.NUMBER]
        if spec.ranks is not None:
            candidates = [i for i in candidates if len(tensors[i].shape) in spec.ranks]
        if spec.arity == 1:
            yield from ((i,) for i in candidates)
            return
        if spec.number_operand is not None:
            if self.number is not None:
                at = tensors.index(self.number)
                yield from ((i, at) if spec.number_operand == 1 else (at, i) for i in candidates)
            return
        for i in candidates:
            a = tensors[i]
            if spec.data_operand == 0 and Role.TENSOR not in a.roles:
                continue  # data is computed from activations
            for j in candidates:
                b = tensors[j]
                if spec.data_operand == 0 and Role.TENSOR in b.roles:
                    continue  # a filter is computed from filters (and numbers) only
                if spec.same_shapes and a.shape != b.shape:
                    continue
                if (spec.distinct or spec.commutative) and i == j:
                    continue
                if spec.commutative and a.key > b.key:
                    continue
                yield (i, j)

    def _apply(self, spec: OpSpec, operands: tuple[int, ...], tensors: list[Tensor],
               apps: list[_App]) -> _App | None:
        args = tuple(tensors[i] for i in operands)
        key = f"({spec.name} {' '.join(a.key for a in args)})"
        # one order per DAG: an op that could move before the ops after its last operand's
        # producer must sort after them
        last = max(a.at for a in args)
        if any(app.key >= key for app in apps[last + 1:]):
            return None  # also refuses an op already in the graph (equal keys)
        if any(app.key == key for app in apps[:last + 1]):
            return None
        shapes = tuple(a.shape for a in args)
        attrs = spec.attrs(shapes)
        if attrs is None:
            return None
        out_shapes = self.types.infer(spec, attrs, args)
        if out_shapes is None:
            return None
        values = self.evaluate(spec, attrs, [a.values for a in args])
        outputs = []
        for index, (shape, vals) in enumerate(zip(out_shapes, values)):
            out_key = key if spec.outputs == 1 else f"{key}#{index}"
            outputs.append(Tensor(out_key, index, shape, vals, self.fingerprint(shape, vals),
                                  spec, attrs, args))
            outputs[-1].at = len(apps)  # where _extend puts its op
        return _App(key, tuple(outputs), operands)


class _TypeCache:
    """Output shapes of an op on operand shapes, by kiln's inference (None: does not apply)."""

    def __init__(self) -> None:
        self.known: dict[tuple[Any, ...], tuple[Shape, ...] | None] = {}

    def infer(self, spec: OpSpec, attrs: AttrPairs, args: Sequence[Tensor]
              ) -> tuple[Shape, ...] | None:
        numbers = tuple(a.var is not None and a.var.role is Role.NUMBER for a in args)
        key = (spec.name, attrs, tuple(a.shape for a in args), numbers)
        if key not in self.known:
            self.known[key] = _infer(spec, attrs, args)
        return self.known[key]


def _infer(spec: OpSpec, attrs: AttrPairs, args: Sequence[Tensor]) -> tuple[Shape, ...] | None:
    builder = GraphBuilder("cpu")
    values = []
    for i, arg in enumerate(args):
        if arg.var is not None and arg.var.role is Role.NUMBER:
            values.append(builder.scalar(1.0))
        else:
            values.append(builder.input(f"a{i}", TensorType(arg.shape, DType.F32)))
    try:
        node = builder.node(spec.op, *values, attrs=make_attrs(spec.op, attrs))
    except (InferenceError, TypeError, ValueError):
        return None
    return tuple(t.shape for t in node.types[:spec.outputs])


def make_attrs(op: Op, attrs: AttrPairs) -> Any:
    cls = attrs_class_of(op)
    return cls(**dict(attrs)) if dataclasses.is_dataclass(cls) and attrs else cls()


def run_op(spec: OpSpec, attrs: AttrPairs, operands: Sequence[Any]) -> tuple[Any, ...]:
    """The op's results on concrete operands, by kiln's own ATen lowering."""
    numbers = frozenset(i for i, x in enumerate(operands) if not isinstance(x, torch.Tensor))
    call = lower_to_aten(spec.op, make_attrs(spec.op, attrs), len(operands), numbers)
    return run_call(call, list(operands), "cpu")[:spec.outputs]


__all__ = ["ALL_OPS", "DEFAULT_OPS", "DEFAULT_POOL", "OPS_BY_NAME", "Candidate", "Enumerator",
           "OpSpec", "Role", "Tensor", "Var", "run_op"]
