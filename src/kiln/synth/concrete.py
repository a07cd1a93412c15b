"""Concrete semantics of kiln ops for the prover: tensors of z3 values on small shapes.

A tensor is a numpy array of dtype object whose elements are z3 expressions; the movement
ops (view, permute, cat, split, ...) move those expressions exactly as ATen moves values,
and the arithmetic is delegated to a `Domain`, which says what one element operation means:

    RealDomain   elements are z3 Reals (kiln.synth.prove.prove_real, check_axioms)
    FloatDomain  elements are z3 Float32 values, RNE (kiln.synth.fp, bit-exactness)

    x: (2, 3) of Reals x_0_0 .. x_1_2,  w: (3, 2)
    evaluate((mm ?x ?w))  ->  [[x_0_0*w_0_0 + x_0_1*w_1_0 + x_0_2*w_2_0, ...], ...]

Real semantics: +, -, *, / are the field operations; relu, abs, maximum, minimum, clamp,
leaky_relu, where and the comparisons are `If`s; floor/ceil go through ToInt; rsqrt, sqrt
and log are functions pinned down where they are defined (r > 0 and r*r*a = 1 for
rsqrt(a), a > 0), and the domain records those definedness conditions (a divisor is not 0,
rsqrt's argument is positive, ...) as `assumptions`: a proof over reals holds wherever
both sides are defined. exp, tanh, sigmoid, erf, gelu, sin and cos are opaque functions of
one real (`opaque` names them): an equality proven with them holds for every function, a
difference found with them may not be a real one.

An op, attribute or dtype the model does not cover raises `Unsupported` with the reason.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import z3

from kiln.ir.attrs import attrs_class_of
from kiln.ir.ops import Op, OpGroup
from kiln.ir.types import DType
from kiln.rewrite.law import App, AttrFn, AttrFnKind, Lit, PVar, Term
from kiln.synth.instance import apply_attr_fn

Tensor = np.ndarray  # dtype object, elements are z3 expressions


class Unsupported(Exception):
    """An op, attribute, dtype or condition outside what the prover models."""


def scalar(element: Any) -> Tensor:
    """A 0-d tensor holding one element."""
    out = np.empty((), dtype=object)
    out[()] = element
    return out


def elementwise(fn: Callable[..., Any], *tensors: Tensor) -> Tensor:
    """fn applied element by element, with ATen/numpy broadcasting."""
    result = np.frompyfunc(fn, len(tensors), 1)(*tensors)
    return result if isinstance(result, np.ndarray) else scalar(result)


# --- element domains -------------------------------------------------------------------------

class Domain:
    """What one element operation means. Subclasses fill `unary`/`binary` tables."""

    name = "abstract"

    def __init__(self) -> None:
        self.assumptions: list[z3.BoolRef] = []  # where the sides are defined
        self.opaque: set[str] = set()  # functions left uninterpreted

    def var(self, name: str) -> Any:
        raise NotImplementedError

    def const(self, value: bool | int | float) -> Any:
        raise NotImplementedError

    def apply(self, op: Op, attrs: Any, *args: Any) -> Any:
        raise NotImplementedError

    def sum(self, terms: Sequence[Any]) -> Any:
        raise Unsupported(f"sums (contractions, reductions) are not modelled in {self.name}")

    def same(self, a: Any, b: Any) -> z3.BoolRef:
        return a == b

    def solver(self, time_limit_s: float) -> z3.Solver:
        solver = z3.Solver()
        solver.set("timeout", max(1, int(time_limit_s * 1000)))
        return solver

    def show(self, model: z3.ModelRef, element: Any) -> str:
        raise NotImplementedError


def _real_if(cond: z3.BoolRef, a: Any, b: Any) -> Any:
    return z3.If(cond, a, b)


class RealDomain(Domain):
    """Elements are z3 Reals: the semantics over real numbers (see the module docstring)."""

    name = "reals"
    OPAQUE = {Op.EXP: "exp", Op.TANH: "tanh", Op.SIGMOID: "sigmoid", Op.ERF: "erf",
              Op.SIN: "sin", Op.COS: "cos", Op.GELU: "gelu"}

    def __init__(self) -> None:
        super().__init__()
        self._functions: dict[str, z3.FuncDeclRef] = {}

    def var(self, name: str) -> Any:
        return z3.Real(name)

    def const(self, value: bool | int | float) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            raise Unsupported(f"the number {value!r} has no value in the reals")
        return z3.RealVal(int(value) if isinstance(value, bool) else value)

    def function(self, name: str) -> z3.FuncDeclRef:
        if name not in self._functions:
            self._functions[name] = z3.Function(name, z3.RealSort(), z3.RealSort())
        return self._functions[name]

    def sum(self, terms: Sequence[Any]) -> Any:
        return z3.Sum(list(terms)) if terms else z3.RealVal(0)

    def divide(self, a: Any, b: Any) -> Any:
        self.assumptions.append(b != 0)
        return a / b

    def rsqrt(self, a: Any) -> Any:
        r = self.function("rsqrt")(a)
        self.assumptions += [a > 0, r > 0, r * r * a == 1]
        return r

    def sqrt(self, a: Any) -> Any:
        s = self.function("sqrt")(a)
        self.assumptions += [a >= 0, s >= 0, s * s == a]
        return s

    def apply(self, op: Op, attrs: Any, *args: Any) -> Any:
        if op in self.OPAQUE:
            name = self.OPAQUE[op]
            if op is Op.GELU:
                name += f"_{attrs.approximate}"
            self.opaque.add(name)
            return self.function(name)(args[0])
        if op in _REAL_UNARY:
            return _REAL_UNARY[op](self, attrs, args[0])
        if op in _REAL_BINARY:
            return _REAL_BINARY[op](self, attrs, *args)
        if op is Op.WHERE:
            return z3.If(args[0] != 0, args[1], args[2])
        raise Unsupported(f"{op.text} is not modelled over the reals")

    def show(self, model: z3.ModelRef, element: Any) -> str:
        value = model.eval(element, model_completion=True)
        if z3.is_rational_value(value):
            frac = value.as_fraction()
            return str(frac.numerator) if frac.denominator == 1 else \
                f"{frac.numerator}/{frac.denominator}"
        if z3.is_algebraic_value(value):
            return value.as_decimal(6)
        return str(value)


def _real_div(d: RealDomain, attrs: Any, a: Any, b: Any) -> Any:
    if attrs is not None and getattr(attrs, "rounding_mode", None) is not None:
        raise Unsupported(f"div with rounding_mode={attrs.rounding_mode!r} (integer rounding "
                          "differs from real division)")
    return d.divide(a, b)


def _real_pow(d: RealDomain, attrs: Any, a: Any, b: Any) -> Any:
    if z3.is_rational_value(b) and b.as_fraction().denominator == 1 \
            and 0 <= b.as_fraction().numerator <= 8:
        result: Any = z3.RealVal(1)
        for _ in range(b.as_fraction().numerator):
            result = result * a
        return z3.simplify(result) if b.as_fraction().numerator == 0 else result
    raise Unsupported("pow is modelled only with a literal exponent 0..8")


def _floor(a: Any) -> Any:
    return z3.ToReal(z3.ToInt(a))


def _clamp(attrs: Any, a: Any) -> Any:
    lo, hi = attrs.min, attrs.max
    if lo is not None:
        a = z3.If(a < lo, z3.RealVal(lo), a)
    if hi is not None:
        a = z3.If(a > hi, z3.RealVal(hi), a)
    return a


def _truth(cond: z3.BoolRef) -> Any:
    return z3.If(cond, z3.RealVal(1), z3.RealVal(0))


_REAL_UNARY: dict[Op, Callable[[RealDomain, Any, Any], Any]] = {
    Op.NEG: lambda d, at, a: -a,
    Op.ABS: lambda d, at, a: z3.If(a >= 0, a, -a),
    Op.RELU: lambda d, at, a: z3.If(a > 0, a, z3.RealVal(0)),
    Op.LEAKY_RELU: lambda d, at, a: z3.If(a > 0, a, a * z3.RealVal(at.negative_slope)),
    Op.CLAMP: lambda d, at, a: _clamp(at, a),
    Op.HARDSWISH: lambda d, at, a: a * z3.If(a + 3 < 0, z3.RealVal(0),
                                             z3.If(a + 3 > 6, z3.RealVal(6), a + 3)) / 6,
    Op.RECIPROCAL: lambda d, at, a: d.divide(z3.RealVal(1), a),
    Op.RSQRT: lambda d, at, a: d.rsqrt(a),
    Op.SQRT: lambda d, at, a: d.sqrt(a),
    Op.FLOOR: lambda d, at, a: _floor(a),
    Op.CEIL: lambda d, at, a: -_floor(-a),
    Op.LOGICAL_NOT: lambda d, at, a: _truth(a == 0),
}

_REAL_BINARY: dict[Op, Callable[[RealDomain, Any, Any, Any], Any]] = {
    Op.ADD: lambda d, at, a, b: a + b,
    Op.SUB: lambda d, at, a, b: a - b,
    Op.MUL: lambda d, at, a, b: a * b,
    Op.DIV: _real_div,
    Op.POW: _real_pow,
    Op.MAXIMUM: lambda d, at, a, b: z3.If(a >= b, a, b),
    Op.MINIMUM: lambda d, at, a, b: z3.If(a <= b, a, b),
    Op.EQ: lambda d, at, a, b: _truth(a == b),
    Op.NE: lambda d, at, a, b: _truth(a != b),
    Op.LT: lambda d, at, a, b: _truth(a < b),
    Op.LE: lambda d, at, a, b: _truth(a <= b),
    Op.GT: lambda d, at, a, b: _truth(a > b),
    Op.GE: lambda d, at, a, b: _truth(a >= b),
    Op.LOGICAL_AND: lambda d, at, a, b: _truth(z3.And(a != 0, b != 0)),
    Op.LOGICAL_OR: lambda d, at, a, b: _truth(z3.Or(a != 0, b != 0)),
}


# --- evaluating a law's terms ----------------------------------------------------------------

@dataclass
class Env:
    """Values of a law's variables: tensors and numbers as arrays, attributes as values."""

    domain: Domain
    tensors: dict[str, Tensor]
    numbers: dict[str, Tensor]
    attrs: Mapping[str, Any]
    dtypes: Mapping[str, DType] = field(default_factory=dict)  # of the tensor variables
    memo: dict[Term, list[Tensor]] = field(default_factory=dict)


