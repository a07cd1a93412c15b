"""Random well-typed kiln graphs, built op by op from a pool of values.

    case = generate_case(seed=7, index=123)      # always the same case for (7, 123)
    print(case.graph)

A `Draft` holds the graph being built and the values its next ops may read. Each step picks
an op and calls its maker (`kiln.fuzz.makers.MAKERS`), which takes operands from the pool or
makes new ones (graph inputs, weights, Python numbers, fills) and emits the node; type
inference (the op's ATen meaning on meta tensors) is the judge of well-typedness, and a
rejected attempt is rolled back without a trace. Every graph input gets values of a random
profile (`kiln.fuzz.values.Profile`) and a random layout, sometimes aliasing an earlier input.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kiln.fuzz.case import Case, FuzzInput
from kiln.fuzz.values import (
    Layout,
    LayoutKind,
    Profile,
    random_layout,
    random_values,
    repeat_along,
)
from kiln.ir.attrs import NO_ATTRS, Attrs, Number
from kiln.ir.builder import GraphBuilder
from kiln.ir.graph import Value, make_scalar
from kiln.ir.infer import InferenceError
from kiln.ir.ops import Op, OpGroup
from kiln.ir.types import DType, TensorType


class Reject(Exception):
    """A maker cannot build its op from what the draft offers; the step tries another op."""


@dataclass(frozen=True)
class Limits:
    max_ops: int = 6  # computing nodes per graph (at least one)
    max_rank: int = 4
    max_numel: int = 512  # elements of any one generated tensor type


FLOATS = (DType.F32, DType.F64, DType.F16, DType.BF16)
INTS = (DType.I64, DType.I32, DType.I16, DType.I8, DType.U8)
# mostly float32: the dtype of the generated kernels and of most rules' guards
_DTYPE_WEIGHTS = {DType.F32: 50, DType.F64: 10, DType.F16: 5, DType.BF16: 5, DType.I64: 8,
                  DType.I32: 5, DType.I16: 2, DType.I8: 2, DType.U8: 3, DType.BOOL: 10}
_DIMS = (0, 1, 1, 1, 2, 2, 3, 3, 4, 5, 7, 8, 9, 16, 17)
_PROFILES = (Profile.TAME, Profile.SPECIAL, Profile.SPECIAL, Profile.WIDE, Profile.INTEGRAL)


class Draft:
    """A graph under construction: the builder, the case's input values, the operand pool."""

    def __init__(self, rng: random.Random, limits: Limits, float32: bool = False) -> None:
        self.rng = rng
        self.float32 = float32  # every dtype float32 (bool masks aside): generated kernels
        self.gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
        self.limits = limits
        self.builder = GraphBuilder()
        self.inputs: list[FuzzInput] = []
        self.pool: list[Value] = []  # tensor values (not Python numbers) later ops may read
        self.contiguous: set[Value] = set()  # values known to be dense row-major at run time

    # -- types ------------------------------------------------------------------------------

    def dtype(self, among: tuple[DType, ...] | None = None) -> DType:
        choices = among or tuple(_DTYPE_WEIGHTS)
        if self.float32 and DType.F32 in choices:
            return DType.F32
        return self.rng.choices(choices, [_DTYPE_WEIGHTS[d] for d in choices])[0]

    def dim(self, zero: bool = True) -> int:
        d = self.rng.choice(_DIMS)
        return d if d or zero else 1

    def shape(self, rank: int | None = None, zero: bool = True) -> tuple[int, ...]:
        if rank is None:
            rank = self.rng.choice(range(self.limits.max_rank + 1))
        for _ in range(20):
            shape = tuple(self.dim(zero and self.rng.random() < 0.3) for _ in range(rank))
            if math.prod(shape) <= self.limits.max_numel:
                return shape
        return (1,) * rank

    def fits(self, shape: tuple[int, ...]) -> bool:
        return math.prod(shape) <= self.limits.max_numel and len(shape) <= 5

    # -- operands ---------------------------------------------------------------------------

    def pick(self, accept: Callable[[Value], bool] = lambda v: True) -> Value | None:
        """A pool value ``accept`` takes, recent ones likelier (chains get deep)."""
        found = [v for v in self.pool if accept(v)]
        if not found:
            return None
        power = 3 if self.float32 else 1  # float32 graphs: chains for the kernels to fuse
        weights = [(1 + i) ** power for i in range(len(found))]
        return self.rng.choices(found, weights)[0]

    def operand(self, accept: Callable[[Value], bool], make: Callable[[], TensorType],
                fresh: float = 0.3) -> Value:
        """A pool value ``accept`` takes, or (with chance ``fresh``, or when none) a new
        source of type ``make()``."""
        if self.rng.random() >= (fresh / 2 if self.float32 else fresh):
            found = self.pick(accept)
            if found is not None:
                return found
        return self.source(make())

    def source(self, type_: TensorType, values: torch.Tensor | None = None,
               constant: float = 0.25) -> Value:
        """A new graph input (or, with chance ``constant``, a weight) of ``type_``."""
        chosen = values is None  # given values (indices, divisors) must not be swapped out
        if values is None:
            values = random_values(type_, self.rng.choice(_PROFILES), self.gen)
        if self.rng.random() < constant:
            name = f"w{len(self.builder.constants)}"
            value = self.builder.constant(name, values)
            self.contiguous.add(value)
        else:
            value = self.input(type_, values, alias=chosen)
        self.pool.append(value)
        return value

    def input(self, type_: TensorType, values: torch.Tensor, alias: bool = True) -> Value:
        """A graph input holding ``values``: sometimes the same tensor as an earlier input of
        the same type (aliased), otherwise in a random layout."""
        same = [i for i, (n, x) in enumerate(zip(self.builder.inputs, self.inputs))
                if n.type == type_ and x.layout.kind is not LayoutKind.ALIAS]
        if alias and same and self.rng.random() < 0.3:
            j = self.rng.choice(same)
            spec = FuzzInput(self.inputs[j].values, Layout(LayoutKind.ALIAS, j))
        else:
            repeated = [d for d, n in enumerate(type_.shape) if n > 1]
            if repeated and self.rng.random() < 0.1:
                values = repeat_along(values, self.rng.choice(repeated))
            spec = FuzzInput(values, random_layout(self.rng, values))
        self.inputs.append(spec)
        return self.builder.input(f"x{len(self.inputs) - 1}", type_)

    def number(self, value: Number) -> Value:
        node = make_scalar(value)
        self.builder.add(node)
        return node.out()

    # -- nodes ------------------------------------------------------------------------------

    def emit(self, op: Op, *inputs: Value, attrs: Attrs = NO_ATTRS) -> tuple[Value, ...]:
        """Append ``op``; its outputs join the pool. InferenceError if ill-typed."""
        node = self.builder.node(op, *inputs, attrs=attrs, name=f"{op.text}{len(self.pool)}")
        self.pool.extend(node.outputs)
        if op is Op.CLONE or (op is Op.VIEW and inputs[0] in self.contiguous):
            self.contiguous.add(node.out())
        return node.outputs

    def emit1(self, op: Op, *inputs: Value, attrs: Attrs = NO_ATTRS) -> Value:
        return self.emit(op, *inputs, attrs=attrs)[0]

    def dense(self, value: Value) -> Value:
        """``value``, or a contiguous copy of it where its layout is not known to be dense
        (a view reshapes only a dense tensor, as ATen's ``view`` requires)."""
        if value in self.contiguous:
            return value
        return self.emit1(Op.CLONE, value)

    # -- rollback ---------------------------------------------------------------------------

    def mark(self) -> tuple[int, int, int, frozenset[str]]:
        b = self.builder
        return len(b.inputs), len(b.nodes), len(self.pool), frozenset(b.constants)

    def rollback(self, mark: tuple[int, int, int, frozenset[str]]) -> None:
        n_inputs, n_nodes, n_pool, constants = mark
        b = self.builder
        del b.inputs[n_inputs:], b.nodes[n_nodes:], self.inputs[n_inputs:]
        dropped = self.pool[n_pool:]
        del self.pool[n_pool:]
        self.contiguous.difference_update(dropped)
        for name in set(b.constants) - constants:
            del b.constants[name]


