"""kiln's tensor-level IR: ops, types, attributes, graphs, text form, verifier, interpreter."""

from kiln.ir.attrs import ATTRS_OF, Attrs, NoAttrs, Operand
from kiln.ir.builder import GraphBuilder
from kiln.ir.graph import Graph, Node, Value, live_nodes, transform
from kiln.ir.interp import interpret
from kiln.ir.ops import Op, OpGroup
from kiln.ir.parser import ParseError, parse_graph
from kiln.ir.printer import print_graph
from kiln.ir.types import DType, TensorType, UnsupportedDType
from kiln.ir.verify import VerificationError, verify

__all__ = [
    "ATTRS_OF", "Attrs", "DType", "Graph", "GraphBuilder", "Node", "NoAttrs", "Op", "OpGroup",
    "Operand", "ParseError", "TensorType", "UnsupportedDType", "Value", "VerificationError",
    "interpret", "live_nodes", "parse_graph", "print_graph", "transform", "verify",
]
