"""C for the intrinsics of `kiln.tir.tensorize`: GNU C vector types, which gcc and clang map
to the target's registers (zmm, ymm, xmm or NEON; plain scalars where there is no SIMD).

`Intrinsic.FMA_TILE` on a 2 x 16 tile of 8-lane vectors, over ``p``::

    {  /* fma_tile: 2 x 16 register tile on 8-lane vectors */
      typedef float kiln_f32x8 __attribute__((vector_size(32)));
      typedef float kiln_f32x8u __attribute__((vector_size(32), aligned(4), may_alias));
      kiln_f32x8 fma0_acc0_0 = *(const kiln_f32x8u*)&C_local[0];
      ... (one accumulator per row and vector)
      #pragma GCC unroll 1
      for (int64_t p = 0; p < 384; ++p) {
        kiln_f32x8 fma0_b0 = *(const kiln_f32x8u*)&B[p * 16]; KILN_IN_REGISTER_32(fma0_b0);
        kiln_f32x8 fma0_b1 = *(const kiln_f32x8u*)&B[p * 16 + 8]; KILN_IN_REGISTER_32(fma0_b1);
        { const float fma0_a = A_local[p * 2]; fma0_acc0_0 += fma0_a * fma0_b0; ... }
        { const float fma0_a = A_local[p * 2 + 1]; fma0_acc1_0 += fma0_a * fma0_b0; ... }
      }
      *(kiln_f32x8u*)&C_local[0] = fma0_acc0_0;
      ...
      __asm__ volatile("" ::: "memory");
    }

A tile of at most 4 rows pins its b vectors in registers (`c_prelude`'s KILN_IN_REGISTER_*)
where they fit beside the accumulators: gcc folded each use into a load (Zen 3, AVX2, a 4 x 24
GEMM tile: 3136x96x24 110 -> 83 us). Taller tiles are left to gcc, which keeps b in registers
there (6 x 16 conv tiles measured 0-1.6% slower pinned); so are depthwise tiles (7x7 over
14x14x512 161 us pinned, 150 not).

``acc += a * b`` contracts to one fused multiply-add under gcc's default -ffp-contract=fast,
as the loop it replaces did, so each accumulator sees the same operations in the same order;
except in a short tile (fewer than `FMA_CHAINS` accumulators: the last M % MR rows of a GEMM,
see `kiln.tir.tails.shrink_tail_tiles`), whose steps go round-robin into several sets of
accumulators that are added after the loop, as a reassociated sum (ATen's GEMMs sum in an
order of their own too). The extra sets start at -0.0, so a sum of -0.0 stays -0.0.
The unaligned vector type reads and writes any float address (a packed panel's row, an
accumulator tile in a stack array).
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.codegen.isa import Isa
from kiln.tir.arith import simplify
from kiln.tir.nodes import INDEX, Binary, BinOp, Const, Expr, For, Load, Stmt, Var, const
from kiln.tir.tensorize import (
    AccInit,
    FmaTile,
    WriteBack,
    group_masks,
    load_at,
    loop_points,
    moves_by,
)
from kiln.tir.visit import substitute, substitute_stmt

__all__ = ["fma_tile_lines"]

INDENT = "  "
# independent FMA chains that keep both FMA pipes busy: 4 cycles of latency x 2 pipes
# (Zen 3, Zen 4, Skylake-X); a 1 x 16 AVX2 tile, 2 chains, waits on each step
FMA_CHAINS = 8


def loop_bound(loop: For, expr: Callable[[Expr], str]) -> str:
    """The C bound of ``loop``: its extent, or the lesser of it and its run-time ``stop``."""
    if loop.stop is None:
        return str(loop.extent)
    stop = f"(int64_t)({expr(loop.stop)})"
    return f"({stop} < {loop.extent} ? {stop} : {loop.extent})"


def fma_tile_lines(tile: FmaTile, lanes: int, access: Callable[[Load], str],
                   expr: Callable[[Expr], str], stmt: Callable[[Stmt], list[str]],
                   name: Callable[[str], str], prefix: str,
                   write_back: WriteBack | None = None,
                   init: AccInit | None = None) -> list[str]:
    """The C lines of ``tile`` on ``lanes``-wide vectors. The callables are the renderer's:
    ``access`` renders a load as ``buf[index]``, ``expr`` an expression, ``stmt`` a statement
    (the prefetch hints) and ``name`` the C name of a tir name; the tile's own variables are
    named from ``prefix``, which no tir name of the function has. With ``write_back`` the
    accumulators also go to its targets, through its activation on the vectors; with
    ``init`` they start from its values, not from the accumulator buffer."""
    j = tile.cols.var
    points = loop_points(tile.rows)  # the rows in loop order
    rows, vectors = len(points), tile.cols.extent // lanes
    vec, unaligned = f"kiln_f32x{lanes}", f"kiln_f32x{lanes}u"
    size = 4 * lanes
    acc = [[name(f"{prefix}acc{r}_{v}") for v in range(vectors)] for r in range(rows)]
    b = [name(f"{prefix}b{v}") for v in range(vectors)]
    a = name(f"{prefix}a")
    lines = [f"{{  /* fma_tile: {rows} x {tile.cols.extent} register tile on {lanes}-lane "
             f"vectors */",
             f"{INDENT}typedef float {vec} __attribute__((vector_size({size})));",
             f"{INDENT}typedef float {unaligned} __attribute__((vector_size({size}), "
             f"aligned(4), may_alias));"]
    homes = [[access(load_at(tile.acc, {**points[r], j: v * lanes})) for v in range(vectors)]
             for r in range(rows)]
    # the extra sets start at -0.0, which adds nothing to any value (-0.0 included)
    zero = "{" + ", ".join(["-0.0f"] * lanes) + "}"
    for r in range(rows):
        for v in range(vectors):
            first = f"*(const {unaligned}*)&{homes[r][v]}" if init is None else \
                _init_vector(init, init.points[r][v], vec, unaligned, zero, access, expr)
            lines.append(f"{INDENT}{vec} {acc[r][v]} = {first};")
    sets = _accumulator_sets(tile, rows, vectors, lanes)
    inner = tile.k[-1]
    pin = (not tile.a_is_vector and not tile.a_group and rows <= 4
           and _registers(lanes) >= sets * rows * vectors + vectors + 1)
    for step in range(1, sets):
        for r in range(rows):
            for v in range(vectors):
                lines.append(f"{INDENT}{vec} {acc[r][v]}_{step} = {zero};")

    def step_lines(step: int) -> list[str]:
        """One step of the innermost loop, ``step`` iterations on, into set ``step``."""
        at = {inner.var: inner.var + const(step, INDEX)} if step else {}
        suffix = f"_{step}" if step else ""
        out = [line for hint in tile.hints for line in stmt(substitute_stmt(hint, at))]
        for v in range(vectors):
            row = access(_shifted(load_at(tile.b, {j: v * lanes}), at))
            if pin:  # (the tile, its b vectors and a broadcast fit the registers: keep them)
                out.append(f"{vec} {b[v]} = *(const {unaligned}*)&{row}; "
                           f"KILN_IN_REGISTER_{size}({b[v]});")
            else:
                out.append(f"const {vec} {b[v]} = *(const {unaligned}*)&{row};")
        for r in range(rows):
            if tile.a_is_vector:  # one vector of a per accumulator
                for v in range(vectors):
                    row = access(_shifted(load_at(tile.a, {**points[r], j: v * lanes}), at))
                    out.append(f"{acc[r][v]}{suffix} += *(const {unaligned}*)&{row} * {b[v]};")
                continue
            fmas = " ".join(f"{acc[r][v]}{suffix} += {a} * {b[v]};" for v in range(vectors))
            out.append(f"{{ const float {a} = {expr(_shifted(load_at(tile.a, points[r]), at))};"
                       f" {fmas} }}")
        return out if sets == 1 else ["{ " + " ".join(out) + " }"]

    def group_lines() -> list[str]:
        """One step of a group-broadcast tile's loops outside its innermost, that loop
        unrolled: each step's b vectors, then per accumulator vector one load of a (the
        innermost loop at 0) shuffled within its groups once per step (`group_masks`:
        gcc makes each an in-lane vpermilps), in the order of the loop it replaces."""
        zero_at = {inner.var: const(0, INDEX)}
        masks = group_masks(tile, lanes)
        out = []
        for c in range(len(masks)):
            at = {inner.var: const(c, INDEX)}
            out += [line for hint in tile.hints for line in stmt(substitute_stmt(hint, at))]
            for v in range(vectors):
                row = access(_shifted(load_at(tile.b, {j: v * lanes}), at))
                out.append(f"const {vec} {b[v]}_{c} = *(const {unaligned}*)&{row};")
        for r in range(rows):
            for v in range(vectors):
                row = access(_shifted(load_at(tile.a, {**points[r], j: v * lanes}), zero_at))
                fmas = " ".join(
                    f"{acc[r][v]} += ({vec}){{{', '.join(f'{a}[{m}]' for m in mask)}}} "
                    f"* {b[v]}_{c};" for c, mask in enumerate(masks))
                out.append(f"{{ const {vec} {a} = *(const {unaligned}*)&{row}; {fmas} }}")
        return out

    k_loops = tile.k[:-1] if tile.a_group else tile.k
    for depth, loop in enumerate(k_loops, start=1):
        k = name(loop.var.name)
        # (a loop: gcc's complete unrolling of a short one interleaved its steps and spilled
        # the accumulators: ResNet's 7x7 stem, 3 input channels a tap, 3.09 ms against 1.40
        # kept a loop; MobileNetV2's 3x3 depthwise over 112x112x32 133 us against 111;
        # ConvNeXt's 7x7 depthwise over 14x14x512 197 against 152; GEMMs within 1%)
        if loop is inner and sets > 1:  # (the pragma goes right before its loop)
            lines.append(f"{INDENT * depth}int64_t {k} = 0;")
            lines.append(f"{INDENT * depth}#pragma GCC unroll 1")
            lines.append(f"{INDENT * depth}for (; {k} + {sets} <= {loop_bound(loop, expr)}; "
                         f"{k} += {sets}) {{")
        else:
            lines.append(f"{INDENT * depth}#pragma GCC unroll 1")
            lines.append(f"{INDENT * depth}for (int64_t {k} = 0; {k} < {loop_bound(loop, expr)}; "
                         f"++{k}) {{")
    depth = len(k_loops)
    body = group_lines() if tile.a_group else \
        [line for step in range(sets) for line in step_lines(step)]
    lines += [INDENT * (depth + 1) + line for line in body]
    if sets > 1 and (inner.extent % sets or inner.stop is not None):  # the last steps, into
        k = name(inner.var.name)  # the first set
        lines.append(f"{INDENT * depth}}}")
        lines.append(f"{INDENT * depth}for (; {k} < {loop_bound(inner, expr)}; ++{k}) {{")
        lines += [INDENT * (depth + 1) + line for line in step_lines(0)]
    lines += [f"{INDENT * d}}}" for d in range(depth, 0, -1)]
    for r in range(rows):
        for v in range(vectors):
            total = " + ".join(f"{acc[r][v]}_{step}" for step in range(1, sets))
            if total:
                lines.append(f"{INDENT}{acc[r][v]} += {total};")
            lines.append(f"{INDENT}*({unaligned}*)&{homes[r][v]} = {acc[r][v]};")
    if write_back is not None:
        lines += _write_back_lines(write_back, acc, lanes, access, expr, name, prefix)
    # the tile ends in memory here: without this, gcc 12 may merge the accumulators with the
    # `omp simd` write-back loop that reads them next, and keeps them in the stack array all
    # along the loop (a load and a store per FMA: 4x16 tiles on AVX2 ran at 0.43x)
    lines.append(f'{INDENT}__asm__ volatile("" ::: "memory");')
    lines.append("}")
    return lines


def _init_vector(init: AccInit, point: dict[Var, int], vec: str, unaligned: str, zero: str,
                 access: Callable[[Load], str], expr: Callable[[Expr], str]) -> str:
    """One accumulator vector's first value, ``init.value`` at ``point`` (its first lane):
    a vector load where a load moves with the vectorized var, else the scalar broadcast
    (-0.0 plus it, which is it, -0.0 and NaN included), summed as the scalar nest sums."""
    def render(e: Expr) -> str:
        if isinstance(e, Binary):
            return f"({render(e.a)} + {render(e.b)})"
        if isinstance(e, Load) and moves_by(e, init.j) == 1:
            return f"*(const {unaligned}*)&{access(load_at(e, point))}"
        scalar = expr(load_at(e, point) if isinstance(e, Load) else e)
        return f"(({vec}){zero} + ({scalar}))"
    return render(init.value)


def _accumulator_sets(tile: FmaTile, rows: int, vectors: int, lanes: int) -> int:
    """How many sets of accumulators the tile's innermost loop spreads its steps over: a
    short tile (a GEMM's last rows, M % MR of them) has too few accumulators to hide the
    FMA's latency, each step waiting on the one before; ``s`` sets take ``s`` steps at once
    into independent accumulators, added together after the loop. Enough for `FMA_CHAINS`
    chains, as far as the registers hold them beside the b vectors and a broadcast."""
    chains = rows * vectors
    if tile.a_is_vector or tile.a_group or chains >= FMA_CHAINS:
        return 1
    fit = (_registers(lanes) - vectors - 1) // chains
    sets = min(-(-FMA_CHAINS // chains), fit)
    return sets if sets > 1 and tile.k[-1].extent >= 2 * sets else 1


def _shifted(load: Load, at: dict[Var, Expr]) -> Load:
    if not at:
        return load
    return Load(load.buffer, tuple(simplify(substitute(i, at)) for i in load.indices))


def _registers(lanes: int) -> int:
    """The vector registers of the target whose vectors have ``lanes`` floats."""
    return next(isa.registers for isa in Isa if isa.f32_lanes == lanes)


def _write_back_lines(back: WriteBack, acc: list[list[str]], lanes: int,
                      access: Callable[[Load], str], expr: Callable[[Expr], str],
                      name: Callable[[str], str], prefix: str) -> list[str]:
    """Each accumulator vector through the activation, stored to its target. MAX(c, x) is
    ``x < c ? c : x`` lane by lane, MIN(c, x) ``x > c ? c : x``: a NaN compares false and
    stays, as in the scalar helpers (the bounds are not NaN); GNU C's vector compare gives
    the lane mask, and the select is bitwise."""
    vec, unaligned, ivec = f"kiln_f32x{lanes}", f"kiln_f32x{lanes}u", f"kiln_i32x{lanes}"
    steps: list[tuple[BinOp, str]] = []  # the activation, outermost first
    value: Expr = back.value
    bounds: dict[str, str] = {}  # a constant's C text -> its vector's name
    while isinstance(value, Binary):
        bound, rest = (value.a, value.b) if isinstance(value.a, Const) else (value.b, value.a)
        text = expr(bound)
        bounds.setdefault(text, name(f"{prefix}bound{len(bounds)}"))
        steps.append((value.op, bounds[text]))
        value = rest
    steps.reverse()  # (applied from the accumulator out)
    lines = [f"{INDENT}typedef int {ivec} __attribute__((vector_size({4 * lanes})));"]
    lines += [f"{INDENT}const {vec} {var} = {{{', '.join([text] * lanes)}}};"
              for text, var in bounds.items()]
    x, mask = name(f"{prefix}out"), name(f"{prefix}mask")
    for r, row in enumerate(back.targets):
        for v, target in enumerate(row):
            body = [f"{vec} {x} = {acc[r][v]};"]
            if steps:
                body.append(f"{ivec} {mask};")
            for op, bound in steps:
                compare = "<" if op is BinOp.MAX else ">"
                body.append(f"{mask} = {x} {compare} {bound}; {x} = ({vec})((({ivec}){x} & ~{mask})"
                            f" | (({ivec}){bound} & {mask}));")
            body.append(f"*({unaligned}*)&{access(target)} = {x};")
            lines.append(f"{INDENT}{{ {' '.join(body)} }}")
    return lines
