"""`verify(graph)`: the executable spec of a well-formed graph.

Checks that every operand is defined before its use, that attributes have the op's class,
that sources are consistent (inputs numbered in order, weights present with the declared
type) and that every node's declared types equal the types its ATen meaning produces.
"""

from __future__ import annotations

from kiln.ir import calls
from kiln.ir.attrs import CallAttrs, ConstantAttrs, InputAttrs, attrs_class_of
from kiln.ir.graph import Graph, Node, scalar_type, unique_names
from kiln.ir.infer import InferenceError, infer_types
from kiln.ir.ops import Op
from kiln.ir.printer import format_node
from kiln.ir.types import TensorType


class VerificationError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("malformed kiln graph:\n  " + "\n  ".join(problems))
        self.problems = problems


def verify(graph: Graph, *, check_types: bool = True) -> None:
    """Raise VerificationError listing every problem found; return None if there are none."""
    names = unique_names(graph.all_nodes())
    problems: list[str] = []
    defined: set[Node] = set()

    for position, node in enumerate(graph.inputs):
        if node.op is not Op.INPUT or node.inputs:
            problems.append(f"graph input {position} is a {node.op.text} node, not an input")
        elif not isinstance(node.attrs, InputAttrs) or node.attrs.index != position:
            problems.append(f"input %{names[node]} is at position {position} but says "
                            f"{getattr(node.attrs, 'index', None)}")
        defined.add(node)

    for node in graph.nodes:
        where = f"node %{names[node]} ({_describe(node, names)})"
        for value in node.inputs:
            if value.node not in defined:
                problems.append(f"{where}: operand %{value.node.name} is not defined before it")
            elif value.index >= len(value.node.types):
                problems.append(f"{where}: operand {value} has no output {value.index}")
        if node in defined:
            problems.append(f"{where}: appears twice in the graph")
        defined.add(node)
        problems += _check_node(node, graph, where, check_types and not _uses_bad(node, defined))

    for i, value in enumerate(graph.outputs):
        if value.node not in defined:
            problems.append(f"output {i} ({value}) is not computed by the graph")
        elif value.index >= len(value.node.types):
            problems.append(f"output {i}: {value.node.name} has no output {value.index}")
    if problems:
        raise VerificationError(problems)


def _describe(node: Node, names: dict[Node, str]) -> str:
    try:
        return format_node(node, names)
    except TypeError as err:  # an attribute with no text form is itself a problem
        return f"{node.op.text} with unprintable attributes: {err}"


def _uses_bad(node: Node, defined: set[Node]) -> bool:
    return any(v.node not in defined or v.index >= len(v.node.types) for v in node.inputs)


def _check_node(node: Node, graph: Graph, where: str, check_types: bool) -> list[str]:
    expected_cls = attrs_class_of(node.op)
    if type(node.attrs) is not expected_cls:
        return [f"{where}: attributes are {type(node.attrs).__name__}, "
                f"{node.op.text} takes {expected_cls.__name__}"]
    if node.op is Op.INPUT:
        return [f"{where}: inputs belong in the graph header, not the body"]
    if node.op is Op.CONSTANT:
        return _check_constant(node, graph, where)
    if node.op is Op.SCALAR:
        expected = scalar_type(node.attrs.value)  # type: ignore[attr-defined]
        ok = node.types == (expected,)
        return [] if ok else [f"{where}: a scalar {node.attrs} has type {expected}"]
    if not node.types and not calls.has_effect(node):
        return [f"{where}: has no outputs and no effect"]
    if not check_types:
        return []
    try:
        inferred = infer_types(node.op, node.attrs, node.inputs)
    except InferenceError as err:
        if isinstance(node.attrs, CallAttrs) and isinstance(err.__cause__, NotImplementedError):
            return []  # an opaque op without a meta kernel: trust the captured types
        return [f"{where}: {err}"]
    if node.op is Op.CALL:
        # meta kernels may size unused outputs differently (batch norm's saved statistics
        # are empty in inference); capture recorded what the real kernel returns
        inferred = tuple(d if d.numel == 0 and t.dtype == d.dtype else t
                         for t, d in zip(inferred, node.types))
    if inferred != node.types:
        shown = ", ".join(map(str, inferred))
        return [f"{where}: declared type does not match the op's result ({shown})"]
    return []


def _check_constant(node: Node, graph: Graph, where: str) -> list[str]:
    if node.inputs:
        return [f"{where}: a constant takes no operands"]
    assert isinstance(node.attrs, ConstantAttrs)
    tensor = graph.constants.get(node.attrs.name)
    if tensor is None:
        return [f"{where}: weight {node.attrs.name!r} is missing from graph.constants"]
    if (TensorType.of(tensor),) != node.types:
        return [f"{where}: weight {node.attrs.name!r} is {TensorType.of(tensor)}"]
    return []