def generate_case(seed: int, index: int, limits: Limits = Limits(),
                  ops: tuple[Op, ...] | None = None) -> Case:
    """The ``index``-th case of the run seeded ``seed``: the same for any process count."""
    from kiln.fuzz.table import GENERATED_OPS, MAKERS, weight_of

    rng = random.Random(f"kiln-fuzz:{seed}:{index}")
    # a third of the graphs are float32 throughout, with elementwise chains and normalizations
    # three times as likely: what the partitioner turns into generated kernels
    float32 = rng.random() < 0.35
    draft = Draft(rng, limits, float32)
    choices = ops or GENERATED_OPS
    weights = [weight_of(op) * (3 if float32 and _fusible(op) else 1) for op in choices]
    wanted = rng.randint(2, limits.max_ops + 4) if float32 else rng.randint(1, limits.max_ops)
    made = attempts = 0
    while made < wanted and attempts < 20 * wanted:
        attempts += 1
        op = rng.choices(choices, weights)[0]
        mark = draft.mark()
        try:
            MAKERS[op](draft, op)
        except (Reject, InferenceError):
            draft.rollback(mark)
            continue
        made += 1
    if not draft.builder.nodes or all(n.op in (Op.CONSTANT, Op.SCALAR)
                                      for n in draft.builder.nodes):
        x = draft.source(TensorType(draft.shape(), DType.F32), constant=0.0)
        draft.emit1(Op.RELU, x)
    graph = draft.builder.build(*choose_outputs(draft))
    return Case(graph, tuple(draft.inputs), f"seed {seed} graph {index}")


def _fusible(op: Op) -> bool:
    return op.is_a(OpGroup.ELEMENTWISE | OpGroup.NORMALIZATION)


def choose_outputs(draft: Draft) -> list[Value]:
    """Values nothing reads (so that few nodes are dead), the last node's first among them,
    some others; now and then an input, a weight or a value twice (the graph returns what it
    was given, or one tensor in two places)."""
    rng = draft.rng
    computed = [v for v in draft.pool if v.node.op not in (Op.INPUT, Op.CONSTANT)]
    read = {v for n in draft.builder.nodes for v in n.inputs}
    sinks = [v for v in computed[:-1] if v not in read and v.index == 0]
    outputs = [computed[-1]] + rng.sample(sinks, min(len(sinks), 3))
    for v in computed[:-1]:
        if v not in outputs and rng.random() < 0.1 and len(outputs) < 5:
            outputs.append(v)
    sources = [v for v in draft.pool if v.node.op in (Op.INPUT, Op.CONSTANT)]
    if sources and rng.random() < 0.05:
        outputs.append(rng.choice(sources))
    if rng.random() < 0.05:
        outputs.append(rng.choice(outputs))
    rng.shuffle(outputs)
    return outputs