def symbolic_tensor(domain: Domain, name: str, shape: Sequence[int]) -> Tensor:
    """A tensor of fresh domain variables named name_i_j..."""
    out = np.empty(tuple(shape), dtype=object)
    for index in itertools.product(*(range(n) for n in shape)):
        out[index] = domain.var("_".join([name, *map(str, index)]))
    return out


def evaluate(term: Term, env: Env) -> Tensor:
    """The value of ``term`` (one output of a multi-output op, as ``term.output`` says)."""
    if isinstance(term, PVar):
        return _variable(term.name, env)
    if isinstance(term, Lit):
        return scalar(env.domain.const(term.value))
    if isinstance(term, AttrFn):
        return _number_function(term, env)
    if term not in env.memo:
        args = [evaluate(a, env) for a in term.args]
        env.memo[term] = apply_op(term.op, resolve_attrs(term, env), args, env.domain)
    outputs = env.memo[term]
    if term.output >= len(outputs):
        raise Unsupported(f"{term.op.text} has no output {term.output}")
    return outputs[term.output]


def _variable(name: str, env: Env) -> Tensor:
    if name in env.tensors:
        return env.tensors[name]
    if name in env.numbers:
        return env.numbers[name]
    if name in env.attrs and isinstance(env.attrs[name], (bool, int, float)):
        return scalar(env.domain.const(env.attrs[name]))
    raise Unsupported(f"no value for ?{name}")


