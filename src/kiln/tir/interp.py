"""The reference interpreter for loop IR: slow, simple, and strict.

Statements are compiled once into Python closures and then walked loop by loop on numpy
arrays, with numpy scalars so f32 arithmetic rounds like f32. It is strict where that finds
schedule bugs: every load and store is bounds-checked, every block binding must lie in its
iter var's domain, fresh buffers start as NaN (or a garbage integer), and PARALLEL loops run
their iterations in *reverse* order, so a parallelization that depends on order shows up as a
wrong answer.

    outs = run_torch(func, [a, b])       # torch tensors in, freshly allocated outputs back
    run(func, {"A": a, "B": b, "C": c})  # numpy arrays by buffer name, written in place
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from kiln.ir.types import DType
from kiln.tir.nodes import (
    EXP_FLUSH_BELOW,
    Allocate,
    Binary,
    BinOp,
    Block,
    Buffer,
    BufferStore,
    Cast,
    CmpOp,
    Compare,
    Const,
    Expr,
    For,
    IfThenElse,
    IterKind,
    Load,
    Prefetch,
    PrimFunc,
    Select,
    SeqStmt,
    Stmt,
    Tensorized,
    Unary,
    UnOp,
    Var,
)

Env = dict[str, Any]
Arrays = dict[str, np.ndarray]
EvalFn = Callable[[Env, Arrays], Any]
ExecFn = Callable[[Env, Arrays], None]
GARBAGE_INT = -1234567


class InterpError(RuntimeError):
    """The program did something undefined: an out-of-range access or binding."""


# bf16 has no numpy type: held as f32 and rounded on every conversion into it
_NP = {DType.F64: np.float64, DType.F32: np.float32, DType.F16: np.float16,
       DType.BF16: np.float32, DType.I64: np.int64, DType.I32: np.int32, DType.I16: np.int16,
       DType.I8: np.int8, DType.U8: np.uint8, DType.BOOL: np.bool_}


def np_dtype(dtype: DType) -> Any:
    return _NP[dtype]


def _to_bf16(x: Any) -> np.float32:
    return np.float32(torch.tensor(float(x), dtype=torch.bfloat16).item())


def convert(value: Any, dtype: DType) -> Any:
    """``value`` as a scalar of ``dtype``, with torch's conversion rules."""
    if dtype is DType.BOOL:
        return np.bool_(value != 0)
    if dtype is DType.BF16:
        return _to_bf16(value)
    if not dtype.is_floating and isinstance(value, (float, np.floating)):
        value = math.trunc(float(value)) if math.isfinite(value) else 0
    return _NP[dtype](value)


def _sigmoid(x: Any) -> Any:
    one = type(x)(1)
    return one / (one + np.exp(-x))


_BIN: dict[BinOp, Callable[[Any, Any], Any]] = {
    BinOp.ADD: lambda a, b: a + b,
    BinOp.SUB: lambda a, b: a - b,
    BinOp.MUL: lambda a, b: a * b,
    BinOp.DIV: lambda a, b: a / b,
    BinOp.FLOORDIV: lambda a, b: a // b,
    BinOp.FLOORMOD: lambda a, b: a % b,
    BinOp.POW: np.power,
    BinOp.AND: lambda a, b: np.bool_(bool(a) and bool(b)),
    BinOp.OR: lambda a, b: np.bool_(bool(a) or bool(b)),
}
_UN: dict[UnOp, Callable[[Any], Any]] = {
    UnOp.NEG: lambda a: -a,
    UnOp.ABS: abs,
    UnOp.EXP: np.exp,
    UnOp.LOG: np.log,
    UnOp.SQRT: np.sqrt,
    UnOp.RSQRT: lambda a: type(a)(1) / np.sqrt(a),
    UnOp.TANH: np.tanh,
    UnOp.ERF: lambda a: type(a)(math.erf(float(a))),
    UnOp.SIGMOID: _sigmoid,
    UnOp.EXP_FLUSHED: lambda a: type(a)(0) if a < EXP_FLUSH_BELOW else np.exp(a),
    UnOp.SIN: np.sin,
    UnOp.COS: np.cos,
    UnOp.FLOOR: np.floor,
    UnOp.CEIL: np.ceil,
    UnOp.NOT: lambda a: np.bool_(not a),
}
_CMP: dict[CmpOp, Callable[[Any, Any], Any]] = {
    CmpOp.EQ: lambda a, b: a == b,
    CmpOp.NE: lambda a, b: a != b,
    CmpOp.LT: lambda a, b: a < b,
    CmpOp.LE: lambda a, b: a <= b,
    CmpOp.GT: lambda a, b: a > b,
    CmpOp.GE: lambda a, b: a >= b,
}


