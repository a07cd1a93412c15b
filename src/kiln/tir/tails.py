"""Bounds checks of tiled programs, lowering steps after compaction (TVM's loop partition and
padding, done where they are provably the same program).

`version_tails` duplicates the body of a loop whose blocks are guarded by bounds checks into a
fast copy without them, taken where the checks hold for every iteration inside, and the
original as the slow copy for the tail::

    for ir in range(2):                            for ir in range(2):
      for i, j:                                      if (ic * 2 + ir) * 14 + 13 < 100:
        block C(...) where (ic*2 + ir)*14 + i < 100  ->  for i, j: block C(...)
                                                     else:
                                                       for i, j: block C(...) where ... < 100

A guard is a conjunct ``e < bound`` of a block predicate with ``e`` affine in loop vars, or
of the condition of a select in a block's store (`rfactor` pads a split row's tail lanes
with the reduction's identity that way: softmax over rows of 197 ran 1.5x slower than over
208 with a test in every chunk); it
holds for the whole body when it holds with every loop var inside the body at the end of its
range that makes ``e`` largest. Only guards that change with the loop's own var are used (a
row guard is versioned at the row-tile loop, a column guard at the column-tile loop), so the
condition is one test per iteration of the loop. A guard with no var inside the body is false
for all of it at once: when every block under the loop has one, there is no slow copy (a K
tail's check becomes one test per K step, which `shrink_tail_tiles` then turns into a
shorter K loop in the last K block).

`shrink_tail_tiles` cuts a loop of such a slow copy down to the iterations that do anything
(the last tile of rows holds M % MR rows); `drop_dead_guards` lets a register tile compute
over its padding (see their docstrings; `kiln.tir.scratch` lets a row pass write its
scratch row's padding).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from fractions import Fraction

from kiln.tir.arith import bounds, linear
from kiln.tir.nodes import (
    INDEX,
    Allocate,
    Block,
    Buffer,
    BufferStore,
    CmpOp,
    Compare,
    Const,
    Expr,
    For,
    ForKind,
    IfThenElse,
    IterKind,
    IterVar,
    PrimFunc,
    Select,
    SeqStmt,
    Stmt,
    Var,
    const,
)
from kiln.tir.primitives.common import loop_vars_of_kind
from kiln.tir.visit import (
    conjoin,
    conjuncts,
    iter_exprs,
    iter_stmts,
    loads_of,
    map_stmt,
    stores_of,
    substitute,
    vars_of,
)

__all__ = ["drop_dead_guards", "shrink_tail_tiles", "version_tails"]

Affine = dict[str, int]  # var name -> coefficient; "" -> constant


def _affine(e: Expr) -> Affine | None:
    form = linear(e)
    if form is None:
        return None
    named = {"" if v is None else v.name: k for v, k in form.items()}
    return {k: v for k, v in named.items() if v or k == ""}


Key = tuple[tuple[tuple[str, int], ...], int]


def _full_key(guard: Expr, inner: dict[str, int], best: bool = False) -> Key | None:
    """The guard ``e < bound`` with the inner loop vars at their worst value (``best``: at
    their best), as a canonical key ``(sorted outer coefficients, constant)`` of
    ``sum coef*var + constant < 0``."""
    if not (isinstance(guard, Compare) and guard.op is CmpOp.LT):
        return None
    a, b = _affine(guard.a), _affine(guard.b)
    if a is None or b is None:
        return None
    diff = dict(a)
    for k, v in b.items():
        diff[k] = diff.get(k, 0) - v
    constant = diff.pop("", 0)
    outer = []
    for name, coef in diff.items():
        if name in inner:
            constant += (min(coef, 0) if best else max(coef, 0)) * (inner[name] - 1)
        elif coef:
            outer.append((name, coef))
    return tuple(sorted(outer)), constant


def _key_expr(key: Key) -> Expr:
    terms, constant = key
    lhs: Expr = const(0, INDEX)
    for name, coef in terms:
        term: Expr = Var(name) if coef == 1 else Var(name) * coef
        lhs = term if lhs == const(0, lhs.dtype) else lhs + term
    return Compare(CmpOp.LT, lhs, const(-constant, lhs.dtype))


Guards = dict[str, list[tuple[Expr, Key | None]]]


def _guards_by_block(body: Stmt) -> tuple[Guards, dict[str, dict[Key | None, Key | None]],
                                          Guards]:
    """Each block's predicate conjuncts with their keys, inner loops being those under body;
    per block, each key's best case (the guard holding for some iteration inside); and each
    block's select conditions' conjuncts (as written, over the block's iter vars) with the
    keys of their bound forms (over the loop vars)."""
    found: Guards = {}
    someone: dict[str, dict[Key | None, Key | None]] = {}
    selects: Guards = {}

    def walk(s: Stmt, inner: dict[str, int]) -> None:
        if isinstance(s, For):
            walk(s.body, {**inner, s.var.name: s.extent})
        elif isinstance(s, Block):
            found[s.name] = [(c, _full_key(c, inner)) for c in conjuncts(s.predicate)]
            someone[s.name] = {_full_key(c, inner): _full_key(c, inner, best=True)
                               for c in conjuncts(s.predicate)}
            bound = {iv.var: b for iv, b in zip(s.iter_vars, s.bindings)}
            selects[s.name] = [(c, _full_key(substitute(c, bound), inner))
                               for c in _select_conditions(s)]
        elif isinstance(s, IfThenElse):
            walk(s.then_body, inner)
            if s.else_body is not None:
                walk(s.else_body, inner)
        else:
            for child in _children(s):
                walk(child, inner)

    walk(body, {})
    return found, someone, selects


def _select_conditions(block: Block) -> list[Expr]:
    """The conjuncts of the conditions of the selects the block's body stores."""
    out: list[Expr] = []
    for s in iter_stmts(block.body):
        for value in [getattr(s, "value", None)]:
            if isinstance(value, Expr):
                out += [c for e in iter_exprs(value) if isinstance(e, Select)
                        for c in conjuncts(e.cond) if c not in out]
    return out


def _without_conditions(e: Expr, dropped: set[Expr]) -> Expr:
    """A select whose condition's conjuncts are all in ``dropped`` as its true side; one with
    some of them, on the others."""
    if not isinstance(e, Select) or not dropped:
        return e
    kept = [c for c in conjuncts(e.cond) if c not in dropped]
    if len(kept) == len(conjuncts(e.cond)):
        return e
    cond = conjoin(*kept)
    return e.true_value if cond is None else Select(cond, e.true_value, e.false_value)


def _children(s: Stmt) -> list[Stmt]:
    if isinstance(s, SeqStmt):
        return list(s.stmts)
    if isinstance(s, Allocate):
        return [s.body]
    return []


def _version(loop: For) -> For:
    guards, someone, selects = _guards_by_block(loop.body)
    # guards that change with this loop (others are versioned at the loop that changes them)
    chosen = {k for conj in (*guards.values(), *selects.values()) for _, k in conj
              if k is not None and any(name == loop.var.name for name, _ in k[0])}
    if not chosen:
        return loop
    dropped: dict[str, set[Expr]] = {name: {c for c, k in conj if k in chosen}
                                     for name, conj in guards.items()}
    dropped_selects = {name: {c for c, k in conj if k in chosen}
                       for name, conj in selects.items()}

    def drop(s: Stmt) -> Stmt:
        if not isinstance(s, Block) or not (dropped.get(s.name) or dropped_selects.get(s.name)):
            return s
        kept = [c for c in conjuncts(s.predicate) if c not in dropped[s.name]]
        body = s.body
        if dropped_selects[s.name]:
            body = map_stmt(body, efn=lambda e, d=dropped_selects[s.name]:
                            _without_conditions(e, d))
        return Block(s.name, s.iter_vars, s.bindings, body, s.init, conjoin(*kept))

    cond = conjoin(*[_key_expr(k) for k in sorted(chosen)])
    assert cond is not None
    fast = map_stmt(loop.body, drop)
    # guards that do not change inside the body are false for all of it or for none of it:
    # where every block has such a guard, the slow copy would do nothing
    exact = all(_full_key(c, {}) == k for conj in guards.values() for c, k in conj
                if k in chosen)
    covered = all(dropped[name] for name in guards)
    slow: Stmt | None = None if exact and covered else loop.body
    # a tail iteration where a guard every block has is false throughout does nothing
    everywhere = [k for k in sorted(chosen) if all(k in keys for keys in someone.values())]
    some = set()
    for k in everywhere:
        bests = {keys[k] for keys in someone.values()}
        if len(bests) == 1 and None not in bests:
            some |= bests
    if slow is not None and some:
        slow = IfThenElse(conjoin(*[_key_expr(k) for k in sorted(some)]), slow)  # type: ignore
    return For(loop.var, loop.extent, IfThenElse(cond, fast, slow), loop.kind)


def version_tails(func: PrimFunc, loops: Sequence[str]) -> PrimFunc:
    """Version the body of every loop named in ``loops`` (in order; a loop copied by an
    earlier versioning is versioned in each copy) on the bounds guards that change with it."""
    body = func.body
    for name in loops:
        body = map_stmt(body, lambda s, n=name: _version(s)
                        if isinstance(s, For) and s.var.name == n else s)
    return func.with_body(body)


def loop_names(func: PrimFunc) -> list[str]:
    return [s.var.name for s in iter_stmts(func.body) if isinstance(s, For)]


# ---------------------------------------------------------------------------------------------
# Tail tiles cut to the rows they hold

# the most assignments of the outer loop vars a tail's guards depend on that are enumerated
SHRINK_MAX_POINTS = 4096


def shrink_tail_tiles(func: PrimFunc) -> PrimFunc:
    """Cut the extent of a serial or unrolled loop to the iterations in which some block under
    it can run: where every block under loop ``i`` has a guard ``e + c*i < bound`` (``c > 0``,
    ``e`` affine in the loops around), and on every path to the loop (the ``if``s of
    `version_tails` above it, taken or not) the outer values give ``i < t`` for some ``t``
    below the extent, the loop runs ``t`` times. Iterations past ``t`` had every block's
    guard false, so this is the same program. It matters in the slow copy of a versioned
    tile loop: the last register tile of a GEMM with M = 49 and MR = 6 starts at row 48, so
    its micro-kernel computes 1 row where it computed 6, padding included
    (`drop_dead_guards`), and the tensorized tile is 1 row tall::

        else:  # not (i0_1 * 6 + 5 < 49)                    else:
          for i0_2 in unrolled(6):                 ->          for i0_2 in unrolled(1):
            block C(...) where i0_1 * 6 + i0_2 < 49              block C(...) where ...

    The outer vars a guard uses are enumerated over their loops' ranges (at most
    `SHRINK_MAX_POINTS` points) and kept where every path condition that depends on them
    alone holds; conditions that depend on other vars are left out, which can only keep
    more points, so ``t`` is never too small. A guard that then holds for every iteration
    below ``t`` at every point kept is dropped (the tail tile of a GEMM that reads A in
    place keeps no check on its rows, and tensorizes). Vectorized and parallel loops are
    left alone (a tensorized tile's columns must stay whole vectors). An ``if`` that is a
    loop's whole body (`version_tails`' one test a K step) guards every block in it: the last
    K block's loop is cut to its steps and loses the test, so it is a register tile too
    (128x512x1376 in K blocks of 464, the last 448: 1451 -> 657 us)."""

    def walk(s: Stmt, loops: dict[str, int], facts: list[Affine]) -> Stmt:
        if isinstance(s, For):
            body = walk(s.body, {**loops, s.var.name: s.extent}, facts)
            if s.kind not in (ForKind.SERIAL, ForKind.UNROLLED):
                return For(s.var, s.extent, body, s.kind)
            extent, implied = _live_iterations(s, body, loops, facts)
            if implied:
                body = map_stmt(body, lambda b: _without(b, implied))
            return For(s.var, extent, body, s.kind)
        if isinstance(s, IfThenElse):
            then_facts, else_facts = _branch_facts(s.cond, facts)
            return IfThenElse(s.cond, walk(s.then_body, loops, then_facts),
                              None if s.else_body is None else
                              walk(s.else_body, loops, else_facts))
        if isinstance(s, Allocate):
            return Allocate(s.buffer, walk(s.body, loops, facts))
        if isinstance(s, SeqStmt):
            return SeqStmt(tuple(walk(x, loops, facts) for x in s.stmts))
        return s

    return func.with_body(walk(func.body, {}, []))


def _less_than_zero(c: Expr) -> Affine | None:
    """An integer comparison as ``sum coef*var + constant < 0``, or None."""
    if not isinstance(c, Compare):
        return None
    a, b = _affine(c.a), _affine(c.b)
    if a is None or b is None:
        return None

    def minus(x: Affine, y: Affine, shift: int) -> Affine:
        out = dict(x)
        for k, v in y.items():
            out[k] = out.get(k, 0) - v
        out[""] = out.get("", 0) + shift
        return out

    forms = {CmpOp.LT: lambda: minus(a, b, 0), CmpOp.LE: lambda: minus(a, b, -1),
             CmpOp.GT: lambda: minus(b, a, 0), CmpOp.GE: lambda: minus(b, a, -1)}
    return forms[c.op]() if c.op in forms else None


def _negated(form: Affine) -> Affine:
    """not (f < 0), that is -f - 1 < 0 over the integers."""
    out = {k: -v for k, v in form.items()}
    out[""] = out.get("", 0) - 1
    return out


def _live_iterations(loop: For, body: Stmt, outer: dict[str, int],
                     facts: list[Affine]) -> tuple[int, set[Expr]]:
    """How many leading iterations of ``loop`` (its body ``body``) can run a block, at most
    its extent, and the guards that hold for all of those iterations wherever the loop runs
    (see `shrink_tail_tiles`)."""
    name = loop.var.name
    unchanged: tuple[int, set[Expr]] = (loop.extent, set())
    blocks = [b for b in iter_stmts(body) if isinstance(b, Block)]
    inner = {f.var.name: f.extent for f in iter_stmts(body) if isinstance(f, For)}
    if not blocks or _stores_outside_blocks(body):
        return unchanged
    # a test of the whole body (`version_tails`' one test a K step) guards every block in it
    step = conjuncts(body.cond) if isinstance(body, IfThenElse) and body.else_body is None \
        else []
    # per block: (the guard, its outer terms and constant, i's coefficient, no inner var)
    guards: list[list[tuple[Expr, Affine, int, bool]]] = []
    for block in blocks:
        usable = []
        for conj in [*conjuncts(block.predicate), *step]:
            form = _less_than_zero(conj)
            if form is None or form.get(name, 0) <= 0 or any(
                    k not in outer and k not in inner for k in form if k not in ("", name)):
                continue
            rest = {"": form.get("", 0)}
            for k, v in form.items():
                if k in inner:  # the inner loops at the values that make the sum least
                    rest[""] += min(v, 0) * (inner[k] - 1)
                elif k not in ("", name):
                    rest[k] = v
            usable.append((conj, rest, form[name], not any(k in inner for k in form)))
        if not usable:
            return unchanged
        guards.append(usable)
    names = sorted({k for usable in guards for _, rest, _, _ in usable for k in rest if k})
    points = 1
    for k in names:
        points *= max(outer[k], 0)
    if not 0 < points <= SHRINK_MAX_POINTS:
        return unchanged
    known = [f for f in facts if set(f) - {""} and set(f) - {""} <= set(names)]
    live = 0
    least: dict[Expr, int] = {}  # each guard's fewest iterations that pass it, over the points
    for values in itertools.product(*(range(outer[k]) for k in names)):
        at = dict(zip(names, values))
        if any(_value(f, at) >= 0 for f in known):
            continue
        for usable in guards:
            # the iterations i with rest + c*i < 0 for every guard: i < ceil(-rest / c)
            runs = [max(-_value(rest, at) + c - 1, 0) // c for _, rest, c, _ in usable]
            live = max(live, min(runs))
            for (conj, *_), n in zip(usable, runs):
                least[conj] = min(least.get(conj, n), n)
        if live >= loop.extent:
            return unchanged
    if live <= 0:
        return unchanged
    implied = {conj for usable in guards for conj, _, _, exact in usable
               if exact and least[conj] >= live}
    return live, implied


def _stores_outside_blocks(s: Stmt) -> bool:
    """Whether ``s`` stores anywhere but inside a block: `plan.ZeroPadding`'s zeros where a
    pack's guard fails, which run in the iterations no block's guard lets through (a block
    of 64 queries holding 49: cut to 49 iterations, the pack left 15 lanes of whatever its
    memory held, subnormal floats there made each multiply-add of the scores a microcode
    assist, 8 heads x 49 x 196 keys 0.80 against 0.13 ms for 64 queries)."""
    if isinstance(s, BufferStore):
        return True
    if isinstance(s, (For, Allocate)):
        return _stores_outside_blocks(s.body)
    if isinstance(s, SeqStmt):
        return any(_stores_outside_blocks(x) for x in s.stmts)
    if isinstance(s, IfThenElse):
        return _stores_outside_blocks(s.then_body) or (
            s.else_body is not None and _stores_outside_blocks(s.else_body))
    return False


def _without(s: Stmt, implied: set[Expr]) -> Stmt:
    """A block with the guards in ``implied`` taken out of its predicate; an ``if`` without
    an else, with them taken out of its test (and gone where nothing is left of it)."""
    if isinstance(s, IfThenElse) and s.else_body is None and implied & set(conjuncts(s.cond)):
        rest = [c for c in conjuncts(s.cond) if c not in implied]
        return IfThenElse(conjoin(*rest), s.then_body) if rest else s.then_body
    if not isinstance(s, Block) or not implied & set(conjuncts(s.predicate)):
        return s
    kept = [c for c in conjuncts(s.predicate) if c not in implied]
    return Block(s.name, s.iter_vars, s.bindings, s.body, s.init, conjoin(*kept))


def _value(form: Affine, at: dict[str, int]) -> int:
    return sum(v * at[k] for k, v in form.items() if k) + form.get("", 0)


# ---------------------------------------------------------------------------------------------
# Padded register tiles


def drop_dead_guards(func: PrimFunc) -> PrimFunc:
    """Let a block that only touches allocated buffers run over its whole tile: a bounds guard
    on an output position of the block is dropped when every other block that reads that
    position is guarded by the same test (so the values computed there are never used) and
    every access stays inside its (compacted) buffer. This is the zero-cost padding of a
    register tile::

        for i in unrolled(14):                      for i in unrolled(14):
          for j in vectorized(32):                    for j in vectorized(32):
            block C(vi0 = r*14 + i, ...)       ->       block C(vi0 = r*14 + i, ...):
                where r*14 + i < 100:                     acc[i, j] = acc[i, j] + ...
              acc[i, j] = acc[i, j] + ...
        ... C[...] = acc[i2, j2] where r*14 + i2 < 100   (unchanged)

    Guards on reduction positions are never dropped (the extra terms would reach used
    values), nor guards of a block that writes a function parameter (one that reads a
    parameter, such as B prepacked in zero-padded panels, must stay inside it). The block's
    iter var domains widen to the padded ranges, so the reference interpreter still checks
    every binding and access."""
    params = set(func.params)

    Scoped = tuple[Allocate, list[For]]  # an allocation and the loops around it

    def walk(s: Stmt, loops: list[For], allocs: list[Scoped], facts: list[Affine]) -> Stmt:
        if isinstance(s, For):
            return For(s.var, s.extent, walk(s.body, [*loops, s], allocs, facts), s.kind)
        if isinstance(s, Allocate):
            return Allocate(s.buffer, walk(s.body, loops, [*allocs, (s, loops)], facts))
        if isinstance(s, SeqStmt):
            return SeqStmt(tuple(walk(x, loops, allocs, facts) for x in s.stmts))
        if isinstance(s, IfThenElse):
            then_facts, else_facts = _branch_facts(s.cond, facts)
            return IfThenElse(s.cond, walk(s.then_body, loops, allocs, then_facts),
                              None if s.else_body is None else
                              walk(s.else_body, loops, allocs, else_facts))
        if isinstance(s, Block):
            stores = stores_of(s.body)
            # the blocks that see the same allocation (a versioned copy has its own)
            scope = next(((a, outer) for a, outer in reversed(allocs) if stores
                          and a.buffer == stores[0].buffer), None)
            if scope is not None:
                others = [b for b in iter_stmts(scope[0]) if isinstance(b, Block)]
                return _unguarded(s, loops, scope[1], others, params, facts)
        return s

    return func.with_body(walk(func.body, [], [], []))


def _branch_facts(cond: Expr, facts: list[Affine]) -> tuple[list[Affine], list[Affine]]:
    """The facts that hold in the then and the else branch of ``if cond``."""
    conds = [_less_than_zero(c) for c in conjuncts(cond)]
    then_facts = facts + [c for c in conds if c is not None]
    negated = _negated(conds[0]) if len(conds) == 1 and conds[0] is not None else None
    return then_facts, facts + ([negated] if negated is not None else [])


def _upper_bound(e: Expr, ranges: dict[str, int], facts: Sequence[Affine]) -> int | None:
    """The largest value of affine ``e`` over the loops (name -> extent) where every fact
    ``f < 0`` holds; None where no fact bounds it. Over the integers ``f <= -1``, so for any
    ``c > 0``, ``e = (e - c*f) + c*f <= max(e - c*f) - c``; ``c`` is tried at the ratios of
    ``e``'s coefficients to ``f``'s. The tests of `version_tails` are such facts: a GEMM's
    full row tiles stop short of M, so a column tail tile under them reads A only in its
    rows, and ``(jc * 2 + jr) * 16 < 40`` keeps a packed B's panel index below 3."""
    form = _affine(e)
    if form is None:
        return None
    best = None
    for fact in map(_tightened, facts):
        for c in {Fraction(v, fact[k]) for k, v in form.items()
                  if k and fact.get(k, 0) and Fraction(v, fact[k]) > 0}:
            diff = {k: Fraction(v) for k, v in form.items()}
            for k, v in fact.items():
                diff[k] = diff.get(k, Fraction(0)) - c * v
            if any(k and v and k not in ranges for k, v in diff.items()):
                continue
            top = diff.get("", 0) + sum(max(v, 0) * (ranges[k] - 1)
                                        for k, v in diff.items() if k) - c
            best = math.floor(top) if best is None else min(best, math.floor(top))
    return best


def _tightened(fact: Affine) -> Affine:
    """``g + k < 0`` with the constant moved down to the largest multiple of the gcd of
    ``g``'s coefficients: ``12*i + 6*j < 50`` is ``12*i + 6*j <= 48`` (the last tile of
    6 rows starts at row 48 at most)."""
    step = math.gcd(*(v for k, v in fact.items() if k))
    if step <= 1:
        return fact
    top = (-fact.get("", 0) - 1) // step * step  # the largest g allowed
    return {**fact, "": -top - 1}


def _unguarded(block: Block, loops: list[For], shared: list[For], others: list[Stmt],
               params: set[Buffer], facts: Sequence[Affine] = ()) -> Block:
    """``block`` with its dead guards dropped; ``loops`` are around it, ``shared`` around the
    allocation it writes (the loops every reader of the allocation sees with the same
    values), ``others`` the blocks under that allocation, ``facts`` the tests of the ``if``s
    around it (as ``f < 0``)."""
    conj = conjuncts(block.predicate)
    if not conj or block.init is not None:
        return block
    stores = stores_of(block.body)
    loads = loads_of(block.body)
    # (a parameter is read in place only inside its bounds, checked below: a GEMM's B
    # prepacked with zero-padded panels; it is never written here)
    if len(stores) != 1 or any(x.buffer in params for x in stores):
        return block
    out = stores[0]
    # (a constant index: a dim of extent 1, as a batched GEMM's tile has, C_local[0, i, j])
    if not all(isinstance(i, (Var, Const)) for i in out.indices):
        return block
    if any(ld.buffer == out.buffer and ld.indices != out.indices for ld in loads):
        return block
    reduce_vars = {v.name for v in loop_vars_of_kind(block, IterKind.REDUCE)}
    position = {v.name for v in out.indices if isinstance(v, Var)}
    readers = [b for b in others if isinstance(b, Block) and b is not block
               and any(ld.buffer == out.buffer for ld in loads_of(b.body))]
    dead = []
    outside = {f.var.name for f in shared}
    for g in conj:
        names = {v.name for v in vars_of(g)}
        if not names & position or names & reduce_vars or names - position - outside:
            continue
        if all(_guarded_alike(g, out.indices, r, out.buffer) for r in readers):
            dead.append(g)
    if not dead:
        return block
    ranges = {f.var: (0, max(f.extent - 1, 0)) for f in loops}
    # (an index in the block's iter vars is bounded through their bindings: a GEMM's A read
    # in place, A[vi0, vk0])
    bound = {iv.var: b for iv, b in zip(block.iter_vars, block.bindings)}
    extents = {f.var.name: f.extent for f in loops}
    for access in [*stores, *loads]:
        for idx, extent in zip(access.indices, access.buffer.shape):
            at = substitute(idx, bound)
            box = bounds(at, ranges)
            if box is None or box[0] < 0:
                return block
            if box[1] >= extent:
                top = _upper_bound(at, extents, facts)
                if top is None or top >= extent:
                    return block
    freed = set().union(*(vars_of(g) for g in dead))
    ivs = []
    for iv, b in zip(block.iter_vars, block.bindings):
        box = bounds(b, ranges)
        if box is None:
            return block
        wide = max(iv.extent, box[1] + 1) if vars_of(b) & freed else iv.extent
        ivs.append(IterVar(iv.var, wide, iv.kind))
    kept = [c for c in conj if c not in dead]
    return Block(block.name, tuple(ivs), block.bindings, block.body, None, conjoin(*kept))


def _guarded_alike(guard: Expr, position: tuple[Expr, ...], reader: Block,
                   buffer: Buffer) -> bool:
    """Does every read of ``buffer`` in ``reader`` happen under ``guard`` (renamed from the
    writer's position vars to the reader's indices)?"""
    reads = [ld for ld in loads_of(reader.body) if ld.buffer == buffer]
    conj = conjuncts(reader.predicate)
    for ld in reads:
        renamed = substitute(guard, {p: i for p, i in zip(position, ld.indices)
                                     if isinstance(p, Var)})
        if renamed not in conj:
            return False
    return True