def _number_function(term: AttrFn, env: Env) -> Tensor:
    """(inverse ?c) and (plus-one ?c): numbers computed at compile time."""
    (arg,) = term.args
    value = evaluate(arg, env)
    one = scalar(env.domain.const(1))
    if term.kind is AttrFnKind.INVERSE:
        return elementwise(lambda a, b: env.domain.apply(Op.DIV, None, a, b), one, value)
    if term.kind is AttrFnKind.PLUS_ONE:
        return elementwise(lambda a, b: env.domain.apply(Op.ADD, None, a, b), value, one)
    raise Unsupported(f"{term.kind.value} is not a function of numbers")


def resolve_attrs(app: App, env: Env) -> Any:
    """The op's attribute object: values written in the law, ?variables looked up in the
    instance, attribute functions applied, the attrs class's defaults for the rest."""
    cls = attrs_class_of(app.op)
    if not dataclasses.is_dataclass(cls) or not dataclasses.fields(cls):
        return None
    given = {k: _attr_value(v, env) for k, v in app.attrs}
    for f in dataclasses.fields(cls):
        if f.name not in given and f.default is dataclasses.MISSING:
            raise Unsupported(f"{app.op.text} needs :{f.name}")
    return cls(**given)


def _attr_value(value: Any, env: Env) -> Any:
    if isinstance(value, PVar):
        if value.name not in env.attrs:
            raise Unsupported(f"no value for the attribute ?{value.name}")
        return env.attrs[value.name]
    if isinstance(value, AttrFn) and value.kind in _TYPE_FNS:
        name = value.args[0].name
        if name not in env.tensors:
            raise Unsupported(f"({value.kind.value} ?{name}) of a variable that is no tensor")
        return _TYPE_FNS[value.kind](env, name, *value.args[1:])
    if isinstance(value, AttrFn):
        return apply_attr_fn(value.kind, [_attr_value(a, env) for a in value.args])
    if isinstance(value, tuple):
        return tuple(_attr_value(v, env) for v in value)
    return value