def _bounds_checked(buf: Buffer, idx: tuple[Any, ...]) -> tuple[int, ...]:
    for i, extent in zip(idx, buf.shape):
        if not 0 <= i < extent:
            raise InterpError(f"index {tuple(int(x) for x in idx)} out of range for "
                              f"{buf.name}{list(buf.shape)}")
    return tuple(int(i) for i in idx)


def compile_expr(e: Expr) -> EvalFn:
    if isinstance(e, Const):
        value = e.value if e.dtype is DType.I64 else convert(e.value, e.dtype)
        return lambda env, bufs: value
    if isinstance(e, Var):
        name = e.name
        return lambda env, bufs: env[name]
    if isinstance(e, Load):
        buf, parts = e.buffer, [compile_expr(i) for i in e.indices]

        def load(env: Env, bufs: Arrays) -> Any:
            idx = _bounds_checked(buf, tuple(p(env, bufs) for p in parts))
            return bufs[buf.name][idx]
        return load
    if isinstance(e, Binary):
        a, b = compile_expr(e.a), compile_expr(e.b)
        if e.op in (BinOp.MIN, BinOp.MAX):
            pick: Callable[[Any, Any], Any]
            if e.dtype.is_floating:  # NaN-propagating, as torch.minimum/maximum
                pick = np.minimum if e.op is BinOp.MIN else np.maximum
            else:
                pick = min if e.op is BinOp.MIN else max
        else:
            pick = _BIN[e.op]
        if e.dtype is DType.BF16:
            return lambda env, bufs: _to_bf16(pick(a(env, bufs), b(env, bufs)))
        return lambda env, bufs: pick(a(env, bufs), b(env, bufs))
    if isinstance(e, Unary):
        a, fn = compile_expr(e.a), _UN[e.op]
        if e.dtype is DType.BF16:
            return lambda env, bufs: _to_bf16(fn(a(env, bufs)))
        return lambda env, bufs: fn(a(env, bufs))
    if isinstance(e, Compare):
        a, b, cmp = compile_expr(e.a), compile_expr(e.b), _CMP[e.op]
        return lambda env, bufs: np.bool_(cmp(a(env, bufs), b(env, bufs)))
    if isinstance(e, Select):
        c, t, f = compile_expr(e.cond), compile_expr(e.true_value), compile_expr(e.false_value)
        return lambda env, bufs: t(env, bufs) if c(env, bufs) else f(env, bufs)
    if isinstance(e, Cast):
        v, target = compile_expr(e.value), e.target
        return lambda env, bufs: convert(v(env, bufs), target)
    raise TypeError(f"unknown expression {type(e).__name__}")


def compile_stmt(s: Stmt) -> ExecFn:
    if isinstance(s, SeqStmt):
        parts = [compile_stmt(p) for p in s.stmts]

        def run_seq(env: Env, bufs: Arrays) -> None:
            for p in parts:
                p(env, bufs)
        return run_seq
    if isinstance(s, For):
        return _compile_for(s)
    if isinstance(s, Block):
        return _compile_block(s)
    if isinstance(s, BufferStore):
        buf, value = s.buffer, compile_expr(s.value)
        parts = [compile_expr(i) for i in s.indices]

        def store(env: Env, bufs: Arrays) -> None:
            idx = _bounds_checked(buf, tuple(p(env, bufs) for p in parts))
            bufs[buf.name][idx] = convert(value(env, bufs), buf.dtype)
        return store
    if isinstance(s, Tensorized):  # the loop describes what the intrinsic computes
        if s.write_back is None and s.init is None:
            return compile_stmt(s.loop)
        parts = [compile_stmt(x) for x in (s.init, s.loop, s.write_back) if x is not None]

        def tile(env: Env, bufs: Arrays) -> None:
            for part in parts:
                part(env, bufs)
        return tile
    if isinstance(s, Prefetch):  # a hint to the memory system: nothing to compute
        return lambda env, bufs: None
    if isinstance(s, Allocate):
        buf, body = s.buffer, compile_stmt(s.body)

        def allocate(env: Env, bufs: Arrays) -> None:
            saved = bufs.get(buf.name)
            bufs[buf.name] = fresh_array(buf)
            body(env, bufs)
            if saved is not None:
                bufs[buf.name] = saved
        return allocate
    if isinstance(s, IfThenElse):
        cond, then = compile_expr(s.cond), compile_stmt(s.then_body)
        other = compile_stmt(s.else_body) if s.else_body is not None else None

        def branch(env: Env, bufs: Arrays) -> None:
            if cond(env, bufs):
                then(env, bufs)
            elif other is not None:
                other(env, bufs)
        return branch
    raise TypeError(f"unknown statement {type(s).__name__}")


