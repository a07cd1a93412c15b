"""Parse IR text written by `kiln.ir.printer` back into a Graph.

Weights are not part of the text: pass the tensors CONSTANT nodes name as ``constants``.
Errors name the line and say what was expected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from kiln.ir.attrs import InputAttrs, NoAttrs, attrs_class_of
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.literal import parse_keywords
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType


class ParseError(ValueError):
    def __init__(self, line_no: int, line: str, message: str) -> None:
        super().__init__(f"line {line_no}: {message}\n    {line.strip()}")


_HEADER = re.compile(r"^graph\((?P<params>.*)\)(?: on (?P<device>\S+))? \{$")
_PARAM = re.compile(r"^%(?P<name>[\w.]+): (?P<type>.+)$")
_TYPE = re.compile(r"(?P<dtype>\w+)\[(?P<dims>[\d, ]*)\]")
_REF = re.compile(r"^%(?P<name>[\w.]+)(?:#(?P<index>\d+))?$")
_NODE = re.compile(r"^%(?P<name>[\w.]+) = (?P<op>\w+)(?P<rest>.*)$")


def parse_graph(text: str, constants: Mapping[str, torch.Tensor] | None = None) -> Graph:
    constants = dict(constants or {})
    lines = [(i + 1, line) for i, line in enumerate(text.splitlines()) if line.strip()]
    if not lines:
        raise ValueError("empty IR text")
    first_no, first = lines[0]
    header = _HEADER.match(first.strip())
    if header is None:
        raise ParseError(first_no, first, "expected 'graph(%name: type, ...) {'")
    env: dict[str, Node] = {}
    inputs = []
    for index, param in enumerate(_split_top(header["params"])):
        m = _PARAM.match(param.strip())
        if m is None:
            raise ParseError(first_no, first, f"bad parameter {param.strip()!r}")
        node = Node(Op.INPUT, (), InputAttrs(index), (_parse_type(m["type"], first_no, first),),
                    m["name"])
        _define(env, node, first_no, first)
        inputs.append(node)
    nodes: list[Node] = []
    outputs: list[Value] | None = None
    for position, (line_no, line) in enumerate(lines[1:], start=1):
        stripped = line.strip()
        if stripped == "}":
            if position + 1 < len(lines):
                extra_no, extra = lines[position + 1]
                raise ParseError(extra_no, extra, "nothing may follow the closing '}'")
            break
        if outputs is not None:
            raise ParseError(line_no, line, "nothing may follow 'return' but '}'")
        if stripped.startswith("return"):
            refs = _split_top(stripped[len("return"):])
            outputs = [_resolve(env, r, line_no, line) for r in refs]
            continue
        node = _parse_node(stripped, env, line_no, line)
        _define(env, node, line_no, line)
        nodes.append(node)
    else:
        raise ParseError(lines[-1][0], lines[-1][1], "missing closing '}'")
    if outputs is None:
        raise ParseError(line_no, line, "missing 'return'")
    used = {n.attrs.name for n in nodes if n.op is Op.CONSTANT}  # type: ignore[attr-defined]
    return Graph(inputs, nodes, outputs, {k: constants[k] for k in used if k in constants},
                 header["device"] or "cpu")


def _parse_node(text: str, env: dict[str, Node], line_no: int, line: str) -> Node:
    m = _NODE.match(text)
    if m is None:
        raise ParseError(line_no, line, "expected '%name = op(operands) {attrs} : type'")
    try:
        op = Op.parse(m["op"])
    except ValueError as err:
        raise ParseError(line_no, line, str(err)) from None
    rest = m["rest"]
    operands: list[Value] = []
    if rest.startswith("("):
        inner, rest = _take_group(rest, "(", ")", line_no, line)
        operands = [_resolve(env, r, line_no, line) for r in _split_top(inner)]
    rest = rest.strip()
    attrs_text = ""
    if rest.startswith("{"):
        attrs_text, rest = _take_group(rest, "{", "}", line_no, line)
        rest = rest.strip()
    if not rest.startswith(":"):
        raise ParseError(line_no, line, "expected ': type' at the end")
    types_text = rest[1:].strip()
    if types_text.startswith("("):
        types_text = types_text[1:-1]
    types = tuple(_parse_type(t, line_no, line) for t in _split_top(types_text))
    cls = attrs_class_of(op)
    try:
        fields = parse_keywords(attrs_text)
        attrs = NoAttrs() if cls is NoAttrs and not fields else cls(**fields)
    except (TypeError, ValueError) as err:
        raise ParseError(line_no, line, f"bad attributes for {op.text}: {err}") from None
    if op is Op.INPUT:
        raise ParseError(line_no, line, "inputs are declared in the graph header")
    return Node(op, operands, attrs, types, m["name"])


def _define(env: dict[str, Node], node: Node, line_no: int, line: str) -> None:
    if node.name in env:
        raise ParseError(line_no, line, f"%{node.name} is defined twice")
    env[node.name] = node


def _resolve(env: dict[str, Node], ref: str, line_no: int, line: str) -> Value:
    m = _REF.match(ref.strip())
    if m is None:
        raise ParseError(line_no, line, f"expected a value like %name or %name#1, got {ref!r}")
    node = env.get(m["name"])
    if node is None:
        raise ParseError(line_no, line, f"%{m['name']} is used before it is defined")
    index = int(m["index"] or 0)
    if index >= len(node.types) or (m["index"] is None and len(node.types) > 1):
        raise ParseError(line_no, line, f"%{m['name']} has {len(node.types)} outputs; "
                         f"{ref.strip()} does not name one")
    return Value(node, index)


def _parse_type(text: str, line_no: int, line: str) -> TensorType:
    m = _TYPE.fullmatch(text.strip())
    if m is None:
        raise ParseError(line_no, line, f"bad type {text.strip()!r}; expected like f32[2, 3]")
    dims = tuple(int(d) for d in m["dims"].replace(" ", "").split(",") if d)
    try:
        return TensorType(dims, DType.parse(m["dtype"]))
    except ValueError as err:
        raise ParseError(line_no, line, str(err)) from None


def _take_group(text: str, open_: str, close: str, line_no: int, line: str) -> tuple[str, str]:
    """Split ``(inner) rest`` at the matching bracket, ignoring brackets inside strings."""
    depth, quote, escaped = 0, "", False
    for i, ch in enumerate(text):
        if quote:
            quote, escaped = _in_string(ch, quote, escaped)
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                if ch != close:
                    break
                return text[1:i], text[i + 1:]
    raise ParseError(line_no, line, f"unbalanced {open_!r}")


def _split_top(text: str) -> list[str]:
    """Split at commas that are not nested in brackets or strings."""
    parts, depth, quote, start, escaped = [], 0, "", 0, False
    for i, ch in enumerate(text):
        if quote:
            quote, escaped = _in_string(ch, quote, escaped)
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _in_string(ch: str, quote: str, escaped: bool) -> tuple[str, bool]:
    """One character inside a string literal: the quote still open, and whether ch escapes."""
    if escaped:
        return quote, False
    if ch == "\\":
        return quote, True
    return ("" if ch == quote else quote), False