_TYPE_FNS: dict[AttrFnKind, Callable[..., Any]] = {
    AttrFnKind.SHAPE_OF: lambda env, name: env.tensors[name].shape,
    AttrFnKind.SIZE: lambda env, name, dim: env.tensors[name].shape[dim],
    AttrFnKind.DTYPE_OF: lambda env, name: env.dtypes.get(name, DType.F32),
}


# --- ops on tensors --------------------------------------------------------------------------

def apply_op(op: Op, attrs: Any, args: list[Tensor], domain: Domain) -> list[Tensor]:
    """The outputs of ``op`` on ``args``."""
    if op in _TENSOR_OPS:
        out = _TENSOR_OPS[op](domain, attrs, *args)
        return out if isinstance(out, list) else [out]
    if op.is_a(OpGroup.ELEMENTWISE) and op is not Op.CAST:
        return [elementwise(lambda *xs: domain.apply(op, attrs, *xs), *args)]
    raise Unsupported(f"{op.text} is not modelled by the prover")


def _cast(domain: Domain, attrs: Any, x: Tensor) -> Tensor:
    if not attrs.dtype.is_floating:
        raise Unsupported(f"cast to {attrs.dtype.value} (rounding to integers)")
    return x


def _view(domain: Domain, attrs: Any, x: Tensor) -> Tensor:
    return x.reshape(attrs.shape)


def _expand(domain: Domain, attrs: Any, x: Tensor) -> Tensor:
    lead = len(attrs.shape) - x.ndim
    shape = tuple(x.shape[i - lead] if n == -1 else n for i, n in enumerate(attrs.shape))
    return np.broadcast_to(x, shape)


def _squeeze(domain: Domain, attrs: Any, x: Tensor) -> Tensor:
    dims = tuple(d % x.ndim for d in attrs.dims if x.ndim and x.shape[d % x.ndim] == 1)
    return np.squeeze(x, axis=dims) if dims else x


def _unsqueeze(domain: Domain, attrs: Any, x: Tensor) -> Tensor:
    return np.expand_dims(x, attrs.dim % (x.ndim + 1))


def _slice(domain: Domain, attrs: Any, x: Tensor) -> Tensor:
    index = [slice(None)] * x.ndim
    index[attrs.dim] = slice(attrs.start, attrs.end, attrs.step)
    return x[tuple(index)]


def _select(domain: Domain, attrs: Any, x: Tensor) -> Tensor:
    return np.take(x, attrs.index, axis=attrs.dim)


