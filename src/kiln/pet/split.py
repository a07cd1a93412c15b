"""Program splitting: the graph cut into small subprograms at its non-linear ops, as PET does
(Wang et al., OSDI'21, section 4).

    subs = split_program(graph, max_ops=4)
    sub.nodes      # the body nodes, in graph order (at most max_ops)
    sub.graph      # the same nodes as a standalone graph: every operand from outside is an input
    sub.outputs    # the values the rest of the graph reads

A subprogram holds only *multi-linear* ops (contractions, additions, products, negation): each
output element is a polynomial of degree one in each operand. That is what lets
`kiln.pet.regions` decide equivalence from a few random tests. A contraction whose fused
epilogue ends in an activation (``conv_act{relu}``) may close a subprogram: the activation is
position-wise, so two programs that agree before it agree after it (`regions` says exactly what
that does and does not establish). Softmax, normalization, pooling and every other op cut.

Subprograms grow forward from a contraction along its users, and only take a user whose other
operands do not themselves depend on the subprogram, so every subprogram is convex: replacing
it by another program over the same inputs keeps the graph acyclic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.ir.graph import Graph, Node, Value, make_input
from kiln.ir.ops import Op

__all__ = ["LINEAR", "Subprogram", "split_program"]

MAX_OPS = 4  # PET's default subprogram size

# multi-linear (or affine) in their operands; a fused activation is handled as a closing op
LINEAR = frozenset({Op.CONVOLUTION, Op.CONV_ACT, Op.MM, Op.BMM, Op.ADDMM, Op.ADDMM_ACT,
                    Op.ADD, Op.SUB, Op.MUL, Op.NEG})
ANCHORS = frozenset({Op.CONVOLUTION, Op.CONV_ACT, Op.MM, Op.BMM, Op.ADDMM, Op.ADDMM_ACT})


def closes(node: Node) -> bool:
    """A node after which the subprogram may not grow: its fused activation is non-linear."""
    return getattr(node.attrs, "activation", None) is not None


@dataclass
class Subprogram:
    """A convex set of body nodes of ``parent``, as a standalone graph over its operands."""

    parent: Graph
    nodes: tuple[Node, ...]
    inputs: tuple[Value, ...]  # the values from outside it reads, in first-use order
    outputs: tuple[Value, ...]  # its values that the rest of the graph (or the output) reads
    graph: Graph = field(init=False)
    constant_inputs: frozenset[int] = field(init=False)  # indices of inputs that are weights

    def __post_init__(self) -> None:
        mapping: dict[Value, Value] = {}
        standalone_inputs: list[Node] = []
        constants: set[int] = set()
        body: list[Node] = []
        for i, v in enumerate(self.inputs):
            node = make_input(i, f"in{i}", v.type)
            standalone_inputs.append(node)
            mapping[v] = node.out()
            if v.node.op is Op.CONSTANT:
                constants.add(i)
        for node in self.nodes:
            operands = []
            for v in node.inputs:
                if v.node.op is Op.SCALAR and v not in mapping:
                    body.append(v.node)
                    mapping[v] = v
                operands.append(mapping[v])
            new = Node(node.op, operands, node.attrs, node.types, node.name)
            body.append(new)
            for old, value in zip(node.outputs, new.outputs):
                mapping[old] = value
        self.graph = Graph(standalone_inputs, body, [mapping[v] for v in self.outputs],
                           device=self.parent.device)
        self.constant_inputs = frozenset(constants)

    @property
    def anchor(self) -> Node:
        return next(n for n in self.nodes if n.op in ANCHORS)

    def describe(self) -> str:
        return " -> ".join(f"{n.op.text}({n.name})" for n in self.nodes)


def split_program(graph: Graph, max_ops: int = MAX_OPS) -> list[Subprogram]:
    """Subprograms of at most ``max_ops`` multi-linear ops, each holding one contraction."""
    users = graph.users()
    taken: set[Node] = set()
    subs: list[Subprogram] = []
    order = {node: i for i, node in enumerate(graph.all_nodes())}
    for node in graph.nodes:
        if node.op not in ANCHORS or node in taken or not _float(node):
            continue
        members = _grow(node, users, taken, order, max_ops)
        taken.update(members)
        nodes = tuple(sorted(members, key=order.__getitem__))
        subs.append(_subprogram(graph, nodes, users))
    return subs


def _float(node: Node) -> bool:
    return all(t.dtype.is_floating for t in node.types)


def _grow(seed: Node, users: dict[Node, list[Node]], taken: set[Node],
          order: dict[Node, int], max_ops: int) -> set[Node]:
    members = {seed}
    frontier = [seed]
    while frontier and len(members) < max_ops:
        node = frontier.pop(0)
        if closes(node):
            continue
        for user in users.get(node, ()):
            if len(members) >= max_ops:
                break
            if (user in members or user in taken or user.op not in LINEAR or user.op in ANCHORS
                    or not _float(user) or _depends_on(user, members, order)):
                continue
            members.add(user)
            frontier.append(user)
    return members


def _depends_on(user: Node, members: set[Node], order: dict[Node, int]) -> bool:
    """Whether an operand of ``user`` from outside ``members`` is computed from a member
    (taking ``user`` would then make the subprogram non-convex)."""
    first = min(order[m] for m in members)
    stack = [v.node for v in user.inputs if v.node not in members]
    seen: set[Node] = set()
    while stack:
        node = stack.pop()
        if node in seen or order[node] < first:
            continue  # computed before every member: cannot depend on one
        seen.add(node)
        if node in members:
            return True
        stack.extend(v.node for v in node.inputs)
    return False


def _subprogram(graph: Graph, nodes: tuple[Node, ...], users: dict[Node, list[Node]]
                ) -> Subprogram:
    members = set(nodes)
    inputs: dict[Value, None] = {}
    for node in nodes:
        for v in node.inputs:
            if v.node not in members and v.node.op is not Op.SCALAR:
                inputs[v] = None
    graph_outputs = set(graph.outputs)
    outputs: list[Value] = []
    for node in nodes:
        for v in node.outputs:
            read_outside = any(u not in members and v in u.inputs for u in users.get(node, ()))
            if read_outside or v in graph_outputs:
                outputs.append(v)
    return Subprogram(graph, nodes, tuple(inputs), tuple(outputs))

