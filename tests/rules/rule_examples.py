"""Random instances of every rule's pattern, keyed by rule name.

Each example takes a `random.Random` and builds a small graph that contains the rule's
pattern, with shapes drawn within the rule's constraints (square matrices included, since a
transpose of one keeps its type). test_rules_checked.py runs each rule on its examples and
compares the graphs before and after on random inputs; a rule without an example fails there.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from kiln.ir.attrs import (
    AddmmAttrs,
    BatchNormAttrs,
    ClampAttrs,
    ConvActAttrs,
    ConvAttrs,
    DimAttrs,
    DivAttrs,
    GeluAttrs,
    LeakyReluAttrs,
    PermuteAttrs,
    ShapeAttrs,
    SoftmaxAttrs,
    SqueezeAttrs,
)
from kiln.ir.builder import GraphBuilder
from kiln.ir.graph import Graph, Value
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType

F32, I64 = DType.F32, DType.I64


class Example:
    """A GraphBuilder with random shapes and weights."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.b = GraphBuilder()
        self.gen = torch.Generator().manual_seed(rng.randrange(1 << 30))

    def dims(self, rank: int | None = None, lo: int = 1, hi: int = 5) -> tuple[int, ...]:
        rank = self.rng.randint(1, 3) if rank is None else rank
        return tuple(self.rng.randint(lo, hi) for _ in range(rank))

    def input(self, shape: tuple[int, ...], dtype: DType = F32) -> Value:
        return self.b.input(f"x{len(self.b.inputs)}", TensorType(shape, dtype))

    def weight(self, shape: tuple[int, ...], fill: float | None = None,
               positive: bool = False) -> Value:
        if fill is not None:
            t = torch.full(shape, fill)
        else:
            t = torch.randn(shape, generator=self.gen)
            if positive:
                t = t.abs() + 0.1
        return self.b.constant(f"w{len(self.b.constants)}", t)

    def number(self, value: float | int) -> Value:
        return self.b.scalar(value)

    def op(self, op: Op, *inputs: Value, attrs=None) -> Value:
        if attrs is None:
            return self.b.op(op, *inputs)
        return self.b.op(op, *inputs, attrs=attrs)

    def pick(self, *choices):
        """One of ``choices``; a callable choice is called, so unpicked graphs are not built."""
        choice = self.rng.choice(choices)
        return choice() if callable(choice) else choice

    def graph(self, *outputs: Value) -> Graph:
        return self.b.build(*outputs)


def _permutation(e: Example, rank: int) -> tuple[int, ...]:
    dims = list(range(rank))
    e.rng.shuffle(dims)
    return tuple(dims)


def _conv(e: Example, x: Value, out_channels: int, kernel: int, bias: bool, stride: int = 1,
          padding: int = 0) -> Value:
    in_channels = x.type.shape[1]
    operands = [x, e.weight((out_channels, in_channels, kernel, kernel))]
    if bias:
        operands.append(e.weight((out_channels,)))
    attrs = ConvAttrs((stride, stride), (padding, padding), (1, 1), False, (0, 0), 1)
    return e.op(Op.CONVOLUTION, *operands, attrs=attrs)


def _image(e: Example) -> Value:
    return e.input((e.rng.randint(1, 2), e.rng.randint(1, 4), e.rng.randint(3, 6),
                    e.rng.randint(3, 6)))


def _activation(e: Example, x: Value) -> Value:
    kind = e.rng.randrange(6)
    if kind == 0:
        return e.op(Op.RELU, x)
    if kind == 1:
        return e.op(Op.GELU, x, attrs=GeluAttrs(e.pick("none", "tanh")))
    if kind == 2:
        return e.op(Op.CLAMP, x, attrs=ClampAttrs(e.pick(0.0, -1.0, None), e.pick(6.0, 1.5)))
    if kind == 3:
        return e.op(Op.LEAKY_RELU, x, attrs=LeakyReluAttrs(0.1))
    return e.op(e.pick(Op.SIGMOID, Op.TANH), x)