def _split(domain: Domain, attrs: Any, x: Tensor) -> list[Tensor]:
    dim = attrs.dim % x.ndim
    if sum(attrs.sizes) != x.shape[dim]:
        raise Unsupported(f"split sizes {attrs.sizes} do not add up to {x.shape[dim]}")
    cuts = list(itertools.accumulate(attrs.sizes))[:-1]
    return list(np.split(x, cuts, axis=dim))


def _cat(domain: Domain, attrs: Any, *xs: Tensor) -> Tensor:
    return np.concatenate(xs, axis=attrs.dim % xs[0].ndim)


def _full(domain: Domain, attrs: Any) -> Tensor:
    return np.full(attrs.shape, domain.const(attrs.value), dtype=object)


def _mm(domain: Domain, a: Tensor, b: Tensor) -> Tensor:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise Unsupported(f"mm of shapes {a.shape} and {b.shape}")
    out = np.empty((a.shape[0], b.shape[1]), dtype=object)
    for i, j in itertools.product(range(a.shape[0]), range(b.shape[1])):
        out[i, j] = domain.sum([a[i, k] * b[k, j] for k in range(a.shape[1])])
    return out


def _bmm(domain: Domain, attrs: Any, a: Tensor, b: Tensor) -> Tensor:
    return np.stack([_mm(domain, a[i], b[i]) for i in range(a.shape[0])])


def _addmm(domain: Domain, attrs: Any, bias: Tensor, x: Tensor, w: Tensor) -> Tensor:
    product = _mm(domain, x, w)
    return _scaled_sum(domain, bias, attrs.beta, product, attrs.alpha)


def _scaled_sum(domain: Domain, a: Tensor, alpha: Any, b: Tensor, beta: Any) -> Tensor:
    """alpha*a + beta*b, where a factor of 1 is left out (as ATen does)."""
    def term(t: Tensor, factor: Any) -> Tensor:
        if factor == 1:
            return t
        c = scalar(domain.const(factor))
        return elementwise(lambda u, v: domain.apply(Op.MUL, None, u, v), t, c)
    return elementwise(lambda u, v: domain.apply(Op.ADD, None, u, v), term(a, alpha),
                       term(b, beta))


def _convolution(domain: Domain, attrs: Any, x: Tensor, w: Tensor,
                 bias: Tensor | None = None) -> Tensor:
    if attrs.transposed:
        raise Unsupported("transposed convolution")
    return conv(domain, x, w, bias, attrs.stride, attrs.padding, attrs.dilation, attrs.groups)


def conv(domain: Domain, x: Tensor, w: Tensor, bias: Tensor | None, stride: Sequence[int],
         padding: Sequence[int], dilation: Sequence[int], groups: int) -> Tensor:
    """ATen's convolution (cross-correlation), 1-d or 2-d, with groups."""
    if len(stride) == 1:  # a 1-d convolution is a 2-d one of height 1
        out = conv(domain, x[:, :, None, :], w[:, :, None, :], bias, (1, stride[0]),
                   (0, padding[0]), (1, dilation[0]), groups)
        return out[:, :, 0, :]
    if len(stride) != 2 or x.ndim != 4:
        raise Unsupported(f"{len(stride)}-d convolution")
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.empty((n, o, oh, ow), dtype=object)
    for b, oc, i, j in itertools.product(range(n), range(o), range(oh), range(ow)):
        group = oc // (o // groups)
        terms = []
        for ic, p, q in itertools.product(range(cg), range(kh), range(kw)):
            y = i * stride[0] - padding[0] + p * dilation[0]
            z = j * stride[1] - padding[1] + q * dilation[1]
            if 0 <= y < h and 0 <= z < wd:
                terms.append(x[b, group * cg + ic, y, z] * w[oc, ic, p, q])
        out[b, oc, i, j] = domain.sum(terms)
    if bias is not None:
        channel = bias.reshape((1, o, 1, 1))
        out = elementwise(lambda u, v: domain.apply(Op.ADD, None, u, v), out, channel)
    return out


def _activation(domain: Domain, activation: Op | None, act_args: tuple[Any, ...],
                x: Tensor) -> Tensor:
    if activation is None:
        return x
    attrs = _ACT_ATTRS[activation](act_args) if activation in _ACT_ATTRS else None
    return elementwise(lambda a: domain.apply(activation, attrs, a), x)


