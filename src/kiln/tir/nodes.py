"""The loop-nest IR: buffers, expressions, statements and PrimFunc, all immutable.

Every node is a frozen dataclass that compares and hashes by value (structural equality).
Names are the identities: within one PrimFunc every Buffer, Var and Block has a distinct
name, which is what lets a schedule Trace refer to them and replay onto a fresh program.
Shapes and loop extents are static ints (kiln tensor types are static); loops run from 0.

A tiny example, ``C = A + B`` on f32[4, 8]::

    A = Buffer("A", (4, 8), DType.F32)
    B = Buffer("B", (4, 8), DType.F32)
    C = Buffer("C", (4, 8), DType.F32)
    i, j = Var("i"), Var("j")
    vi, vj = Var("vi"), Var("vj")
    block = Block("C", (IterVar(vi, 4), IterVar(vj, 8)), (i, j),
                  BufferStore(C, (vi, vj), A[vi, vj] + B[vi, vj]))
    func = PrimFunc("add", (A, B), (C,), For(i, 4, For(j, 8, block)))

which prints (``kiln.tir.printer``) as::

    def add(A: f32[4, 8], B: f32[4, 8], C: f32[4, 8]):
      for i in range(4):
        for j in range(8):
          block C(vi: spatial[4] = i, vj: spatial[8] = j):
            C[vi, vj] = A[vi, vj] + B[vi, vj]

Semantics a renderer must keep:

* A `Block` binds each iter var to its binding expression (in terms of enclosing loop vars),
  runs only where ``predicate`` holds (None: always), and runs ``init`` first when every
  REDUCE iter var is 0 (the first visit of an output element). The body refers to iter vars,
  never to loop vars, so blocks can be moved between loop nests.
* Index arithmetic is on I64 vars and constants; FLOORDIV/FLOORMOD round toward -inf
  (indices are non-negative in every program kiln builds, so C's / and % agree there).
* DIV is true division and only appears on floating dtypes. MIN/MAX propagate NaN, as
  ``torch.minimum``/``torch.maximum`` do. SIGMOID is 1 / (1 + exp(-x)), RSQRT 1 / sqrt(x).
  EXP_FLUSHED (float32) is exp(x), but 0 where x < `EXP_FLUSH_BELOW` (a softmax's terms:
  `kiln.tir.te.softmax_exp`).
* `Select` is lazy: only the chosen side is evaluated (padding reads rely on it).
* Binary operands have one dtype (lowering inserts `Cast`s); comparisons give BOOL.
* `Allocate` introduces a buffer that lives for its body: LOCAL scope is a small stack
  array (registers, accumulators, packed tiles), GLOBAL scope a heap temporary.
* Float constants may be inf/-inf (reduction identities); a renderer spells them itself.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from kiln.ir.types import DType

__all__ = [
    "Allocate", "BinOp", "Binary", "Block", "Buffer", "BufferStore", "Cast", "CmpOp",
    "Compare", "Const", "Expr", "For", "ForKind", "IfThenElse", "IterKind", "IterVar", "Load",
    "Intrinsic", "PrimFunc", "Scope", "Select", "SeqStmt", "Stmt", "Tensorized", "UnOp", "Unary",
    "Var",
    "channels_last_strides", "const", "contiguous_strides", "seq",
]

INDEX = DType.I64  # dtype of loop vars, iter vars and index constants


class ForKind(enum.Enum):
    SERIAL = "serial"
    # iterations run on different threads (OpenMP parallel for), each thread one contiguous
    # run of them, the same run on every call: a chain of kernels split alike finds the
    # values each thread wrote still in its core's cache
    PARALLEL = "parallel"
    # ... handed out one at a time to whichever thread is free: a thread that is slowed (its
    # core shared, preempted) does not hold the others up at the end, but no thread keeps
    # the same part of the data from one call to the next
    PARALLEL_DYNAMIC = "parallel_dynamic"
    VECTORIZED = "vectorized"  # iterations run in SIMD lanes
    UNROLLED = "unrolled"  # the body is repeated extent times

    @property
    def is_parallel(self) -> bool:
        return self in (ForKind.PARALLEL, ForKind.PARALLEL_DYNAMIC)


class IterKind(enum.Enum):
    SPATIAL = "spatial"  # each value writes a different output element
    REDUCE = "reduce"  # values accumulate into the same output element


class Scope(enum.Enum):
    GLOBAL = "global"  # function parameters and heap temporaries
    LOCAL = "local"  # a small per-thread array: accumulator tiles, packed panels


class BinOp(enum.Enum):
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"  # true division (floating dtypes)
    FLOORDIV = "//"
    FLOORMOD = "%"
    MIN = "min"
    MAX = "max"
    POW = "pow"
    AND = "and"  # logical, BOOL operands
    OR = "or"

    @property
    def is_infix(self) -> bool:
        return self not in (BinOp.MIN, BinOp.MAX, BinOp.POW)


# below this EXP_FLUSHED gives 0: exp(-87) = 1.6e-38, just above the smallest normal float32,
# and every result from here up is a normal float
EXP_FLUSH_BELOW = -87.0


class UnOp(enum.Enum):
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    TANH = "tanh"
    ERF = "erf"
    SIGMOID = "sigmoid"
    EXP_FLUSHED = "exp_flushed"
    SIN = "sin"
    COS = "cos"
    FLOOR = "floor"
    CEIL = "ceil"
    NOT = "not"  # logical, BOOL operand


class CmpOp(enum.Enum):
    EQ = "=="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="


# ---------------------------------------------------------------------------------------------
# Buffers


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major element strides of a dense array of ``shape``."""
    strides = []
    step = 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def channels_last_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a 4-d [N, C, H, W] array stored NHWC (torch.channels_last)."""
    _, c, h, w = shape
    return (h * w * c, 1, w * c, c)


@dataclass(frozen=True, slots=True)
class Buffer:
    """A named n-d array. ``strides`` are in elements; None means contiguous row-major."""

    name: str
    shape: tuple[int, ...]
    dtype: DType
    strides: tuple[int, ...] | None = None
    scope: Scope = Scope.GLOBAL

    def __post_init__(self) -> None:
        if any(not isinstance(d, int) or d < 0 for d in self.shape):
            raise ValueError(f"buffer {self.name}: shape must be non-negative ints, "
                             f"got {self.shape}")
        if self.strides is not None and len(self.strides) != len(self.shape):
            raise ValueError(f"buffer {self.name}: {len(self.strides)} strides for rank "
                             f"{len(self.shape)}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def elem_strides(self) -> tuple[int, ...]:
        """The strides in elements, contiguous ones filled in."""
        return self.strides if self.strides is not None else contiguous_strides(self.shape)

    def __getitem__(self, indices: ExprLike | tuple[ExprLike, ...]) -> Load:
        if not isinstance(indices, tuple):
            indices = (indices,)
        return Load(self, tuple(as_index(i) for i in indices))


# ---------------------------------------------------------------------------------------------
# Expressions


class Expr:
    """Base of expressions. Arithmetic operators build nodes; comparisons do not (use
    `Compare`), so ``==`` stays structural equality."""

    __slots__ = ()

    @property
    def dtype(self) -> DType:
        raise NotImplementedError

    def __add__(self, other: ExprLike) -> Expr:
        return Binary(BinOp.ADD, self, _coerce(other, self.dtype))

    def __radd__(self, other: ExprLike) -> Expr:
        return Binary(BinOp.ADD, _coerce(other, self.dtype), self)

    def __sub__(self, other: ExprLike) -> Expr:
        return Binary(BinOp.SUB, self, _coerce(other, self.dtype))

    def __rsub__(self, other: ExprLike) -> Expr:
        return Binary(BinOp.SUB, _coerce(other, self.dtype), self)

    def __mul__(self, other: ExprLike) -> Expr:
        return Binary(BinOp.MUL, self, _coerce(other, self.dtype))

    def __rmul__(self, other: ExprLike) -> Expr:
        return Binary(BinOp.MUL, _coerce(other, self.dtype), self)

    def __truediv__(self, other: ExprLike) -> Expr:
        return Binary(BinOp.DIV, self, _coerce(other, self.dtype))

    def __rtruediv__(self, other: ExprLike) -> Expr:
        return Binary(BinOp.DIV, _coerce(other, self.dtype), self)

    def __floordiv__(self, other: ExprLike) -> Expr:
        return Binary(BinOp.FLOORDIV, self, _coerce(other, self.dtype))

    def __mod__(self, other: ExprLike) -> Expr:
        return Binary(BinOp.FLOORMOD, self, _coerce(other, self.dtype))

    def __neg__(self) -> Expr:
        return Unary(UnOp.NEG, self)


ExprLike = Expr | bool | int | float


@dataclass(frozen=True, slots=True)
class Const(Expr):
    value: bool | int | float
    dtype: DType  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.dtype is DType.BOOL:
            ok = isinstance(self.value, bool)
        elif self.dtype.is_floating:
            ok = isinstance(self.value, float)
        else:
            ok = isinstance(self.value, int) and not isinstance(self.value, bool)
        if not ok:
            raise TypeError(f"constant {self.value!r} does not have dtype {self.dtype.value}")


@dataclass(frozen=True, slots=True)
class Var(Expr):
    """A loop variable or block iter var (by name; names are unique within a PrimFunc)."""

    name: str
    dtype: DType = INDEX  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Load(Expr):
    buffer: Buffer
    indices: tuple[Expr, ...]

    def __post_init__(self) -> None:
        if len(self.indices) != self.buffer.rank:
            raise ValueError(f"load of {self.buffer.name} with {len(self.indices)} indices, "
                             f"rank {self.buffer.rank}")

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.buffer.dtype


@dataclass(frozen=True, slots=True)
class Binary(Expr):
    op: BinOp
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        if self.a.dtype is not self.b.dtype:
            raise TypeError(f"{self.op.name} of {self.a.dtype.value} and {self.b.dtype.value}")

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.a.dtype


@dataclass(frozen=True, slots=True)
class Unary(Expr):
    op: UnOp
    a: Expr

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.a.dtype


@dataclass(frozen=True, slots=True)
class Compare(Expr):
    op: CmpOp
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        if self.a.dtype is not self.b.dtype:
            raise TypeError(f"{self.op.name} of {self.a.dtype.value} and {self.b.dtype.value}")

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return DType.BOOL


@dataclass(frozen=True, slots=True)
class Select(Expr):
    """``true_value if cond else false_value``; only the chosen side is evaluated (like C's
    ``?:``), so a Load guarded by a bounds check never reads out of range."""

    cond: Expr
    true_value: Expr
    false_value: Expr

    def __post_init__(self) -> None:
        if self.cond.dtype is not DType.BOOL:
            raise TypeError(f"select condition has dtype {self.cond.dtype.value}")
        if self.true_value.dtype is not self.false_value.dtype:
            raise TypeError(f"select of {self.true_value.dtype.value} and "
                            f"{self.false_value.dtype.value}")

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.true_value.dtype


@dataclass(frozen=True, slots=True)
class Cast(Expr):
    """Conversion with torch's rules (float to int truncates; nonzero to bool is True)."""

    target: DType
    value: Expr

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.target