def _linear_weight(e: Example, k: int, n: int) -> Value:
    return e.op(Op.PERMUTE, e.weight((n, k)), attrs=PermuteAttrs((1, 0)))


def _addmm(e: Example, x: Value, n: int) -> Value:
    k = x.type.shape[1]
    return e.op(Op.ADDMM, e.weight((n,)), x, _linear_weight(e, k, n), attrs=AddmmAttrs(1, 1))


def _batch_norm(e: Example, x: Value) -> Value:
    c = x.type.shape[1]
    return e.op(Op.BATCH_NORM, x, e.weight((c,)), e.weight((c,)), e.weight((c,)),
                e.weight((c,), positive=True), attrs=BatchNormAttrs(1e-5))


def _ones_like(e: Example, x: Value, value: float) -> Value:
    return e.pick(lambda: e.number(value), lambda: e.weight(x.type.shape, fill=value))


def _binary_example(op: Op, operand: float, dtype: DType = F32, swap: bool = True):
    def build(e: Example) -> Graph:
        x = e.input(e.dims(), dtype)
        c = _ones_like(e, x, operand) if dtype is F32 else e.number(int(operand))
        args = (c, x) if swap and e.rng.random() < 0.5 else (x, c)
        attrs = DivAttrs(None) if op is Op.DIV else None
        return e.graph(e.op(op, *args, attrs=attrs))
    return build


def _softmax_of_zero_sum(op: Op):
    """softmax(x + zeros) over any dim, the zeros a number or a weight broadcast into x
    (attention's folded mask: one row of zeros for every head)."""
    def build(e: Example) -> Graph:
        x = e.input(e.dims(e.rng.randint(1, 3)))
        shape = tuple(e.pick(1, n) for n in x.type.shape)
        zero = e.pick(lambda: e.number(0.0), lambda: e.weight(shape, fill=0.0))
        args = (zero, x) if e.rng.random() < 0.5 else (x, zero)
        dim = e.rng.randrange(-len(x.type.shape), len(x.type.shape))
        return e.graph(e.op(op, e.op(Op.ADD, *args), attrs=SoftmaxAttrs(dim)))
    return build


def _cat_of_copy(e: Example, first: bool) -> Graph:
    """cat(clone(x), y) or cat(y, clone(x)) along a random axis; x the caller's tensor or a
    value the graph computes, the copy read elsewhere too or not."""
    shape = e.dims(e.rng.randint(1, 3))
    dim = e.rng.randrange(len(shape))
    other = tuple(n + 1 if i == dim else n for i, n in enumerate(shape))
    x = e.pick(lambda: e.input(shape), lambda: e.op(Op.RELU, e.input(shape)))
    copy = e.op(Op.CLONE, x)
    y = e.input(other)
    pieces = (copy, y) if first else (y, copy)
    cat = e.op(Op.CAT, *pieces, attrs=DimAttrs(dim))
    return e.graph(cat, e.op(Op.NEG, copy)) if e.rng.random() < 0.3 else e.graph(cat)


def _twice(op: Op, dtype: DType = F32):
    return lambda e: e.graph(e.op(op, e.op(op, e.input(e.dims(), dtype))))


def _chain(outer: Op, inner: Op):
    def build(e: Example) -> Graph:
        x = e.input(e.dims(2))
        c2 = e.pick(lambda: e.number(e.rng.uniform(0.5, 2)), lambda: e.weight(x.type.shape[1:]))
        c1 = e.pick(lambda: e.number(e.rng.uniform(0.5, 2)),
                    lambda: e.weight((1, x.type.shape[1])))
        div = DivAttrs(None) if outer is Op.DIV else None
        return e.graph(e.op(outer, e.op(inner, x, c2, attrs=div), c1, attrs=div))
    return build


