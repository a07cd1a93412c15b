"""Attribute values as text and back: a small, safe subset of Python literal syntax.

Besides numbers, strings, None, booleans and tuples it knows ``inf``/``nan``, kiln dtypes
(``f32``), torch dtypes, layouts and memory formats (``torch.float32``), devices
(``device('cpu')``), ATen op overloads (``aten.cumsum.default``) and call-template operands
(``arg(0)``) and kiln ops (``op('relu')``). Nothing is ever passed to ``eval``.
"""

from __future__ import annotations

import ast
import math
from typing import Any

import torch

from kiln.ir.attrs import Operand
from kiln.ir.ops import Op
from kiln.ir.types import DType

_TORCH_NAMES: dict[Any, str] = {}
for _name in dir(torch):
    _obj = getattr(torch, _name)
    if isinstance(_obj, (torch.dtype, torch.layout, torch.memory_format)):
        _TORCH_NAMES.setdefault(_obj, f"torch.{_name}")
_BY_TORCH_NAME = {name: obj for obj, name in _TORCH_NAMES.items()}


def format_literal(value: Any) -> str:
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, DType):
        return value.value
    if isinstance(value, Op):
        return f"op({value.text!r})"
    if isinstance(value, Operand):
        return f"arg({value.index})"
    if isinstance(value, tuple):
        inner = ", ".join(format_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(format_literal(v) for v in value) + "]"
    if isinstance(value, torch.device):
        return f"device({str(value)!r})"
    if isinstance(value, torch._ops.OpOverload):
        return f"aten.{value._opname}.{value._overloadname}" if value.namespace == "aten" \
            else f"ops.{value.namespace}.{value._opname}.{value._overloadname}"
    if hasattr(value, "_schema") and hasattr(value, "_overloadname"):  # (a RegionCall)
        return f"ops.{value.namespace}.{value._opname}.{value._overloadname}"
    if value in _TORCH_NAMES:
        return _TORCH_NAMES[value]
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as an IR literal")


def parse_literal(text: str) -> Any:
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"bad literal {text!r}: {err.msg}") from None
    return _eval(tree.body, text)


def parse_keywords(text: str) -> dict[str, Any]:
    """``a=1, b=(2, 3)`` -> {"a": 1, "b": (2, 3)}."""
    if not text.strip():
        return {}
    try:
        tree = ast.parse(f"_({text})", mode="eval")
    except SyntaxError as err:
        raise ValueError(f"bad attributes {{{text}}}: {err.msg}") from None
    call = tree.body
    assert isinstance(call, ast.Call)
    if call.args or any(k.arg is None for k in call.keywords):
        raise ValueError(f"attributes must be name=value pairs: {{{text}}}")
    return {k.arg: _eval(k.value, text) for k in call.keywords}  # type: ignore[misc]


_NAMES: dict[str, Any] = {"None": None, "True": True, "False": False,
                          "inf": math.inf, "nan": math.nan}


def _eval(node: ast.AST, text: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_eval(e, text) for e in node.elts)
    if isinstance(node, ast.List):
        return [_eval(e, text) for e in node.elts]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        operand = _eval(node.operand, text)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand
    if isinstance(node, ast.Name):
        if node.id in _NAMES:
            return _NAMES[node.id]
        return DType.parse(node.id)
    if isinstance(node, ast.Attribute):
        dotted = _dotted(node)
        if dotted in _BY_TORCH_NAME:
            return _BY_TORCH_NAME[dotted]
        parts = dotted.split(".")
        if parts[0] == "aten" and len(parts) == 3:
            return getattr(getattr(torch.ops.aten, parts[1]), parts[2])
        if parts[0] == "ops" and len(parts) == 4:
            return getattr(getattr(getattr(torch.ops, parts[1]), parts[2]), parts[3])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1:
        arg = _eval(node.args[0], text)
        if node.func.id == "arg" and isinstance(arg, int):
            return Operand(arg)
        if node.func.id == "device" and isinstance(arg, str):
            return torch.device(arg)
        if node.func.id == "op" and isinstance(arg, str):
            return Op.parse(arg)
    raise ValueError(f"not an IR literal: {ast.unparse(node)!r} in {text!r}")


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    raise ValueError(f"not a dotted name: {ast.unparse(node)!r}")