def const(value: bool | int | float, dtype: DType) -> Const:
    """A constant of ``dtype``, converting the Python number to the matching kind."""
    if dtype is DType.BOOL:
        return Const(bool(value), dtype)
    if dtype.is_floating:
        return Const(float(value), dtype)
    return Const(int(value), dtype)


def as_index(value: ExprLike) -> Expr:
    return value if isinstance(value, Expr) else const(value, INDEX)


def _coerce(value: ExprLike, dtype: DType) -> Expr:
    return value if isinstance(value, Expr) else const(value, dtype)


# ---------------------------------------------------------------------------------------------
# Statements


class Stmt:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class BufferStore(Stmt):
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr

    def __post_init__(self) -> None:
        if len(self.indices) != self.buffer.rank:
            raise ValueError(f"store to {self.buffer.name} with {len(self.indices)} indices, "
                             f"rank {self.buffer.rank}")
        if self.value.dtype is not self.buffer.dtype:
            raise TypeError(f"store of {self.value.dtype.value} into {self.buffer.name}: "
                            f"{self.buffer.dtype.value}")


@dataclass(frozen=True, slots=True)
class For(Stmt):
    """``for var in range(extent): body``, run as ``kind`` says; with ``stop``, only while
    ``var < stop`` as well: a bound computed at run time from outer loops' variables (the
    keys a block of queries attends under a causal mask). ``extent`` stays the static upper
    bound every analysis reads."""

    var: Var
    extent: int
    body: Stmt
    kind: ForKind = ForKind.SERIAL
    stop: Expr | None = None