def _reshape_chain(e: Example) -> Graph:
    a, b, c = e.dims(3)
    x = e.input((a * b, c))
    mid = e.pick(lambda: e.op(Op.VIEW, x, attrs=ShapeAttrs((a, b, c))),
                 lambda: e.op(Op.UNSQUEEZE, x, attrs=DimAttrs(0)))
    return e.graph(e.op(Op.VIEW, mid, attrs=ShapeAttrs((a * b * c,))))


def _permute_permute(e: Example) -> Graph:
    rank = e.rng.randint(2, 4)
    n = e.rng.randint(2, 4)
    x = e.input(tuple(n for _ in range(rank)) if e.rng.random() < 0.5 else e.dims(rank))
    p = e.op(Op.PERMUTE, x, attrs=PermuteAttrs(_permutation(e, rank)))
    return e.graph(e.op(Op.PERMUTE, p, attrs=PermuteAttrs(_permutation(e, rank))))


def _permute_sink(e: Example) -> Graph:
    """op(permute(x, p), permute(y, p)), y sometimes a weight; x with NaN and inf where
    drawn (the interpreter's random inputs), the permuted views also read elsewhere."""
    rank = e.rng.randint(2, 4)
    shape = e.dims(rank, lo=2)
    dims = _permutation(e, rank)
    x = e.input(shape)
    y = e.pick(lambda: e.input(shape), lambda: e.weight(shape))
    px = e.op(Op.PERMUTE, x, attrs=PermuteAttrs(dims))
    py = e.op(Op.PERMUTE, y, attrs=PermuteAttrs(dims))
    out = e.op(e.pick(Op.ADD, Op.MUL), px, py)
    return e.graph(out, px) if e.rng.random() < 0.3 else e.graph(out)


def _permute_sink_unary(e: Example) -> Graph:
    """f(permute(x, p)) for an elementwise f of one operand (bool x for logical_not), the
    permuted view sometimes read elsewhere too."""
    from kiln.rules.movement import UNARY_SINKS_PERMUTE

    op = e.rng.choice(UNARY_SINKS_PERMUTE)
    rank = e.rng.randint(2, 4)
    x = e.input(e.dims(rank, lo=2), DType.BOOL if op is Op.LOGICAL_NOT else F32)
    px = e.op(Op.PERMUTE, x, attrs=PermuteAttrs(_permutation(e, rank)))
    attrs = {Op.GELU: lambda: GeluAttrs(e.pick("none", "tanh")),
             Op.CLAMP: lambda: ClampAttrs(e.pick(None, -0.5), e.pick(None, 0.0, 6.0)),
             Op.LEAKY_RELU: lambda: LeakyReluAttrs(e.pick(0.01, 0.2))}.get(op)
    out = e.op(op, px, attrs=attrs() if attrs else None)
    return e.graph(out, px) if e.rng.random() < 0.3 else e.graph(out)


def _permute_hoist(e: Example) -> Graph:
    """x op permute(y) {(0, 3, 1, 2)} with y a dense [N, H, W, C] value (a clone's result,
    or a relu of it), in either operand order."""
    n, h, w, c = e.dims(4, lo=1, hi=4)
    y = e.op(Op.CLONE, e.input((n, h, w, c)))
    y = e.op(Op.RELU, y) if e.rng.random() < 0.5 else y
    py = e.op(Op.PERMUTE, y, attrs=PermuteAttrs((0, 3, 1, 2)))
    x = e.input((n, c, h, w))
    op = e.pick(Op.ADD, Op.MUL)
    return e.graph(e.op(op, x, py) if e.rng.random() < 0.5 else e.op(op, py, x))


def _identity_move(e: Example) -> Graph:
    x = e.input(e.dims())
    shape = x.type.shape
    op = e.rng.choice((Op.VIEW, Op.EXPAND))
    attrs = ShapeAttrs(shape)
    return e.graph(e.op(op, x, attrs=attrs))


