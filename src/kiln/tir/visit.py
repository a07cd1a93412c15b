"""Generic traversal of loop IR: rebuild expressions/statements bottom-up, substitute
variables, collect loads and stores. Nodes are immutable, so every rewrite returns a new tree
(or the same object where nothing changed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from kiln.tir.nodes import (
    Allocate,
    Binary,
    BinOp,
    Block,
    Buffer,
    BufferStore,
    Cast,
    Compare,
    Expr,
    For,
    IfThenElse,
    Load,
    Prefetch,
    Select,
    SeqStmt,
    Stmt,
    Tensorized,
    Unary,
    Var,
)

ExprFn = Callable[[Expr], Expr]
StmtFn = Callable[[Stmt], Stmt]


def map_expr(expr: Expr, fn: ExprFn) -> Expr:
    """Rebuild ``expr`` bottom-up, applying ``fn`` to every node after its children."""
    if isinstance(expr, Load):
        indices = tuple(map_expr(i, fn) for i in expr.indices)
        expr = expr if indices == expr.indices else Load(expr.buffer, indices)
    elif isinstance(expr, Binary):
        a, b = map_expr(expr.a, fn), map_expr(expr.b, fn)
        expr = expr if (a is expr.a and b is expr.b) else Binary(expr.op, a, b)
    elif isinstance(expr, Compare):
        a, b = map_expr(expr.a, fn), map_expr(expr.b, fn)
        expr = expr if (a is expr.a and b is expr.b) else Compare(expr.op, a, b)
    elif isinstance(expr, Unary):
        a = map_expr(expr.a, fn)
        expr = expr if a is expr.a else Unary(expr.op, a)
    elif isinstance(expr, Cast):
        v = map_expr(expr.value, fn)
        expr = expr if v is expr.value else Cast(expr.target, v)
    elif isinstance(expr, Select):
        c = map_expr(expr.cond, fn)
        t, f = map_expr(expr.true_value, fn), map_expr(expr.false_value, fn)
        if not (c is expr.cond and t is expr.true_value and f is expr.false_value):
            expr = Select(c, t, f)
    return fn(expr)


def map_stmt(stmt: Stmt, fn: StmtFn = lambda s: s, efn: ExprFn | None = None) -> Stmt:
    """Rebuild ``stmt`` bottom-up: ``efn`` on every expression, ``fn`` on every statement."""

    def ex(e: Expr) -> Expr:
        return map_expr(e, efn) if efn is not None else e

    def opt(e: Expr | None) -> Expr | None:
        return None if e is None else ex(e)

    def sub(s: Stmt | None) -> Stmt | None:
        return None if s is None else map_stmt(s, fn, efn)

    new: Stmt = stmt
    if isinstance(stmt, BufferStore):
        indices, value = tuple(ex(i) for i in stmt.indices), ex(stmt.value)
        if value is not stmt.value or not _same(indices, stmt.indices):
            new = BufferStore(stmt.buffer, indices, value)
    elif isinstance(stmt, For):
        body, stop = map_stmt(stmt.body, fn, efn), opt(stmt.stop)
        if body is not stmt.body or stop is not stmt.stop:
            new = For(stmt.var, stmt.extent, body, stmt.kind, stop)
    elif isinstance(stmt, Block):
        bindings, body = tuple(ex(b) for b in stmt.bindings), map_stmt(stmt.body, fn, efn)
        init, pred = sub(stmt.init), opt(stmt.predicate)
        if not (_same(bindings, stmt.bindings) and body is stmt.body and init is stmt.init
                and pred is stmt.predicate):
            new = Block(stmt.name, stmt.iter_vars, bindings, body, init, pred)
    elif isinstance(stmt, SeqStmt):
        parts = tuple(map_stmt(s, fn, efn) for s in stmt.stmts)
        if not _same(parts, stmt.stmts):
            new = seq_of(parts)
    elif isinstance(stmt, Allocate):
        body = map_stmt(stmt.body, fn, efn)
        if body is not stmt.body:
            new = Allocate(stmt.buffer, body)
    elif isinstance(stmt, IfThenElse):
        cond, then, other = ex(stmt.cond), map_stmt(stmt.then_body, fn, efn), sub(stmt.else_body)
        if not (cond is stmt.cond and then is stmt.then_body and other is stmt.else_body):
            new = IfThenElse(cond, then, other)
    elif isinstance(stmt, Prefetch):
        indices = tuple(ex(i) for i in stmt.indices)
        if not _same(indices, stmt.indices):
            new = Prefetch(stmt.buffer, indices, stmt.lines, stmt.locality)
    elif isinstance(stmt, Tensorized):
        init = sub(stmt.init)
        loop = map_stmt(stmt.loop, fn, efn)
        back = sub(stmt.write_back)
        if loop is not stmt.loop or back is not stmt.write_back or init is not stmt.init:
            # (a rewrite that leaves no loop leaves no intrinsic)
            new = Tensorized(stmt.intrinsic, stmt.lanes, loop, back, init) \
                if isinstance(loop, For) else \
                seq_of(([init] if init is not None else []) + [loop] +
                       ([back] if back is not None else []))
    else:
        raise TypeError(f"unknown statement {type(stmt).__name__}")
    return fn(new)


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def seq_of(parts: tuple[Stmt, ...] | list[Stmt]) -> Stmt:
    """A flattened sequence; empty sequences vanish, one statement stays itself."""
    flat: list[Stmt] = []
    for p in parts:
        flat.extend(p.stmts if isinstance(p, SeqStmt) else (p,))
    return flat[0] if len(flat) == 1 else SeqStmt(tuple(flat))


def substitute(node: Expr, mapping: Mapping[Var, Expr]) -> Expr:
    """``node`` with every Var in ``mapping`` replaced."""
    if not mapping:
        return node
    return map_expr(node, lambda e: mapping.get(e, e) if isinstance(e, Var) else e)


def substitute_stmt(stmt: Stmt, mapping: Mapping[Var, Expr]) -> Stmt:
    if not mapping:
        return stmt
    return map_stmt(stmt, efn=lambda e: mapping.get(e, e) if isinstance(e, Var) else e)


def replace_buffer(stmt: Stmt, old: Buffer, new: Buffer,
                   index_fn: Callable[[tuple[Expr, ...]], tuple[Expr, ...]] | None = None) -> Stmt:
    """Every load/store of ``old`` goes to ``new``, indices mapped through ``index_fn``."""
    fix = index_fn or (lambda idx: idx)

    def efn(e: Expr) -> Expr:
        if isinstance(e, Load) and e.buffer == old:
            return Load(new, fix(e.indices))
        return e

    def sfn(s: Stmt) -> Stmt:
        if isinstance(s, BufferStore) and s.buffer == old:
            return BufferStore(new, fix(s.indices), s.value)
        if isinstance(s, Allocate) and s.buffer == old:
            return Allocate(new, s.body)
        return s

    return map_stmt(stmt, sfn, efn)


def iter_exprs(node: Expr) -> Iterator[Expr]:
    """Every sub-expression of ``node``, pre-order."""
    yield node
    if isinstance(node, Load):
        for i in node.indices:
            yield from iter_exprs(i)
    elif isinstance(node, (Binary, Compare)):
        yield from iter_exprs(node.a)
        yield from iter_exprs(node.b)
    elif isinstance(node, Unary):
        yield from iter_exprs(node.a)
    elif isinstance(node, Cast):
        yield from iter_exprs(node.value)
    elif isinstance(node, Select):
        yield from iter_exprs(node.cond)
        yield from iter_exprs(node.true_value)
        yield from iter_exprs(node.false_value)


def iter_stmts(stmt: Stmt) -> Iterator[Stmt]:
    """Every statement under ``stmt`` (itself included), pre-order; block inits too."""
    yield stmt
    if isinstance(stmt, (For, Allocate)):
        yield from iter_stmts(stmt.body)
    elif isinstance(stmt, Tensorized):
        if stmt.init is not None:
            yield from iter_stmts(stmt.init)
        yield from iter_stmts(stmt.loop)
        if stmt.write_back is not None:
            yield from iter_stmts(stmt.write_back)
    elif isinstance(stmt, Block):
        if stmt.init is not None:
            yield from iter_stmts(stmt.init)
        yield from iter_stmts(stmt.body)
    elif isinstance(stmt, SeqStmt):
        for s in stmt.stmts:
            yield from iter_stmts(s)
    elif isinstance(stmt, IfThenElse):
        yield from iter_stmts(stmt.then_body)
        if stmt.else_body is not None:
            yield from iter_stmts(stmt.else_body)


def stmt_exprs(stmt: Stmt) -> Iterator[Expr]:
    """The expressions held directly by one statement (not by nested statements)."""
    if isinstance(stmt, BufferStore):
        yield from stmt.indices
        yield stmt.value
    elif isinstance(stmt, Prefetch):
        yield from stmt.indices
    elif isinstance(stmt, Block):
        yield from stmt.bindings
        if stmt.predicate is not None:
            yield stmt.predicate
    elif isinstance(stmt, IfThenElse):
        yield stmt.cond
    elif isinstance(stmt, For) and stmt.stop is not None:
        yield stmt.stop


def all_exprs(stmt: Stmt) -> Iterator[Expr]:
    for s in iter_stmts(stmt):
        for e in stmt_exprs(s):
            yield from iter_exprs(e)


def loads_of(stmt: Stmt) -> list[Load]:
    return [e for e in all_exprs(stmt) if isinstance(e, Load)]


def stores_of(stmt: Stmt) -> list[BufferStore]:
    return [s for s in iter_stmts(stmt) if isinstance(s, BufferStore)]


def vars_of(node: Expr) -> set[Var]:
    return {e for e in iter_exprs(node) if isinstance(e, Var)}


def replace_node(root: Stmt, target: Stmt, new: Stmt) -> Stmt:
    """``root`` with the statement object ``target`` (by identity) replaced by ``new``."""
    found = False

    def walk(s: Stmt) -> Stmt:
        nonlocal found
        if s is target:
            found = True
            return new
        if isinstance(s, For):
            body = walk(s.body)
            return s if body is s.body else For(s.var, s.extent, body, s.kind, s.stop)
        if isinstance(s, Allocate):
            body = walk(s.body)
            return s if body is s.body else Allocate(s.buffer, body)
        if isinstance(s, SeqStmt):
            parts = tuple(walk(x) for x in s.stmts)
            return s if _same(parts, s.stmts) else seq_of(parts)
        if isinstance(s, IfThenElse):
            then = walk(s.then_body)
            other = None if s.else_body is None else walk(s.else_body)
            if then is s.then_body and other is s.else_body:
                return s
            return IfThenElse(s.cond, then, other)
        if isinstance(s, Block):
            body = walk(s.body)
            return s if body is s.body else Block(s.name, s.iter_vars, s.bindings, body,
                                                  s.init, s.predicate)
        return s

    result = walk(root)
    if not found:
        raise ValueError("statement to replace is not in the tree")
    return result


def fresh(taken: set[str], base: str) -> str:
    """``base``, or ``base_1``, ``base_2`` ... whichever is not in ``taken``; records it."""
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def conjuncts(e: Expr | None) -> list[Expr]:
    """The terms of a predicate ``a and b and ...`` (none for no predicate)."""
    if e is None:
        return []
    if isinstance(e, Binary) and e.op is BinOp.AND:
        return conjuncts(e.a) + conjuncts(e.b)
    return [e]


def conjoin(*conds: Expr | None) -> Expr | None:
    """``a and b and ...`` of the given conditions, skipping None (None if none is left)."""
    out: Expr | None = None
    for c in conds:
        if c is not None:
            out = c if out is None else Binary(BinOp.AND, out, c)
    return out