@dataclass(frozen=True, slots=True)
class IterVar:
    """A block's iteration variable with domain ``[0, extent)``."""

    var: Var
    extent: int
    kind: IterKind = IterKind.SPATIAL


@dataclass(frozen=True, slots=True)
class Block(Stmt):
    """One unit of computation (TVM's block): the schedule's handle for compute_at & co."""

    name: str
    iter_vars: tuple[IterVar, ...]
    bindings: tuple[Expr, ...]  # one per iter var, in terms of enclosing loop vars
    body: Stmt
    init: Stmt | None = None  # runs before the first REDUCE iteration of an output element
    predicate: Expr | None = None  # the block runs only where this holds

    def __post_init__(self) -> None:
        if len(self.bindings) != len(self.iter_vars):
            raise ValueError(f"block {self.name}: {len(self.bindings)} bindings for "
                             f"{len(self.iter_vars)} iter vars")

    @property
    def is_reduction(self) -> bool:
        return any(iv.kind is IterKind.REDUCE for iv in self.iter_vars)


@dataclass(frozen=True, slots=True)
class SeqStmt(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True)
class Allocate(Stmt):
    """``buffer`` exists (uninitialized) while ``body`` runs."""

    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, slots=True)
class IfThenElse(Stmt):
    cond: Expr
    then_body: Stmt
    else_body: Stmt | None = None