def _scaled_self(numbers: tuple[float, ...]):
    def build(e: Example) -> Graph:
        x = e.input(e.dims())
        return e.graph(e.op(Op.ADD, e.op(Op.MUL, x, e.number(e.pick(*numbers))), x))
    return build


def _factor(e: Example) -> Graph:
    x = e.input(e.dims(2))
    a = e.pick(lambda: e.number(1.5), lambda: e.weight(x.type.shape[1:]))
    b = e.pick(lambda: e.number(-0.25), lambda: e.input(x.type.shape))
    return e.graph(e.op(Op.ADD, e.op(Op.MUL, x, a), e.op(Op.MUL, b, x)))


def _divide_by(*numbers: float):
    def build(e: Example) -> Graph:
        x = e.input(e.dims())
        return e.graph(e.op(Op.DIV, x, e.number(e.pick(*numbers)), attrs=DivAttrs(None)))
    return build


def _gelu_tanh_written_out(e: Example) -> Graph:
    """HF's gelu_new, operands in either order, constants as numbers or fills."""
    x = e.input(e.dims())

    def mul(a: Value, b: Value) -> Value:
        return e.op(Op.MUL, *e.pick((a, b), (b, a)))

    def add(a: Value, b: Value) -> Value:
        return e.op(Op.ADD, *e.pick((a, b), (b, a)))

    cube = e.op(Op.POW, x, e.number(e.pick(3, 3.0)))
    inner = add(x, mul(cube, e.number(0.044715)))
    t = e.op(Op.TANH, mul(inner, e.number(e.pick(0.7978845608028654, 0.7978845608))))
    return e.graph(mul(mul(x, _ones_like(e, x, 0.5)), add(t, _ones_like(e, x, 1.0))))


def _broadcast_regroup(e: Example) -> Graph:
    m, n = e.dims(2, 2, 5)
    s1 = e.pick(lambda: e.weight((n,)), lambda: e.input((n,)))
    s2 = e.pick(lambda: e.weight((1, n)), lambda: e.input((n,)))
    left = e.op(Op.ADD, e.input((m, n)), s1)
    return e.graph(e.op(Op.ADD, left, e.op(Op.ADD, e.input((m, n)), s2)))


def _mm_add(e: Example) -> Graph:
    m, k, n = e.dims(3)
    y = e.op(Op.MM, e.input((m, k)), e.pick(lambda: e.input((k, n)),
                                            lambda: _linear_weight(e, k, n)))
    return e.graph(e.op(Op.ADD, y, e.pick(lambda: e.weight((n,)), lambda: e.input((m, n)))))


def _addmm_view_residual(e: Example) -> Graph:
    """view(addmm(b, x, W)) + r, the view to [2, m, n] or [1, 2m, n], the bias a row or a
    matrix, the residual either operand."""
    m, k, n = e.dims(3)
    bias = e.pick(lambda: e.weight((n,)), lambda: e.input((2 * m, n)))
    y = e.op(Op.ADDMM, bias, e.input((2 * m, k)), _linear_weight(e, k, n),
             attrs=AddmmAttrs(1, 1))
    y = e.op(Op.VIEW, y, attrs=ShapeAttrs(e.pick((2, m, n), (1, 2 * m, n))))
    r = e.input(y.type.shape)
    return e.graph(e.pick(lambda: e.op(Op.ADD, y, r), lambda: e.op(Op.ADD, r, y)))


def _column_scale(e: Example) -> Graph:
    """view(addmm(b, x, W)) * g, g a weight per column ([n] or [1, 1, n]), either order."""
    m, k, n = e.dims(3)
    y = e.op(Op.ADDMM, e.weight((n,)), e.input((2 * m, k)), _linear_weight(e, k, n),
             attrs=AddmmAttrs(1, 1))
    y = e.op(Op.VIEW, y, attrs=ShapeAttrs((2, m, n)))
    g = e.weight(e.pick((n,), (1, 1, n)))
    return e.graph(e.pick(lambda: e.op(Op.MUL, y, g), lambda: e.op(Op.MUL, g, y)))


