"""How tir is spelled in C: the type and operator tables, the per-render state that gives a
kernel's variables their C names (`RenderScope`: never a C keyword, a libm function or the
prelude's ``kiln_`` names), and the parenthesization helpers of `kiln.codegen.c`'s
renderer."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kiln.ir.types import DType
from kiln.tir.nodes import BinOp, CmpOp, UnOp, Var

__all__ = ["CMP", "C_TYPES", "INFIX", "MATH", "RESERVED", "VECTOR_MATH", "RenderScope",
           "as_operand", "unparen"]

C_TYPES = {
    DType.F64: "double",
    DType.F32: "float",
    DType.I64: "int64_t",
    DType.I32: "int32_t",
    DType.I16: "int16_t",
    DType.I8: "int8_t",
    DType.U8: "uint8_t",
    DType.BOOL: "bool",
}

# (op) -> C function for f32; f64 drops the "f" suffix
MATH = {
    UnOp.EXP: "expf",
    UnOp.LOG: "logf",
    UnOp.SQRT: "sqrtf",
    UnOp.TANH: "tanhf",
    UnOp.ERF: "erff",
    UnOp.SIN: "sinf",
    UnOp.COS: "cosf",
    UnOp.FLOOR: "floorf",
    UnOp.CEIL: "ceilf",
    UnOp.ABS: "fabsf",
}
# glibc's libmvec has SIMD versions of these: (name, C type, arity)
VECTOR_MATH = tuple((name + suffix, ctype, 2 if name == "pow" else 1)
                     for suffix, ctype in (("f", "float"), ("", "double"))
                     for name in ("exp", "log", "tanh", "erf", "sin", "cos", "pow"))

INFIX = {
    BinOp.ADD: "+",
    BinOp.SUB: "-",
    BinOp.MUL: "*",
    BinOp.DIV: "/",
    BinOp.AND: "&&",
    BinOp.OR: "||",
}
CMP = {CmpOp.EQ: "==", CmpOp.NE: "!=", CmpOp.LT: "<", CmpOp.LE: "<=", CmpOp.GT: ">",
        CmpOp.GE: ">="}

RESERVED = frozenset("""
auto break case char const continue default do double else enum extern float for goto if
inline int long register restrict return short signed sizeof static struct switch typedef
union unsigned void volatile while bool true false int64_t int32_t int16_t int8_t uint8_t
main free malloc aligned_alloc kernel
div abs labs exp expf exp2 log logf log2 log10 sqrt sqrtf tanh tanhf erf erff sin sinf cos
cosf tan floor floorf ceil ceilf fabs fabsf pow powf fmod fmodf copysign copysignf round
trunc fmax fmin fmaxf fminf nan isnan isinf signbit
""".split())  # C keywords, and libc/libm functions a kernel or its prelude may call


@dataclass
class RenderScope:
    """Per-render state: C names for tir names, buffers in scope, enclosing loop kinds."""

    names: dict[str, str] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    in_parallel: bool = False
    ranges: dict[Var, tuple[int, int]] = field(default_factory=dict)  # loop and iter vars

    def name(self, tir_name: str) -> str:
        if tir_name in self.names:
            return self.names[tir_name]
        base = re.sub(r"\W", "_", tir_name) or "v"
        if base[0].isdigit() or base in RESERVED or base.startswith("kiln_"):
            base = f"v_{base}"
        candidate, n = base, 1
        while candidate in self.used:
            n += 1
            candidate = f"{base}_{n}"
        self.used.add(candidate)
        self.names[tir_name] = candidate
        return candidate


def unparen(text: str) -> str:
    """Drop one pair of outer parentheses when they enclose the whole expression."""
    if not (text.startswith("(") and text.endswith(")")) or text.startswith("({"):
        return text  # (a GNU statement expression keeps its parentheses)
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i < len(text) - 1:
            return text
    return text[1:-1]


def as_operand(text: str) -> str:
    """``text`` ready for a prefix operator: as it is where it is one primary expression (a
    name, an unsigned number, a load ``x[...]``, a call ``f(...)``, a parenthesized whole),
    else in parentheses (``-`` before ``a + b`` or before ``-1.0f``)."""
    if re.fullmatch(r"[\w.]+", text):
        return text
    name = re.match(r"[A-Za-z_]\w*", text)
    start = name.end() if name else 0
    if text[start:start + 1] in ("[", "("):
        depth = 0
        for i in range(start, len(text)):
            depth += text[i] in "[("
            depth -= text[i] in "])"
            if depth == 0:
                if i == len(text) - 1 and (name or not text.startswith("({")):
                    return text
                break
    return f"({text})"
