"""Readable text for loop IR, Python-flavoured; used in docstrings, tests and reports.

    def mm(A: f32[4, 3], B: f32[3, 5], C: f32[4, 5]):
      for i0 in range(4):
        for i1 in range(5):
          for k0 in range(3):
            block C(vi0: spatial[4] = i0, vi1: spatial[5] = i1, vk0: reduce[3] = k0):
              init:
                C[vi0, vi1] = 0.0
              C[vi0, vi1] = C[vi0, vi1] + A[vi0, vk0] * B[vk0, vi1]

Loop kinds print as ``range``, ``parallel``, ``vectorized``, ``unrolled``; an Allocate as
``alloc NAME: f32[2, 3] local:`` around the statements that may use it.
"""

from __future__ import annotations

import math

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

INDENT = "  "
_LOOP_WORD = {ForKind.SERIAL: "range", ForKind.PARALLEL: "parallel",
              ForKind.PARALLEL_DYNAMIC: "parallel_dynamic", ForKind.VECTORIZED: "vectorized",
              ForKind.UNROLLED: "unrolled"}
_PREC = {BinOp.OR: 1, BinOp.AND: 2, BinOp.ADD: 5, BinOp.SUB: 5, BinOp.MUL: 6, BinOp.DIV: 6,
         BinOp.FLOORDIV: 6, BinOp.FLOORMOD: 6}
_CMP_PREC = 4
_ATOM = 9


def buffer_type(buf: Buffer) -> str:
    text = f"{buf.dtype.value}[{', '.join(map(str, buf.shape))}]"
    if buf.strides is not None:
        text += f" strides({', '.join(map(str, buf.strides))})"
    if buf.scope is not Scope.GLOBAL:
        text += f" {buf.scope.value}"
    return text


def print_func(func: PrimFunc) -> str:
    params = ", ".join(f"{b.name}: {buffer_type(b)}" for b in func.params)
    lines = [f"def {func.name}({params}):"]
    _stmt(func.body, 1, lines)
    return "\n".join(lines) + "\n"


def print_stmt(stmt: Stmt, indent: int = 0) -> str:
    lines: list[str] = []
    _stmt(stmt, indent, lines)
    return "\n".join(lines) + "\n"


def _stmt(s: Stmt, depth: int, out: list[str]) -> None:
    pad = INDENT * depth
    if isinstance(s, SeqStmt):
        if not s.stmts:
            out.append(pad + "pass")
        for part in s.stmts:
            _stmt(part, depth, out)
    elif isinstance(s, For):
        stop = "" if s.stop is None else f", stop={print_expr(s.stop)}"
        out.append(f"{pad}for {s.var.name} in {_LOOP_WORD[s.kind]}({s.extent}{stop}):")
        _stmt(s.body, depth + 1, out)
    elif isinstance(s, Block):
        ivs = ", ".join(f"{iv.var.name}: {iv.kind.value}[{iv.extent}] = {print_expr(b)}"
                        for iv, b in zip(s.iter_vars, s.bindings))
        where = "" if s.predicate is None else f" where {print_expr(s.predicate)}"
        out.append(f"{pad}block {s.name}({ivs}){where}:")
        if s.init is not None:
            out.append(f"{pad}{INDENT}init:")
            _stmt(s.init, depth + 2, out)
        _stmt(s.body, depth + 1, out)
    elif isinstance(s, BufferStore):
        out.append(f"{pad}{_access(s.buffer, s.indices)} = {print_expr(s.value)}")
    elif isinstance(s, Prefetch):
        out.append(f"{pad}prefetch {_access(s.buffer, s.indices)} ({s.lines} lines, "
                   f"locality {s.locality})")
    elif isinstance(s, Tensorized):
        out.append(f"{pad}tensorized {s.intrinsic.value}(lanes={s.lanes}):")
        if s.init is not None:
            out.append(f"{pad}  init into the registers:")
            _stmt(s.init, depth + 1, out)
        _stmt(s.loop, depth + 1, out)
        if s.write_back is not None:
            out.append(f"{pad}  write-back from the registers:")
            _stmt(s.write_back, depth + 1, out)
    elif isinstance(s, Allocate):
        out.append(f"{pad}alloc {s.buffer.name}: {buffer_type(s.buffer)}:")
        _stmt(s.body, depth + 1, out)
    elif isinstance(s, IfThenElse):
        out.append(f"{pad}if {print_expr(s.cond)}:")
        _stmt(s.then_body, depth + 1, out)
        if s.else_body is not None:
            out.append(f"{pad}else:")
            _stmt(s.else_body, depth + 1, out)
    else:
        raise TypeError(f"unknown statement {type(s).__name__}")


def print_expr(e: Expr) -> str:
    return _expr(e)[0]


def _access(buf: Buffer, indices: tuple[Expr, ...]) -> str:
    return f"{buf.name}[{', '.join(print_expr(i) for i in indices)}]"


def _const(c: Const) -> str:
    v = c.value
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    return str(v)


def _expr(e: Expr) -> tuple[str, int]:
    """Text and precedence of an expression (higher binds tighter)."""
    if isinstance(e, Var):
        return e.name, _ATOM
    if isinstance(e, Const):
        text = _const(e)
        return text, (_ATOM if not text.startswith("-") else 7)
    if isinstance(e, Load):
        return _access(e.buffer, e.indices), _ATOM
    if isinstance(e, Binary):
        if not e.op.is_infix:
            return f"{e.op.value}({print_expr(e.a)}, {print_expr(e.b)})", _ATOM
        prec = _PREC[e.op]
        # left-associative: the right operand needs parentheses at equal precedence
        return f"{_wrap(e.a, prec)} {e.op.value} {_wrap(e.b, prec + 1)}", prec
    if isinstance(e, Compare):
        return f"{_wrap(e.a, _CMP_PREC + 1)} {e.op.value} {_wrap(e.b, _CMP_PREC + 1)}", _CMP_PREC
    if isinstance(e, Unary):
        if e.op is UnOp.NEG:
            return f"-{_wrap(e.a, 8)}", 7
        if e.op is UnOp.NOT:
            return f"not {_wrap(e.a, 3)}", 3
        return f"{e.op.value}({print_expr(e.a)})", _ATOM
    if isinstance(e, Cast):
        return f"{e.target.value}({print_expr(e.value)})", _ATOM
    if isinstance(e, Select):
        return (f"select({print_expr(e.cond)}, {print_expr(e.true_value)}, "
                f"{print_expr(e.false_value)})", _ATOM)
    raise TypeError(f"unknown expression {type(e).__name__}")


def _wrap(e: Expr, min_prec: int) -> str:
    text, prec = _expr(e)
    return text if prec >= min_prec else f"({text})"