def _hardswish_written_out(e: Example) -> Graph:
    """x * clamp(x + 3, 0, 6) / 6, as capture writes hardswish; the product either way."""
    x = e.input(e.dims())
    gate = e.op(Op.CLAMP, e.op(Op.ADD, x, e.number(e.pick(3, 3.0))), attrs=ClampAttrs(0, 6))
    product = e.op(Op.MUL, *e.pick((x, gate), (gate, x)))
    return e.graph(e.op(Op.DIV, product, e.number(e.pick(6, 6.0)), attrs=DivAttrs(None)))


def _skip_copy(op: Op):
    def build(e: Example) -> Graph:
        m, k, n = e.dims(3)
        batch = (e.rng.randint(1, 3),) if op is Op.BMM else ()
        rank = len(batch) + 2
        flip = tuple(range(rank - 2)) + (rank - 1, rank - 2)
        x = e.op(Op.CLONE, e.op(Op.PERMUTE, e.input(batch + (k, m)), attrs=PermuteAttrs(flip)))
        w = e.input(batch + (k, n))
        if op is Op.ADDMM:
            return e.graph(e.op(Op.ADDMM, e.weight((n,)), x, w, attrs=AddmmAttrs(1, 1)))
        return e.graph(e.op(op, x, w))
    return build


def _clone_dense(e: Example) -> Graph:
    """A copy of a GEMM's result (or an elementwise op of it, or a reshape), read by an op."""
    m, k, n = e.dims(3, 2, 5)
    v = e.op(Op.MM, e.input((m, k)), e.input((k, n)))
    v = e.pick(lambda: v, lambda: e.op(Op.ADD, v, e.weight((n,))),
               lambda: e.op(Op.VIEW, v, attrs=ShapeAttrs((m * n,))))
    return e.graph(e.op(Op.RELU, e.op(Op.CLONE, v)))