def _act_attrs(op: Op) -> Callable[[tuple[Any, ...]], Any]:
    return lambda args: attrs_class_of(op)(*args)


_ACT_ATTRS = {op: _act_attrs(op) for op in (Op.GELU, Op.CLAMP, Op.LEAKY_RELU)}


def _addmm_act(domain: Domain, attrs: Any, bias: Tensor, x: Tensor, w: Tensor) -> Tensor:
    y = _scaled_sum(domain, bias, attrs.beta, _mm(domain, x, w), attrs.alpha)
    return _activation(domain, attrs.activation, attrs.act_args, y)


def _conv_act(domain: Domain, attrs: Any, x: Tensor, w: Tensor, *rest: Tensor) -> Tensor:
    expected = 2 + int(attrs.has_bias) + int(attrs.has_residual)
    if len(rest) + 2 != expected:
        raise Unsupported(f"conv_act with {len(rest) + 2} operands, expected {expected}")
    bias = rest[0] if attrs.has_bias else None
    y = conv(domain, x, w, bias, attrs.stride, attrs.padding, attrs.dilation, attrs.groups)
    if attrs.has_residual:
        y = elementwise(lambda u, v: domain.apply(Op.ADD, None, u, v), y, rest[-1])
    return _activation(domain, attrs.activation, attrs.act_args, y)


def _batch_norm(domain: Domain, attrs: Any, x: Tensor, gamma: Tensor, beta: Tensor,
                mean: Tensor, var: Tensor) -> Tensor:
    """(x - mean) * rsqrt(var + eps) * gamma + beta, per channel (dimension 1)."""
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)

    def channel(t: Tensor) -> Tensor:
        return t.reshape(shape)

    def op(o: Op, *ts: Tensor) -> Tensor:
        return elementwise(lambda *es: domain.apply(o, None, *es), *ts)

    eps = scalar(domain.const(attrs.eps))
    scale = op(Op.RSQRT, op(Op.ADD, channel(var), eps))
    centred = op(Op.SUB, x, channel(mean))
    return op(Op.ADD, op(Op.MUL, op(Op.MUL, centred, scale), channel(gamma)), channel(beta))


def _reduce(domain: Domain, attrs: Any, x: Tensor, mean: bool) -> Tensor:
    dims = tuple(range(x.ndim)) if attrs.dims is None else tuple(d % x.ndim for d in attrs.dims)
    moved = np.moveaxis(x, dims, tuple(range(-len(dims), 0)))
    kept = moved.shape[:moved.ndim - len(dims)]
    flat = moved.reshape(kept + (-1,))
    out = np.empty(kept, dtype=object)
    count = flat.shape[-1]
    for index in itertools.product(*(range(n) for n in kept)):
        total = domain.sum(list(flat[index]))
        out[index] = domain.apply(Op.DIV, None, total, domain.const(count)) if mean else total
    if attrs.keepdim:
        out = np.expand_dims(out, dims)
    return out


_TENSOR_OPS: dict[Op, Callable[..., Tensor | list[Tensor]]] = {
    Op.CAST: _cast,
    Op.VIEW: _view,
    Op.EXPAND: _expand,
    Op.SQUEEZE: _squeeze,
    Op.UNSQUEEZE: _unsqueeze,
    Op.PERMUTE: lambda d, at, x: np.transpose(x, at.dims),
    Op.SLICE: _slice,
    Op.SELECT: _select,
    Op.SPLIT: _split,
    Op.CAT: _cat,
    Op.CLONE: lambda d, at, x: x,
    Op.TO_LAYOUT: lambda d, at, x: x,
    Op.FULL: _full,
    Op.MM: lambda d, at, a, b: _mm(d, a, b),
    Op.BMM: _bmm,
    Op.ADDMM: _addmm,
    Op.CONVOLUTION: _convolution,
    Op.ADDMM_ACT: _addmm_act,
    Op.CONV_ACT: _conv_act,
    Op.BATCH_NORM: _batch_norm,
    Op.SUM: lambda d, at, x: _reduce(d, at, x, mean=False),
    Op.MEAN: lambda d, at, x: _reduce(d, at, x, mean=True),
}
