"""IR text parse errors: each names the line, says what is wrong, and quotes the line."""

from __future__ import annotations

import pytest
import torch

from kiln.ir import ParseError, parse_graph

BAD_TEXTS = {
    "use_before_definition": ("""\
graph(%x: f32[4]) {
  %a = relu(%b) : f32[4]
  %b = neg(%x) : f32[4]
  return %a
}""", 2, "%b is used before it is defined"),
    "unknown_op": ("""\
graph(%x: f32[4]) {
  %a = frobnicate(%x) : f32[4]
  return %a
}""", 2, "unknown op 'frobnicate'"),
    "unknown_dtype": ("""\
graph(%x: f32[4]) {
  %a = relu(%x) : f33[4]
  return %a
}""", 2, "unknown dtype 'f33'; known: f64, f32"),
    "malformed_type": ("""\
graph(%x: f32[4]) {
  %a = relu(%x) : f32(4)
  return %a
}""", 2, "bad type 'f32(4)'; expected like f32[2, 3]"),
    "bad_input_type": ("""\
graph(%x: q8[4]) {
  return %x
}""", 1, "unknown dtype 'q8'"),
    "duplicate_name": ("""\
graph(%x: f32[4]) {
  %a = relu(%x) : f32[4]
  %a = neg(%x) : f32[4]
  return %a
}""", 3, "%a is defined twice"),
    "duplicate_input": ("""\
graph(%x: f32[4], %x: f32[4]) {
  return %x
}""", 1, "%x is defined twice"),
    "node_shadows_input": ("""\
graph(%x: f32[4]) {
  %x = relu(%x) : f32[4]
  return %x
}""", 2, "%x is defined twice"),
    "missing_return": ("""\
graph(%x: f32[4]) {
  %a = relu(%x) : f32[4]
}""", 3, "missing 'return'"),
    "missing_closing_brace": ("""\
graph(%x: f32[4]) {
  %a = relu(%x) : f32[4]
  return %a""", 3, "missing closing '}'"),
    "node_after_return": ("""\
graph(%x: f32[4]) {
  return %x
  %a = relu(%x) : f32[4]
}""", 3, "nothing may follow 'return' but '}'"),
    "bad_header": ("""\
grph(%x: f32[4]) {
  return %x
}""", 1, "expected 'graph(%name: type, ...) {'"),
    "unknown_attribute": ("""\
graph(%x: f32[4]) {
  %a = softmax(%x) {dimension=0} : f32[4]
  return %a
}""", 2, "bad attributes for softmax"),
    "attribute_not_a_literal": ("""\
graph(%x: f32[4]) {
  %a = softmax(%x) {dim=__import__('os')} : f32[4]
  return %a
}""", 2, "bad attributes for softmax: not an IR literal"),
    "missing_type": ("""\
graph(%x: f32[4]) {
  %a = relu(%x)
  return %a
}""", 2, "expected ': type' at the end"),
    "not_a_node": ("""\
graph(%x: f32[4]) {
  a = relu(%x) : f32[4]
  return %a
}""", 2, "expected '%name = op(operands) {attrs} : type'"),
    "multi_output_without_index": ("""\
graph(%x: f32[4, 6]) {
  %s = split(%x) {sizes=(2, 4), dim=1} : (f32[4, 2], f32[4, 4])
  return %s
}""", 3, "%s has 2 outputs; %s does not name one"),
    "output_index_out_of_range": ("""\
graph(%x: f32[4, 6]) {
  %s = split(%x) {sizes=(2, 4), dim=1} : (f32[4, 2], f32[4, 4])
  return %s#2
}""", 3, "%s has 2 outputs; %s#2 does not name one"),
    "input_in_body": ("""\
graph(%x: f32[4]) {
  %y = input {index=1} : f32[4]
  return %y
}""", 2, "inputs are declared in the graph header"),
    "unbalanced_operands": ("""\
graph(%x: f32[4]) {
  %a = relu(%x : f32[4]
  return %a
}""", 2, "unbalanced '('"),
}


@pytest.mark.parametrize(("text", "line", "message"), BAD_TEXTS.values(), ids=BAD_TEXTS.keys())
def test_parse_error_names_line_and_problem(text: str, line: int, message: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_graph(text)
    first, quoted = str(info.value).split("\n")
    assert first.startswith(f"line {line}: ")
    assert message in first
    assert quoted.strip() == text.splitlines()[line - 1].strip()


def test_empty_text_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty IR text"):
        parse_graph("  \n\n")


def test_blank_lines_are_ignored_but_counted() -> None:
    text = "\ngraph(%x: f32[4]) {\n\n  %a = relu(%y) : f32[4]\n  return %a\n}\n"
    with pytest.raises(ParseError, match="^line 4: %y is used before it is defined"):
        parse_graph(text)


def test_weights_are_taken_from_constants_by_name() -> None:
    text = "graph() {\n  %w = constant {name='w'} : f32[2]\n  return %w\n}\n"
    w = torch.ones(2)
    graph = parse_graph(text, {"w": w, "unused": torch.zeros(3)})
    assert graph.constants == {"w": w}
    assert parse_graph(text).constants == {}  # verify() reports the missing weight


def test_text_after_closing_brace_is_an_error() -> None:
    with pytest.raises(ParseError, match="line 4"):
        parse_graph("graph(%x: f32[4]) {\n  return %x\n}\n%y = relu(%x) : f32[4]\n")
