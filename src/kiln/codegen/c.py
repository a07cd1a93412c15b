"""Render a tir PrimFunc to C with OpenMP pragmas: a table from node type to text.

    source = CRenderer().render(func)

One exported function per kernel, named after the PrimFunc, taking one ``restrict`` pointer
per parameter (inputs, then outputs)::

    void add(const float* restrict A, const float* restrict B, float* restrict C) {
      for (int64_t i = 0; i < 4; ++i) {
        #pragma omp simd
        for (int64_t j = 0; j < 8; ++j) {
          C[i * 8 + j] = A[i * 8 + j] + B[i * 8 + j];
        }
      }
    }

Loop kinds: PARALLEL → ``#pragma omp parallel for schedule(static)`` on ``kiln_num_threads``
threads (set by the runtime from torch.get_num_threads()), PARALLEL_DYNAMIC the same with
``schedule(dynamic, 1)``; a parallel loop directly inside another becomes ``collapse``; one
nested deeper runs serially inside the outer region); VECTORIZED →
``#pragma omp simd``; UNROLLED → ``#pragma GCC unroll``. A loop that would race (a REDUCE iter
var bound to a parallel or vectorized loop) is rendered serial with a comment, never wrong.

Math calls (tanhf, logf, sinf, ...) are declared ``omp declare simd`` when the build defines
KILN_LIBMVEC (glibc's vector math library), so vectorized loops call the SIMD versions. f32
exp is always ``kiln_expf`` and f32 erf always ``kiln_erff``: plain arithmetic in the
prologue that vector loops inline (exp within 1.02 ulp, erf within 4.5e-7 absolute), with no
slow path for large arguments, where libmvec's expf goes scalar.
A backend for another C dialect subclasses CRenderer and overrides the hooks (``dtype_name``,
``const``, ``unary_call``, ``loop_pragma``, ``prologue``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from kiln.codegen.c_intrinsics import fma_tile_lines, loop_bound
from kiln.codegen.c_prelude import PRELUDE
from kiln.codegen.c_text import (
    C_TYPES,
    CMP,
    INFIX,
    MATH,
    VECTOR_MATH,
    RenderScope,
    as_operand,
    unparen,
)
from kiln.ir.types import DType
from kiln.tir.arith import bounds
from kiln.tir.nodes import (
    Allocate,
    Binary,
    BinOp,
    Block,
    Buffer,
    BufferStore,
    Cast,
    Compare,
    Const,
    Expr,
    For,
    ForKind,
    IfThenElse,
    Intrinsic,
    IterKind,
    Load,
    Prefetch,
    PrimFunc,
    Scope,
    Select,
    SeqStmt,
    Stmt,
    Tensorized,
    Unary,
    UnOp,
    Var,
)
from kiln.tir.tensorize import acc_init, fma_tile, write_back
from kiln.tir.visit import iter_exprs, iter_stmts, map_expr

__all__ = ["CRenderer", "UnsupportedForC", "render_c"]

LOCAL_STACK_LIMIT = 64 * 1024  # bytes; larger LOCAL buffers go on the heap (thread stacks)
# heap temporaries from this size up are allocated once per calling thread and kept (a
# thread-local workspace): glibc maps a block this large afresh whenever the heap's top was
# given back, and its pages then fault in on every call (a 613 KB padded copy: 347 us for a
# convolution that runs in 110); up to the cap, so a kernel never holds a large block for good
WORKSPACE_MIN = 64 * 1024
WORKSPACE_MAX = 16 * 1024 * 1024
INDENT = "  "


class UnsupportedForC(NotImplementedError):
    """The program uses something the C renderer cannot express (e.g. f16 arithmetic)."""


class CRenderer:
    """PrimFunc → C source. Each node type has one method; ``_stmt_table``/``_expr_table`` map
    node types to them."""

    def __init__(self) -> None:
        self._hoisted = itertools.count()
        self._expr_table: dict[type, Callable[[Expr, RenderScope], str]] = {
            Const: self._const,
            Var: self._var,
            Load: self._load,
            Binary: self._binary,
            Unary: self._unary,
            Compare: self._compare,
            Select: self._select,
            Cast: self._cast,
        }
        self._stmt_table: dict[type, Callable[[Stmt, RenderScope], list[str]]] = {
            SeqStmt: self._seq,
            For: self._for,
            Block: self._block,
            BufferStore: self._store,
            Allocate: self._allocate,
            IfThenElse: self._if,
            Prefetch: self._prefetch,
            Tensorized: self._tensorized,
        }

    # --- hooks ---------------------------------------------------------------------------------

    def dtype_name(self, dtype: DType) -> str:
        try:
            return C_TYPES[dtype]
        except KeyError:
            raise UnsupportedForC(f"no C arithmetic for dtype {dtype.value}") from None

    def prologue(self) -> str:
        decls = "\n".join(f"#pragma omp declare simd notinbranch\n"
                          f"{ctype} {name}({', '.join([ctype] * arity)});"
                          for name, ctype, arity in VECTOR_MATH)
        return ("#include <math.h>\n#include <stdbool.h>\n#include <stdint.h>\n"
                "#include <stdlib.h>\n\n"
                f"#ifdef KILN_LIBMVEC\n{decls}\n#endif\n\n{PRELUDE}")

    def loop_pragma(self, loop: For, collapse: int) -> str | None:
        if loop.kind.is_parallel:
            extra = f" collapse({collapse})" if collapse > 1 else ""
            policy = "dynamic, 1" if loop.kind is ForKind.PARALLEL_DYNAMIC else "static"
            return f"#pragma omp parallel for schedule({policy}){extra} num_threads(KILN_THREADS)"
        if loop.kind is ForKind.VECTORIZED:
            return "#pragma omp simd"
        if loop.kind is ForKind.UNROLLED:
            return f"#pragma GCC unroll {min(loop.extent, 65534)}"
        return None

    def unary_call(self, op: UnOp, dtype: DType, arg: str) -> str:
        operand = as_operand(arg)  # what a prefix operator applies to: -(a + b), not -a + b
        if op is UnOp.NEG:
            return f"(-{operand})"
        if op is UnOp.NOT:
            return f"(!{operand})"
        if dtype.is_floating:
            one = "1.0f" if dtype is DType.F32 else "1.0"
            suffix = "" if dtype is DType.F32 else "drop"
            exp = "kiln_expf" if dtype is DType.F32 else "exp"
            if op is UnOp.RSQRT:
                return f"({one} / {self._math('sqrtf', suffix)}({arg}))"
            if op is UnOp.SIGMOID:
                return f"({one} / ({one} + {exp}(-{operand})))"
            if op is UnOp.EXP:
                return f"{exp}({arg})"
            if op is UnOp.EXP_FLUSHED:  # (a softmax's float32 terms: kiln.tir.te.softmax_exp)
                if dtype is not DType.F32:
                    raise UnsupportedForC(f"{op.name} on {dtype.value}")
                return f"kiln_expf_flushed({arg})"
            if op is UnOp.ERF and dtype is DType.F32:
                return f"kiln_erff({arg})"
            return f"{self._math(MATH[op], suffix)}({arg})"
        if op is UnOp.ABS:
            return f"({operand} < 0 ? -{operand} : {operand})"
        if op in (UnOp.FLOOR, UnOp.CEIL):
            return arg
        raise UnsupportedForC(f"{op.name} on {dtype.value}")

    def const(self, value: bool | int | float, dtype: DType) -> str:
        if dtype is DType.BOOL:
            return "true" if value else "false"
        if dtype.is_floating:
            f = float(value)
            suffix = "f" if dtype is DType.F32 else ""
            if math.isnan(f):
                return "NAN" if dtype is DType.F32 else "(double)NAN"
            if math.isinf(f):
                inf = "INFINITY" if dtype is DType.F32 else "(double)INFINITY"
                return inf if f > 0 else f"(-{inf})"
            text = repr(f)
            return f"{text}{suffix}" if not text.startswith("-") else f"({text}{suffix})"
        v = int(value)
        text = str(v) if -(2**31) <= v < 2**31 else f"INT64_C({v})"
        return text if v >= 0 else f"({text})"

    # --- entry ---------------------------------------------------------------------------------

    def render(self, func: PrimFunc) -> str:
        self._hoisted = itertools.count()  # names from 0 each time: the text is func's alone
        scope = RenderScope()
        params = []
        for buf in func.params:
            const = "const " if buf in func.inputs and buf not in func.outputs else ""
            params.append(f"{const}{self.dtype_name(buf.dtype)}* restrict {scope.name(buf.name)}")
        name = scope.name(func.name)
        body = self._stmt(func.body, scope)
        lines = [self.prologue(), f"void {name}({', '.join(params) or 'void'}) {{"]
        lines += [INDENT + line for line in body]
        lines.append("}")
        return "\n".join(lines) + "\n"

    def entry_name(self, func: PrimFunc) -> str:
        """The C symbol of the kernel (the PrimFunc name, made a valid identifier)."""
        return RenderScope().name(func.name)

    # --- statements ----------------------------------------------------------------------------

    def _stmt(self, stmt: Stmt, scope: RenderScope) -> list[str]:
        try:
            method = self._stmt_table[type(stmt)]
        except KeyError:
            raise UnsupportedForC(f"no C for statement {type(stmt).__name__}") from None
        return method(stmt, scope)

    def _seq(self, stmt: SeqStmt, scope: RenderScope) -> list[str]:
        return [line for s in stmt.stmts for line in self._stmt(s, scope)]

    def _for(self, loop: For, scope: RenderScope) -> list[str]:
        if loop.extent == 0:
            return []
        kind = loop.kind
        racy = (kind.is_parallel or kind is ForKind.VECTORIZED) and _binds_reduce(
            loop.body, loop.var.name)
        if racy or (kind.is_parallel and scope.in_parallel):
            kind = ForKind.SERIAL
        nest = [loop if kind is loop.kind else For(loop.var, loop.extent, loop.body, kind,
                                                   loop.stop)]
        if kind.is_parallel:  # perfectly nested parallel loops collapse into one
            while (isinstance(nest[-1].body, For) and nest[-1].body.kind.is_parallel
                   and nest[-1].stop is None and nest[-1].body.stop is None
                   and not _binds_reduce(nest[-1].body.body, nest[-1].body.var.name)):
                nest.append(nest[-1].body)
        lines = []
        if racy:
            lines.append(f"/* {loop.kind.value} loop {loop.var.name} feeds a reduction: serial */")
        pragma = self.loop_pragma(nest[0], len(nest))
        if pragma:
            lines.append(pragma)
        inner_scope = scope
        if kind.is_parallel:
            inner_scope = RenderScope(scope.names, scope.used, in_parallel=True,
                                 ranges=scope.ranges)
        for depth, level in enumerate(nest):
            bound = loop_bound(level, lambda e: unparen(self._expr(e, scope)))
            scope.ranges[level.var] = (0, level.extent - 1)
            var = scope.name(level.var.name)
            lines.append(INDENT * depth + f"for (int64_t {var} = 0; {var} < {bound}; "
                         f"++{var}) {{")
        body = self._stmt(nest[-1].body, inner_scope)
        lines += [INDENT * len(nest) + line for line in body]
        for depth in reversed(range(len(nest))):
            lines.append(INDENT * depth + "}")
        return lines

    def _block(self, block: Block, scope: RenderScope) -> list[str]:
        lines = [f"{{  /* block {block.name} */"]
        # (rendered before the iter var ranges are known: the predicate is what keeps them)
        pred = None if block.predicate is None else unparen(self._expr(block.predicate, scope))
        for iv, binding in zip(block.iter_vars, block.bindings):
            scope.ranges[iv.var] = (0, iv.extent - 1)  # (the body runs inside the domain)
            lines.append(f"{INDENT}const int64_t {scope.name(iv.var.name)} = "
                         f"{unparen(self._expr(binding, scope))};")
        inner: list[str] = []
        if block.init is not None:
            reduce_vars = [scope.name(iv.var.name) for iv in block.iter_vars
                           if iv.kind is IterKind.REDUCE]
            init = self._stmt(block.init, scope)
            if reduce_vars:
                cond = " && ".join(f"{v} == 0" for v in reduce_vars)
                inner += [f"if ({cond}) {{", *[INDENT + x for x in init], "}"]
            else:
                inner += init
        inner += self._stmt(block.body, scope)
        if pred is not None:
            inner = [f"if ({pred}) {{", *[INDENT + x for x in inner], "}"]
        lines += [INDENT + x for x in inner]
        lines.append("}")
        return lines

    def _store(self, stmt: BufferStore, scope: RenderScope) -> list[str]:
        target = self._index(stmt.buffer, stmt.indices, scope)
        return [f"{target} = {unparen(self._expr(stmt.value, scope))};"]

    def _prefetch(self, stmt: Prefetch, scope: RenderScope) -> list[str]:
        """One read prefetch per cache line, into the caches its locality names."""
        first = self._index(stmt.buffer, stmt.indices, scope)
        per_line = max(1, 64 // stmt.buffer.dtype.itemsize)
        return [f"__builtin_prefetch(&{first}{f' + {i * per_line}' if i else ''}, 0, "
                f"{stmt.locality});" for i in range(stmt.lines)]

    def _tensorized(self, stmt: Tensorized, scope: RenderScope) -> list[str]:
        """The intrinsic's micro-kernel (`kiln.codegen.c_intrinsics`); a loop that no longer
        matches its description (a rewrite after tensorize) renders as the loop it is, and
        an init or write-back nest that no longer matches its tile as the nest it is."""
        tile = fma_tile(stmt.loop, stmt.lanes) if stmt.intrinsic is Intrinsic.FMA_TILE else None
        back = write_back(tile, stmt.write_back, stmt.lanes) if tile and stmt.write_back else None
        init = acc_init(tile, stmt.init, stmt.lanes) if tile and stmt.init else None
        head = self._stmt(stmt.init, scope) if stmt.init and init is None else []
        rest = self._stmt(stmt.write_back, scope) if stmt.write_back and back is None else []
        if tile is None:
            return head + self._for(stmt.loop, scope) + rest
        for loop in tile.k:
            scope.ranges[loop.var] = (0, loop.extent - 1)
        return head + fma_tile_lines(
            tile, stmt.lanes, access=lambda ld: self._load(ld, scope),
            expr=lambda e: unparen(self._expr(e, scope)),
            stmt=lambda s: self._stmt(s, scope), name=scope.name,
            prefix=f"fma{next(self._hoisted)}_", write_back=back, init=init) + rest

    def _allocate(self, stmt: Allocate, scope: RenderScope) -> list[str]:
        buf = stmt.buffer
        ctype = self.dtype_name(buf.dtype)
        name = scope.name(buf.name)
        nbytes = max(buf.numel, 1) * buf.dtype.itemsize
        body = self._stmt(stmt.body, scope)
        if buf.scope is Scope.LOCAL and nbytes <= LOCAL_STACK_LIMIT:
            head = [f"{ctype} {name}[{max(buf.numel, 1)}] __attribute__((aligned(64)));"]
            return ["{", *[INDENT + x for x in head + body], "}"]
        size = (nbytes + 63) // 64 * 64
        if WORKSPACE_MIN <= size <= WORKSPACE_MAX:  # kept by the calling thread
            ws = f"{name}_ws"
            head = [f"static __thread {ctype}* {ws} = 0;",
                    f"if (!{ws}) {ws} = ({ctype}*)aligned_alloc(64, {size});",
                    f"{ctype}* restrict {name} = {ws};"]
            return ["{", *[INDENT + x for x in head + body], "}"]
        head = [f"{ctype}* restrict {name} = ({ctype}*)aligned_alloc(64, {size});"]
        return ["{", *[INDENT + x for x in head + body], f"{INDENT}free({name});", "}"]

    def _if(self, stmt: IfThenElse, scope: RenderScope) -> list[str]:
        lines = [f"if ({unparen(self._expr(stmt.cond, scope))}) {{"]
        lines += [INDENT + x for x in self._stmt(stmt.then_body, scope)]
        if stmt.else_body is not None:
            lines.append("} else {")
            lines += [INDENT + x for x in self._stmt(stmt.else_body, scope)]
        lines.append("}")
        return lines

    # --- expressions ---------------------------------------------------------------------------

    def _expr(self, expr: Expr, scope: RenderScope) -> str:
        try:
            method = self._expr_table[type(expr)]
        except KeyError:
            raise UnsupportedForC(f"no C for expression {type(expr).__name__}") from None
        return method(expr, scope)

    def _const(self, expr: Const, scope: RenderScope) -> str:
        return self.const(expr.value, expr.dtype)

    def _var(self, expr: Var, scope: RenderScope) -> str:
        return scope.name(expr.name)

    def _load(self, expr: Load, scope: RenderScope) -> str:
        return self._index(expr.buffer, expr.indices, scope)

    def _index(self, buf: Buffer, indices: tuple[Expr, ...], scope: RenderScope) -> str:
        terms = []
        for index, stride in zip(indices, buf.elem_strides):
            if isinstance(index, Const) and index.value == 0:
                continue
            text = self._expr(index, scope)
            terms.append(text if stride == 1 else f"{text} * {stride}")
        return f"{scope.name(buf.name)}[{' + '.join(terms) or '0'}]"

    def _binary(self, expr: Binary, scope: RenderScope) -> str:
        a, b = self._expr(expr.a, scope), self._expr(expr.b, scope)
        dtype = expr.a.dtype
        if expr.op in INFIX:
            return f"({a} {INFIX[expr.op]} {b})"
        if expr.op in (BinOp.MIN, BinOp.MAX):
            if dtype in (DType.F32, DType.F64):  # (against a constant: a bound's own helper)
                bound = "c" if isinstance(expr.a, Const) or isinstance(expr.b, Const) else ""
                return (f"kiln_{expr.op.name.lower()}{bound}_{dtype.value}"
                        f"({unparen(a)}, {unparen(b)})")
            op = "<" if expr.op is BinOp.MIN else ">"
            return f"({a} {op} {b} ? {a} : {b})"
        if expr.op is BinOp.POW:
            if dtype.is_floating:
                return f"{self._math('powf', '' if dtype is DType.F32 else 'drop')}({a}, {b})"
            ctype = self.dtype_name(dtype)
            return f"(({ctype})pow((double){a}, (double){b}))"
        if expr.op is BinOp.FLOORDIV:
            if dtype.is_floating:
                return f"kiln_floordiv_{dtype.value}({unparen(a)}, {unparen(b)})"
            if _nonneg(expr.a) and _nonneg(expr.b):
                return f"({a} / {b})"
            return f"(({self.dtype_name(dtype)})kiln_floordiv_i64({unparen(a)}, {unparen(b)}))"
        if expr.op is BinOp.FLOORMOD:
            if dtype.is_floating:
                return f"kiln_floormod_{dtype.value}({unparen(a)}, {unparen(b)})"
            if _nonneg(expr.a) and _nonneg(expr.b):
                return f"({a} % {b})"
            return f"(({self.dtype_name(dtype)})kiln_floormod_i64({unparen(a)}, {unparen(b)}))"
        raise UnsupportedForC(f"binary {expr.op.name}")

    def _unary(self, expr: Unary, scope: RenderScope) -> str:
        arg = unparen(self._expr(expr.a, scope))
        return self.unary_call(expr.op, expr.a.dtype, arg)

    def _compare(self, expr: Compare, scope: RenderScope) -> str:
        return f"({self._expr(expr.a, scope)} {CMP[expr.op]} {self._expr(expr.b, scope)})"

    def _select(self, expr: Select, scope: RenderScope) -> str:
        cond = self._expr(expr.cond, scope)
        loads = _hoistable_loads(expr, scope.ranges)
        if not loads:
            return (f"({cond} ? {self._expr(expr.true_value, scope)} : "
                    f"{self._expr(expr.false_value, scope)})")
        return self._blend(expr, cond, loads, scope)

    def _blend(self, expr: Select, cond: str, loads: list[Load], scope: RenderScope) -> str:
        """A select whose loads are in bounds whichever side is taken: the loads first (a GNU
        statement expression), then ``?:`` on values, which gcc vectorizes as a blend; left
        lazy, the loads would sit in branches and keep the loop scalar (a masked softmax)."""
        temps: dict[Expr, Expr] = {}
        decls = []
        for ld in loads:
            var = Var(f"hoisted{next(self._hoisted)}", ld.dtype)
            temps[ld] = var
            decls.append(f"{self.dtype_name(ld.dtype)} {scope.name(var.name)} = "
                         f"{self._expr(ld, scope)};")
        sides = [self._expr(map_expr(e, lambda x: temps.get(x, x)), scope)
                 for e in (expr.true_value, expr.false_value)]
        return f"({{ {' '.join(decls)} {cond} ? {sides[0]} : {sides[1]}; }})"

    def _cast(self, expr: Cast, scope: RenderScope) -> str:
        value = self._expr(expr.value, scope)
        if expr.target is DType.BOOL:
            return f"({value} != 0)"
        return f"(({self.dtype_name(expr.target)}){value})"

    def _math(self, f32_name: str, suffix: str) -> str:
        return f32_name[:-1] if suffix == "drop" else f32_name


def render_c(func: PrimFunc) -> str:
    """C source for ``func`` with the default renderer."""
    return CRenderer().render(func)


# --- helpers ---------------------------------------------------------------------------------


def _nonneg(expr: Expr) -> bool:
    """True when ``expr`` is non-negative in every program: loop/iter vars and their sums."""
    if isinstance(expr, Var):
        return True
    if isinstance(expr, Const):
        return not isinstance(expr.value, bool) and expr.value >= 0
    if isinstance(expr, Binary) and expr.op in (BinOp.ADD, BinOp.MUL, BinOp.FLOORDIV,
                                                BinOp.FLOORMOD, BinOp.MIN, BinOp.MAX):
        return _nonneg(expr.a) and _nonneg(expr.b)
    return False


def _uses(expr: Expr, name: str) -> bool:
    if isinstance(expr, Var):
        return expr.name == name
    if isinstance(expr, Load):
        return any(_uses(i, name) for i in expr.indices)
    if isinstance(expr, (Binary, Compare)):
        return _uses(expr.a, name) or _uses(expr.b, name)
    if isinstance(expr, Unary):
        return _uses(expr.a, name)
    if isinstance(expr, Cast):
        return _uses(expr.value, name)
    if isinstance(expr, Select):
        return any(_uses(e, name) for e in (expr.cond, expr.true_value, expr.false_value))
    return False


def _hoistable_loads(expr: Select, ranges: dict[Var, tuple[int, int]]) -> list[Load]:
    """The loads in the sides of ``expr`` when every one is in bounds for all values of the
    enclosing loop and iter vars (so reading it whichever side is taken is safe); else []."""
    loads = list(dict.fromkeys(e for side in (expr.true_value, expr.false_value)
                               for e in iter_exprs(side) if isinstance(e, Load)))
    for ld in loads:
        for index, extent in zip(ld.indices, ld.buffer.shape):
            box = bounds(index, ranges)
            if box is None or box[0] < 0 or box[1] >= extent:
                return []
    return loads


def _binds_reduce(body: Stmt, loop_var: str) -> bool:
    """Does some block under ``body`` bind a REDUCE iter var to an expression of loop_var?"""
    for stmt in iter_stmts(body):
        if isinstance(stmt, Block):
            for iv, binding in zip(stmt.iter_vars, stmt.bindings):
                if iv.kind is IterKind.REDUCE and _uses(binding, loop_var):
                    return True
    return False
