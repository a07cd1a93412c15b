"""Makers for the contractions and their neighbours: matmuls, convolutions (with fused
epilogues), embeddings and pooling. Weights are constants more often here: the rules that fold
batch norms and biases into weights, and the prepacked library kernels, want them."""

from __future__ import annotations

from kiln.fuzz.generate import FLOATS, Draft
from kiln.fuzz.makers import activation_args, is_float, tensor_type
from kiln.fuzz.values import index_values
from kiln.ir import attrs as A
from kiln.ir.fused import ACTIVATIONS
from kiln.ir.graph import Value
from kiln.ir.infer import infer_types
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType

_GEMM_DTYPES = (DType.F32, DType.F32, DType.F32, DType.F64, DType.BF16)


def weight(d: Draft, shape: tuple[int, ...], dtype: DType, transposed: bool = False) -> Value:
    """A matrix operand: a pool value, a new weight or input, or a transposed one."""
    if transposed and len(shape) == 2:
        w = d.source(TensorType((shape[1], shape[0]), dtype), constant=0.6)
        return d.emit1(Op.PERMUTE, w, attrs=A.PermuteAttrs((1, 0)))
    return d.operand(lambda v: v.type == TensorType(shape, dtype),
                     lambda: TensorType(shape, dtype), fresh=0.7) \
        if d.rng.random() < 0.4 else d.source(TensorType(shape, dtype), constant=0.6)


def gemm_operands(d: Draft, batch: bool = False) -> tuple[Value, Value]:
    rank = 3 if batch else 2
    x = d.operand(lambda v: v.type.rank == rank and v.type.dtype in _GEMM_DTYPES,
                  tensor_type(d, _GEMM_DTYPES, rank))
    k = x.type.shape[-1]
    m = d.dim()
    shape = (x.type.shape[0], k, m) if batch else (k, m)
    return x, weight(d, shape, x.type.dtype, transposed=d.rng.random() < 0.3)


def make_mm(d: Draft, op: Op) -> None:
    x, w = gemm_operands(d, batch=op is Op.BMM)
    d.emit1(op, x, w)


def gemm_bias(d: Draft, n: int, m: int, dtype: DType) -> Value:
    shape = d.rng.choice(((m,), (m,), (1, m), (n, m), (n, 1), (), (1,)))
    return d.source(TensorType(shape, dtype), constant=0.6)


def make_addmm(d: Draft, op: Op) -> None:
    x, w = gemm_operands(d)
    bias = gemm_bias(d, x.type.shape[0], w.type.shape[1], x.type.dtype)
    beta, alpha = (1, 1) if d.rng.random() < 0.6 else (d.rng.choice((0, 2, 0.5, -1, 1.0)),
                                                       d.rng.choice((1, 0, 2, 0.5)))
    if op is Op.ADDMM:
        d.emit1(op, bias, x, w, attrs=A.AddmmAttrs(beta, alpha))
        return
    act = d.rng.choice(sorted(ACTIVATIONS, key=lambda a: a.text))
    attrs = A.AddmmActAttrs(act, activation_args(d, act, x.type.dtype), beta, alpha)
    d.emit1(op, bias, x, w, attrs=attrs)


