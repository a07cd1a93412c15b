"""Shrink a failing case to a small one that fails the same way (greedy delta debugging).

    small = shrink(case, failure, cache_dir)

Each step proposes a smaller case and keeps it if it still fails with the same kind of
failure at the same configuration (`kiln.fuzz.check.Failure.same_bug`), until no step helps:

1. keep only the failing output (or, where the graph has dead nodes, first return those
   too: a bug may sit in one, and the cuts below then reach it);
2. *cut* a node: its outputs become graph inputs holding the values the reference computes
   there, so everything above it goes (nodes nearest the outputs are tried first);
3. *bypass* a node: its users read one of its operands of the same type instead;
4. inputs arrive contiguous instead of strided, expanded or aliased;
5. weights become graph inputs holding the same values.

Unused inputs, weights and nodes are dropped along the way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

import torch

from kiln.fuzz.case import Case, FuzzInput
from kiln.fuzz.check import REFERENCE, Failure, check_config, config_named, reference
from kiln.fuzz.reference import trace_values, type_gaps
from kiln.fuzz.values import CONTIGUOUS, Layout, LayoutKind
from kiln.ir.graph import Graph, Node, Value, make_input
from kiln.ir.ops import Op

Predicate = Callable[[Case], bool]


def still_fails(failure: Failure, cache_dir: str, verify: bool = False) -> Predicate:
    """Does a case fail like ``failure`` (same configuration, same kind)?"""
    config = None if failure.config == REFERENCE else config_named(failure.config)

    def test(case: Case) -> bool:
        expected = reference(case)
        if isinstance(expected, str):
            return False
        if config is None:  # the IR's types against the reference's
            return bool(type_gaps(case.graph, expected.values))
        found = check_config(case, config, cache_dir, expected, verify=verify)
        return found is not None and failure.same_bug(found)

    return test


def shrink(case: Case, failure: Failure, cache_dir: str, budget_s: float = 60.0,
           fails: Predicate | None = None, verify: bool = False) -> Case:
    """The smallest case found within ``budget_s`` that ``fails`` (by default: like
    ``failure``)."""
    fails = fails or still_fails(failure, cache_dir, verify)
    deadline = time.monotonic() + budget_s
    current = case
    dead = _dead_sinks(case.graph)
    if dead:  # a bug may sit in a dead node: make it an output, so cutting can reach it
        everything = rebuild(case, outputs=[*case.graph.outputs, *dead])
        if fails(everything):
            current = everything
    elif failure.output is not None and len(case.graph.outputs) > 1:
        single = rebuild(current, outputs=[current.graph.outputs[failure.output]])
        if fails(single):
            current = single
    progress = True
    while progress and time.monotonic() < deadline:
        progress = False
        for candidate in candidates(current):
            if time.monotonic() >= deadline:
                break
            if fails(candidate):
                current, progress = candidate, True
                break
    origin = f"shrunk from {case.origin}" if case.origin else "shrunk"
    return Case(current.graph, current.inputs, origin)


def _dead_sinks(graph: Graph) -> list[Value]:
    """Outputs of computing nodes that nothing reads and the graph does not return."""
    read = {v for n in graph.nodes for v in n.inputs} | set(graph.outputs)
    return [v for n in graph.nodes if n.op not in (Op.CONSTANT, Op.SCALAR)
            for v in n.outputs if v not in read]


def candidates(case: Case) -> Iterator[Case]:
    graph = case.graph
    for i in range(len(graph.outputs)):
        if len(graph.outputs) > 1:
            yield rebuild(case, outputs=[v for j, v in enumerate(graph.outputs) if j != i])
    computing = [n for n in graph.nodes if n.op not in (Op.CONSTANT, Op.SCALAR)]
    values: dict[Value, object] | None = None
    for node in reversed(computing):
        if values is None:
            values = trace_values(graph, case.materialize())
        if all(isinstance(values[v], torch.Tensor) for v in node.outputs):
            yield rebuild(case, cut={v: values[v] for v in node.outputs})  # type: ignore[misc]
    for node in reversed(computing):
        for operand in dict.fromkeys(node.inputs):
            if len(node.types) == 1 and operand.type == node.type and \
                    operand.node.op is not Op.SCALAR:
                yield rebuild(case, bypass={node.out(): operand})
    for i, x in enumerate(case.inputs):
        if x.layout.kind is not LayoutKind.CONTIGUOUS:
            inputs = list(case.inputs)
            inputs[i] = FuzzInput(x.values, CONTIGUOUS)
            yield Case(graph, tuple(inputs), case.origin)
    for node in graph.nodes:
        if node.op is Op.CONSTANT:
            yield rebuild(case, cut={node.out(): graph.constant(node)})


def rebuild(case: Case, outputs: list[Value] | None = None,
            cut: Mapping[Value, torch.Tensor] | None = None,
            bypass: Mapping[Value, Value] | None = None) -> Case:
    """``case`` returning ``outputs``, with the ``cut`` values read from new graph inputs
    (holding the given tensors) and each ``bypass`` key replaced by its value; whatever no
    output needs is dropped."""
    graph = case.graph
    cut, bypass = dict(cut or {}), dict(bypass or {})

    def resolve(v: Value) -> Value:
        while v in bypass:
            v = bypass[v]
        return v

    wanted = [resolve(v) for v in (graph.outputs if outputs is None else outputs)]
    live = _live(wanted, cut, resolve)
    # inputs: the original ones still read, then one per cut value, in graph order
    new_inputs: list[Node] = []
    fuzz_inputs: list[FuzzInput] = []
    mapping: dict[Value, Value] = {}
    kept = [i for i, n in enumerate(graph.inputs) if n.out() in live and n.out() not in cut]
    position = {old: new for new, old in enumerate(kept)}
    for i in kept:
        node = graph.inputs[i]
        new = make_input(len(new_inputs), node.name, node.type)
        new_inputs.append(new)
        mapping[node.out()] = new.out()
        fuzz_inputs.append(_moved(case.inputs, i, position))
    order = [n for n in graph.all_nodes() if any(v in cut for v in n.outputs)]
    for node in order:
        for v in node.outputs:
            if v not in cut or v not in live:
                continue
            name = node.name if len(node.outputs) == 1 else f"{node.name}_{v.index}"
            new = make_input(len(new_inputs), name, v.type)
            new_inputs.append(new)
            mapping[v] = new.out()
            values = cut[v].detach().to(v.type.dtype.torch).contiguous()  # as declared
            fuzz_inputs.append(FuzzInput(values.clone()))
    nodes: list[Node] = []
    for node in graph.nodes:
        if not any(v in live and v not in cut for v in node.outputs):
            continue
        operands = tuple(mapping[resolve(v)] for v in node.inputs)
        new = node if operands == node.inputs else Node(node.op, operands, node.attrs,
                                                        node.types, node.name)
        nodes.append(new)
        for v in node.outputs:
            mapping.setdefault(v, Value(new, v.index))
    used = {n.attrs.name for n in nodes if n.op is Op.CONSTANT}  # type: ignore[attr-defined]
    constants = {k: t for k, t in graph.constants.items() if k in used}
    new_graph = Graph(new_inputs, nodes, [mapping[v] for v in wanted], constants, graph.device)
    return Case(new_graph, tuple(fuzz_inputs), case.origin)


def _live(outputs: list[Value], cut: Mapping[Value, object],
          resolve: Callable[[Value], Value]) -> set[Value]:
    """Values the outputs need, walking up from them and stopping at cut values."""
    live: set[Value] = set()
    stack = list(outputs)
    while stack:
        v = stack.pop()
        if v in live:
            continue
        live.add(v)
        if v in cut:
            continue
        for operand in v.node.inputs:
            stack.append(resolve(operand))
        live.update(v.node.outputs)  # a multi-output node is kept whole
    return live


def _moved(inputs: tuple[FuzzInput, ...], i: int, position: dict[int, int]) -> FuzzInput:
    """Input ``i`` after renumbering; an alias of a dropped input gets that input's values."""
    x = inputs[i]
    if x.layout.kind is not LayoutKind.ALIAS:
        return x
    target = x.layout.arg
    if target in position:
        return FuzzInput(x.values, Layout(LayoutKind.ALIAS, position[target]))
    return FuzzInput(inputs[target].values, CONTIGUOUS)