@dataclass(frozen=True, slots=True)
class Prefetch(Stmt):
    """A hint, no effect on values: the ``lines`` cache lines from ``buffer[indices]`` on will
    be read soon (a GEMM's next weight panel, which a model call finds in DRAM), into the
    caches that ``locality`` names as __builtin_prefetch does (3: all levels, L1 included;
    2: L2 and beyond)."""

    buffer: Buffer
    indices: tuple[Expr, ...]
    lines: int = 1
    locality: int = 3

    def __post_init__(self) -> None:
        if len(self.indices) != self.buffer.rank:
            raise ValueError(f"prefetch of {self.buffer.name} with {len(self.indices)} indices, "
                             f"rank {self.buffer.rank}")


class Intrinsic(enum.Enum):
    """A micro-kernel the renderer emits in place of a loop nest (`Tensorized`)."""

    # acc[i, j] += a[i] * b[j] at each step of a loop, over an unrolled i and a vectorized j:
    # a register tile, accumulators held in vector registers across the whole loop, one
    # broadcast of a per row and one vector load of b per `lanes` columns
    FMA_TILE = "fma_tile"


@dataclass(frozen=True, slots=True)
class Tensorized(Stmt):
    """``loop`` computed by ``intrinsic`` on ``lanes``-wide vectors. The loop is the
    intrinsic's description: it says what is computed (the interpreter runs it, every
    traversal sees it), and `kiln.tir.tensorize` has checked that it matches; a renderer
    emits the intrinsic's implementation for it."""

    intrinsic: Intrinsic
    lanes: int
    loop: For
    # the loop nest right after the tile that stores its accumulators (an activation of
    # them, against constant bounds), emitted from the registers; the interpreter runs it
    # after ``loop`` (`kiln.tir.tensorize.fuse_write_backs`)
    write_back: Stmt | None = None
    # the loop nest right before the tile that sets its accumulators (a bias, a residual, C
    # from the last K block), emitted into the registers; the interpreter runs it before
    # ``loop`` (`kiln.tir.tensorize.fuse_inits`)
    init: Stmt | None = None


def seq(*stmts: Stmt) -> Stmt:
    """A statement sequence, flattened; one statement stays itself."""
    flat: list[Stmt] = []
    for s in stmts:
        flat.extend(s.stmts if isinstance(s, SeqStmt) else (s,))
    return flat[0] if len(flat) == 1 else SeqStmt(tuple(flat))


# ---------------------------------------------------------------------------------------------
# Functions


@dataclass(frozen=True, slots=True)
class PrimFunc:
    """A kernel: reads ``inputs``, writes ``outputs``; parameters are inputs then outputs."""

    name: str
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    body: Stmt

    @property
    def params(self) -> tuple[Buffer, ...]:
        return self.inputs + self.outputs

    def with_body(self, body: Stmt) -> PrimFunc:
        return PrimFunc(self.name, self.inputs, self.outputs, body)