def conv_operands(d: Draft, spatial: int, transposed: bool
                  ) -> tuple[Value, Value, A.ConvAttrs]:
    rng = d.rng
    x = d.operand(lambda v: v.type.rank == spatial + 2 and v.type.dtype in (DType.F32,
                                                                            DType.F64)
                  and v.type.shape[1] > 0,
                  lambda: TensorType((rng.choice((1, 1, 2)), rng.choice((1, 2, 3, 4)),
                                      *(rng.randint(1, 7) for _ in range(spatial))),
                                     rng.choice((DType.F32, DType.F32, DType.F64))))
    cin = x.type.shape[1]
    groups = rng.choice([g for g in (1, 2, 3, 4) if cin % g == 0])
    cout = groups * rng.choice((1, 2, 3))
    kernel = tuple(rng.choice((1, 1, 2, 3)) for _ in range(spatial))
    stride = tuple(rng.choice((1, 1, 2)) for _ in range(spatial))
    padding = tuple(rng.choice((0, 0, 1, 2)) for _ in range(spatial))
    dilation = tuple(rng.choice((1, 1, 2)) for _ in range(spatial))
    output_padding = tuple(rng.randrange(max(s, dl)) if transposed else 0
                           for s, dl in zip(stride, dilation))
    wshape = (cin, cout // groups, *kernel) if transposed else (cout, cin // groups, *kernel)
    w = d.source(TensorType(wshape, x.type.dtype), constant=0.6)
    attrs = A.ConvAttrs(stride, padding, dilation, transposed, output_padding, groups)
    return x, w, attrs


def make_convolution(d: Draft, op: Op) -> None:
    spatial = d.rng.choice((1, 2, 2, 2, 3))
    transposed = d.rng.random() < 0.2
    x, w, attrs = conv_operands(d, spatial, transposed)
    cout = w.type.shape[1] * attrs.groups if transposed else w.type.shape[0]
    operands = [x, w]
    if d.rng.random() < 0.5:
        operands.append(d.source(TensorType((cout,), x.type.dtype), constant=0.6))
    d.emit1(op, *operands, attrs=attrs)


def make_conv_act(d: Draft, op: Op) -> None:
    x, w, conv = conv_operands(d, 2, False)
    operands = [x, w]
    has_bias = d.rng.random() < 0.6
    if has_bias:
        operands.append(d.source(TensorType((w.type.shape[0],), x.type.dtype), constant=0.6))
    (out,) = infer_types(Op.CONVOLUTION, conv, operands)
    has_residual = d.rng.random() < 0.5
    if has_residual:
        operands.append(d.operand(lambda v: v.type == out, lambda: out))
    act = d.rng.choice([None, *sorted(ACTIVATIONS, key=lambda a: a.text)])
    args = activation_args(d, act, out.dtype) if act is not None else ()
    attrs = A.ConvActAttrs(conv.stride, conv.padding, conv.dilation, conv.groups, has_bias,
                           has_residual, act, args)
    d.emit1(op, *operands, attrs=attrs)


def make_embedding(d: Draft, op: Op) -> None:
    table = d.operand(lambda v: v.type.rank == 2 and is_float(v) and v.type.shape[0] > 0,
                      lambda: TensorType((d.rng.randint(1, 9), d.dim()), d.dtype(FLOATS)))
    t = TensorType(d.shape(d.rng.randint(0, 2)), d.rng.choice((DType.I64, DType.I32)))
    indices = d.source(t, index_values(t, table.type.shape[0], d.gen), constant=0.3)
    d.emit1(op, table, indices)


def pool_input(d: Draft) -> Value:
    return d.operand(lambda v: v.type.rank in (3, 4) and v.type.dtype in (DType.F32, DType.F64),
                     lambda: TensorType((*((1,) if d.rng.random() < 0.5 else ()),
                                         d.rng.randint(1, 3), d.rng.randint(1, 9),
                                         d.rng.randint(1, 9)), d.dtype((DType.F32, DType.F64))))


def make_pool(d: Draft, op: Op) -> None:
    rng = d.rng
    x = pool_input(d)
    kernel = (rng.randint(1, 3), rng.randint(1, 3))
    stride = () if rng.random() < 0.2 else (rng.randint(1, 3), rng.randint(1, 3))
    padding = tuple(rng.randint(0, k // 2) for k in kernel)
    ceil_mode = rng.random() < 0.3
    if op is Op.MAX_POOL2D:
        dilation = (rng.choice((1, 1, 2)), rng.choice((1, 1, 2)))
        d.emit(op, x, attrs=A.MaxPoolAttrs(kernel, stride, padding, dilation, ceil_mode))
    else:
        divisor = rng.choice((None, None, 1, 3))
        d.emit1(op, x, attrs=A.AvgPoolAttrs(kernel, stride, padding, ceil_mode,
                                            rng.random() < 0.5, divisor))


def make_adaptive_pool(d: Draft, op: Op) -> None:
    x = pool_input(d)
    d.emit1(op, x, attrs=A.AdaptivePoolAttrs((d.rng.randint(1, 4), d.rng.randint(1, 4))))