def _compile_for(s: For) -> ExecFn:
    name, body = s.var.name, compile_stmt(s.body)
    order = range(s.extent - 1, -1, -1) if s.kind.is_parallel else range(s.extent)
    if s.stop is not None:
        stop = compile_expr(s.stop)

        def bounded(env: Env, bufs: Arrays) -> None:
            end = min(s.extent, int(stop(env, bufs)))
            for v in (range(end - 1, -1, -1) if s.kind.is_parallel else range(end)):
                env[name] = v
                body(env, bufs)
        return bounded

    def loop(env: Env, bufs: Arrays) -> None:
        for v in order:
            env[name] = v
            body(env, bufs)
    return loop


def _compile_block(s: Block) -> ExecFn:
    binds = [(iv.var.name, iv.extent, compile_expr(b)) for iv, b in zip(s.iter_vars, s.bindings)]
    reduce_names = [iv.var.name for iv in s.iter_vars if iv.kind is IterKind.REDUCE]
    pred = compile_expr(s.predicate) if s.predicate is not None else None
    init = compile_stmt(s.init) if s.init is not None else None
    body, block_name = compile_stmt(s.body), s.name

    def block(env: Env, bufs: Arrays) -> None:
        if pred is not None and not pred(env, bufs):
            return
        inner = env  # iter var names are unique in a PrimFunc: no scoping needed
        for name, extent, bind in binds:
            v = int(bind(env, bufs))
            if not 0 <= v < extent:
                raise InterpError(f"block {block_name}: {name} = {v} outside [0, {extent})")
            inner[name] = v
        if init is not None and all(inner[n] == 0 for n in reduce_names):
            init(inner, bufs)
        body(inner, bufs)
    return block


def fresh_array(buf: Buffer) -> np.ndarray:
    """An array for ``buf`` filled with values that expose reads before writes."""
    if buf.dtype.is_floating:
        return np.full(buf.shape, np.nan, dtype=_NP[buf.dtype])
    if buf.dtype is DType.BOOL:
        return np.ones(buf.shape, dtype=np.bool_)
    return np.full(buf.shape, GARBAGE_INT, dtype=np.int64).astype(_NP[buf.dtype])


def run(func: PrimFunc, arrays: Mapping[str, np.ndarray]) -> None:
    """Run ``func`` on numpy arrays given by parameter name; outputs are written in place."""
    bufs: Arrays = {}
    for buf in func.params:
        arr = arrays[buf.name]
        if tuple(arr.shape) != buf.shape:
            raise ValueError(f"{buf.name}: array of shape {arr.shape}, buffer {buf.shape}")
        bufs[buf.name] = arr
    with np.errstate(all="ignore"):
        compile_stmt(func.body)({}, bufs)


def run_torch(func: PrimFunc, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run ``func`` on torch tensors; returns new output tensors."""
    if len(inputs) != len(func.inputs):
        raise TypeError(f"{func.name} takes {len(func.inputs)} inputs, {len(inputs)} given")
    arrays = {}
    for buf, t in zip(func.inputs, inputs):
        if t.dtype == torch.bfloat16:
            t = t.float()
        arrays[buf.name] = t.detach().cpu().numpy().copy()
    outs = {buf.name: fresh_array(buf) for buf in func.outputs}
    arrays.update(outs)
    run(func, arrays)
    return [torch.from_numpy(outs[b.name]).to(b.dtype.torch) for b in func.outputs]