def _conv_bn(e: Example) -> Graph:
    kernel = e.pick(1, 3)
    y = _conv(e, _image(e), e.rng.randint(1, 5), kernel, e.rng.random() < 0.5,
              e.pick(1, 2), kernel // 2)
    return e.graph(_batch_norm(e, y))


def _linear_bn(e: Example) -> Graph:
    x = e.input((e.rng.randint(1, 4), e.rng.randint(1, 6)))
    return e.graph(_batch_norm(e, _addmm(e, x, e.rng.randint(1, 6))))


def _mm_bn(e: Example) -> Graph:
    """A linear without bias, then a batch norm (LeViT's)."""
    x = e.input((e.rng.randint(1, 4), e.rng.randint(1, 6)))
    w = _linear_weight(e, x.type.shape[1], e.rng.randint(1, 6))
    return e.graph(_batch_norm(e, e.op(Op.MM, x, w)))


def _conv_bias(e: Example) -> Graph:
    c = e.rng.randint(1, 5)
    y = _conv(e, _image(e), c, e.pick(1, 3), False)
    return e.graph(e.op(Op.ADD, y, e.weight(e.rng.choice(((c, 1, 1), (1, c, 1, 1))))))


def _conv_squeeze_bias(e: Example) -> Graph:
    c = e.rng.randint(1, 5)
    x = e.input((e.rng.randint(2, 3), e.rng.randint(1, 4), 1, e.rng.randint(3, 8)))
    y = _conv(e, x, c, 1, False)
    squeezed = e.op(Op.SQUEEZE, y, attrs=SqueezeAttrs((2,)))
    return e.graph(e.op(Op.ADD, squeezed, e.weight((c, 1))))


def _scale_sink(e: Example) -> Graph:
    a, b = e.dims(2)
    y = e.input((a, b))
    move = e.pick(lambda: e.op(Op.VIEW, y, attrs=ShapeAttrs((a * b,))),
                  lambda: e.op(Op.PERMUTE, y, attrs=PermuteAttrs((1, 0))),
                  lambda: e.op(Op.EXPAND, y, attrs=ShapeAttrs((3, a, b))),
                  lambda: e.op(Op.UNSQUEEZE, y, attrs=DimAttrs(0)))
    return e.graph(e.op(Op.MUL, move, e.number(e.pick(0.125, 0.3, -2.0))))


def _scale_into_matmul(e: Example) -> Graph:
    m, k, n = e.dims(3, 1, 6)
    if e.rng.random() < 0.5:
        y = e.op(Op.MM, e.input((m, k)), e.pick(lambda: e.input((k, n)),
                                                lambda: _linear_weight(e, k, n)))
    else:
        batch = e.rng.randint(1, 3)
        y = e.op(Op.BMM, e.input((batch, m, k)), e.input((batch, k, n)))
    return e.graph(e.op(Op.MUL, y, e.number(e.pick(0.125, 0.7))))


def _scale_into_addmm(e: Example) -> Graph:
    x = e.input(e.dims(2))
    return e.graph(e.op(Op.MUL, _addmm(e, x, e.rng.randint(1, 5)), e.number(e.pick(0.25, 0.3))))


def _mm(e: Example, x: Value, n: int) -> Value:
    k = x.type.shape[1]
    return e.op(Op.MM, x, e.pick(lambda: _linear_weight(e, k, n), lambda: e.input((k, n))))


def _gemm_act(gemm: Callable[[Example, Value, int], Value], through_view: bool
              ) -> Callable[[Example], Graph]:
    """act(gemm(x)), or act(view(gemm(x))) to [2, m, n]."""
    def make(e: Example) -> Graph:
        if not through_view:
            return e.graph(_activation(e, gemm(e, e.input(e.dims(2)), e.rng.randint(1, 5))))
        m, n = e.rng.randint(1, 4), e.rng.randint(1, 5)
        y = gemm(e, e.input((m * 2, e.rng.randint(1, 5))), n)
        return e.graph(_activation(e, e.op(Op.VIEW, y, attrs=ShapeAttrs((2, m, n)))))
    return make


def _conv_residual(e: Example) -> Graph:
    y = _conv(e, _image(e), e.rng.randint(1, 4), e.pick(1, 3), e.rng.random() < 0.5,
              padding=1)
    r = e.input(y.type.shape)
    return e.graph(e.pick(lambda: e.op(Op.ADD, y, r), lambda: e.op(Op.ADD, r, y)))


def _conv_act(e: Example) -> Graph:
    y = _conv(e, _image(e), e.rng.randint(1, 4), e.pick(1, 3), e.rng.random() < 0.5, padding=1)
    return e.graph(_activation(e, y))


def _conv_view_act(e: Example) -> Graph:
    """A 1-d convolution run as a 2-d one over a row (`kiln.passes.conv1d`), or a flattened
    2-d one (a ViT's patch embedding)."""
    x = _image(e)
    if e.rng.random() < 0.5:
        x = e.input((x.type.shape[0], x.type.shape[1], 1, x.type.shape[3]))
    y = _conv(e, x, e.rng.randint(1, 4), 1, e.rng.random() < 0.5)
    n, c, h, w = y.type.shape
    view = e.op(Op.VIEW, y, attrs=ShapeAttrs((n, c, h * w)))
    return e.graph(_activation(e, view))


def _conv_act_epilogue(e: Example) -> Graph:
    x = _image(e)
    c = e.rng.randint(1, 4)
    w = e.weight((c, x.type.shape[1], 3, 3))
    b = e.weight((c,))
    r = e.input((x.type.shape[0], c, x.type.shape[2], x.type.shape[3]))
    attrs = ConvActAttrs((1, 1), (1, 1), (1, 1), 1, True, True, None, ())
    return e.graph(_activation(e, e.op(Op.CONV_ACT, x, w, b, r, attrs=attrs)))


def _parallel_addmm(e: Example) -> Graph:
    x = e.input(e.dims(2))
    outs = [_addmm(e, x, e.rng.randint(1, 5)) for _ in range(e.rng.randint(2, 4))]
    if e.rng.random() < 0.5:  # a view downstream, as attention's head split has
        outs[0] = e.op(Op.VIEW, outs[0], attrs=ShapeAttrs((1,) + outs[0].type.shape))
    return e.graph(*outs)


def _parallel_mm(e: Example) -> Graph:
    x = e.input(e.dims(2))
    k = x.type.shape[1]
    outs = [e.op(Op.MM, x, _linear_weight(e, k, e.rng.randint(1, 5)))
            for _ in range(e.rng.randint(2, 4))]
    if e.rng.random() < 0.5:  # a view downstream, as attention's head split has
        outs[0] = e.op(Op.VIEW, outs[0], attrs=ShapeAttrs((1,) + outs[0].type.shape))
    return e.graph(*outs)


def _parallel_conv(e: Example) -> Graph:
    x = _image(e)
    kernel = e.pick(1, 3)
    bias = e.rng.random() < 0.5
    outs = [_conv(e, x, e.rng.randint(1, 4), kernel, bias, padding=kernel // 2)
            for _ in range(e.rng.randint(2, 3))]
    return e.graph(*outs)


def _grouped_conv(e: Example) -> Graph:
    """2 to 8 narrow groups (2-8 channels each), as a convolution or a fused conv_act with a
    bias and a residual."""
    groups, width, rows = e.pick(2, 4, 8), e.rng.randint(2, 8), e.rng.randint(1, 3)
    x = e.input((1, groups * width, e.rng.randint(3, 6), e.rng.randint(3, 6)))
    kernel, stride = e.pick(1, 3), e.pick(1, 2)
    w = e.weight((groups * rows, width, kernel, kernel))
    geometry = ((stride, stride), (kernel // 2, kernel // 2), (1, 1))
    if e.rng.random() < 0.5:
        return e.graph(e.op(Op.CONVOLUTION, x, w,
                            attrs=ConvAttrs(*geometry, False, (0, 0), groups)))
    out = ((x.type.shape[2] - 1) // stride + 1, (x.type.shape[3] - 1) // stride + 1)
    residual = e.input((1, groups * rows, *out))
    return e.graph(e.op(Op.CONV_ACT, x, w, e.weight((groups * rows,)), residual,
                        attrs=ConvActAttrs(*geometry, groups, True, True, Op.RELU)))


EXAMPLES: dict[str, Callable[[Example], Graph]] = {
    "mul-one": _binary_example(Op.MUL, 1.0),
    "div-one": _binary_example(Op.DIV, 1.0, swap=False),
    "pow-one": lambda e: e.graph(e.op(Op.POW, e.input(e.dims()), e.number(1))),
    "add-neg-zero": _binary_example(Op.ADD, -0.0),
    "add-zero-int": _binary_example(Op.ADD, 0, I64),
    "add-zero": _binary_example(Op.ADD, 0.0),
    "softmax-add-zero": _softmax_of_zero_sum(Op.SOFTMAX),
    "log_softmax-add-zero": _softmax_of_zero_sum(Op.LOG_SOFTMAX),
    "sub-zero": _binary_example(Op.SUB, 0.0, swap=False),
    "mul-zero-int": _binary_example(Op.MUL, 0, I64),
    "mul-zero": _binary_example(Op.MUL, 0.0),
    "relu-relu": _twice(Op.RELU),
    "neg-neg": _twice(Op.NEG),
    "permute-identity": lambda e: e.graph(e.op(Op.PERMUTE, e.input(e.dims(3)),
                                               attrs=PermuteAttrs((0, 1, 2)))),
    "view-identity": _identity_move,
    "permute-permute": _permute_permute,
    "permute-sink": _permute_sink,
    "permute-sink.unary": _permute_sink_unary,
    "permute-hoist": _permute_hoist,
    "reshape-chain": _reshape_chain,
    "expand-expand": lambda e: e.graph(e.op(
        Op.EXPAND, e.op(Op.EXPAND, e.input((1, 3)), attrs=ShapeAttrs((2, 3))),
        attrs=ShapeAttrs((4, 2, 3)))),
    "view-skip-copy": lambda e: e.graph(e.op(
        Op.VIEW, e.op(Op.CLONE, e.op(Op.PERMUTE, e.op(Op.RELU, e.input((2, 3, 4))),
                                     attrs=PermuteAttrs((0, 2, 1)))),
        attrs=ShapeAttrs((8, 3)))),
    "permute-skip-copy": lambda e: e.graph(e.op(
        Op.PERMUTE, e.op(Op.CLONE, e.op(Op.PERMUTE, e.op(Op.RELU, e.input((2, 3, 4))),
                                        attrs=PermuteAttrs((0, 2, 1)))),
        attrs=PermuteAttrs(e.pick((0, 2, 1), (2, 0, 1))))),
    "cat-skip-copy": lambda e: _cat_of_copy(e, first=True),
    "cat-skip-copy.second": lambda e: _cat_of_copy(e, first=False),
    "clone-clone": _twice(Op.CLONE),
    "clone-dense": _clone_dense,
    "add-self": lambda e: (lambda x: e.graph(e.op(Op.ADD, x, x)))(
        e.input(e.dims(), e.pick(F32, I64))),
    "add-scaled-self-pow2": _scaled_self((1, 2, 4.0, 1024)),
    "add-scaled-self": _scaled_self((0.3, 3.0, -1.5)),
    "factor-common": _factor,
    "div-const-pow2": _divide_by(2, 0.5, -4.0, 1024.0),
    "div-const": _divide_by(3.0, 0.7, -10),
    "add-add-const": _chain(Op.ADD, Op.ADD),
    "mul-mul-const": _chain(Op.MUL, Op.MUL),
    "sub-sub-const": _chain(Op.SUB, Op.SUB),
    "div-div-const": _chain(Op.DIV, Op.DIV),
    "broadcast-regroup": _broadcast_regroup,
    "gelu-tanh-idiom": _gelu_tanh_written_out,
    "hardswish-idiom": _hardswish_written_out,
    "mm-add-to-addmm": _mm_add,
    "addmm-view-residual": _addmm_view_residual,
    "mm-skip-copy": _skip_copy(Op.MM),
    "addmm-skip-copy": _skip_copy(Op.ADDMM),
    "bmm-skip-copy": _skip_copy(Op.BMM),
    "conv-bn": _conv_bn,
    "linear-bn": _linear_bn,
    "mm-bn": _mm_bn,
    "conv-bias": _conv_bias,
    "conv-squeeze-bias": _conv_squeeze_bias,
    "scale-sink": _scale_sink,
    "scale-into-matmul": _scale_into_matmul,
    "scale-into-addmm": _scale_into_addmm,
    "column-scale-into-addmm": _column_scale,
    "addmm-act": _gemm_act(_addmm, False),
    "addmm-view-act": _gemm_act(_addmm, True),
    "mm-act": _gemm_act(_mm, False),
    "mm-view-act": _gemm_act(_mm, True),
    "conv-residual": _conv_residual,
    "conv-act": _conv_act,
    "conv-view-act": _conv_view_act,
    "conv-act-epilogue": _conv_act_epilogue,
    "merge-parallel-addmm": _parallel_addmm,
    "merge-parallel-mm": _parallel_mm,
    "merge-parallel-conv": _parallel_conv,
    "conv-regroup": _grouped_conv,
}
