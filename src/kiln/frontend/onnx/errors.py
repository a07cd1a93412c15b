"""The one exception class of ONNX import: a one-line message saying what is wrong and what
to do about it."""

from __future__ import annotations


class OnnxImportError(ValueError):
    """kiln cannot take this ONNX model (or this node of it); the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))  # one line, whatever the parts held


def where(node_name: str, op_type: str, opset: int) -> str:
    """How an error names a node: its op, its name and the model's opset."""
    return f"{op_type} node '{node_name or '<unnamed>'}' (opset {opset})"
