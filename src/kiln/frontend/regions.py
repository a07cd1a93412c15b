"""The parts of a captured graph whose values kiln's IR cannot type (complex numbers: FNet's
Fourier mixing, rotary embeddings written with ``view_as_complex``) run as they are, as one
opaque call each, and the rest of the graph is compiled.

A *region* is a set of fx nodes joined by values of an unsupported dtype (the weights among
them included: a complex ``freqs_cis`` buffer), closed so that no path leaves it and comes
back (a region that fed a node that fed it again could not run as one call). What enters and
leaves it has kiln types. It becomes one CALL whose target is a `RegionCall`: the region's
own fx graph (its weights inside), which quacks like the ATen overload a CALL holds (a
schema ``kiln::region(Tensor[] inputs) -> Tensor[]``, no tags, no effect), and answers meta
operands with the result types recorded at capture. Its results are dense tensors of their
own (a region's last op may be a view of its inputs or of a complex value: ``view_as_real``).

A region whose values leave the graph, come in as the caller's arguments, or that has an
effect or a random op cannot be kept apart this way; the caller runs that graph eagerly, as
before.

A small untypable value that several ops read (a complex rotary table made once and read by
every layer: DeepSeek-V2's ``freqs_cis``) would join all of them, and with them every node on
a path between them, into one region: the whole stack of layers. `split_shared` first gives
each reader its own copy of the value's chain (a few ops on a few elements, recomputed), so
that each layer's region holds its own few complex ops.
"""

from __future__ import annotations

import hashlib
import heapq
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from kiln.ir import calls
from kiln.ir.types import DType, UnsupportedDType

__all__ = ["Region", "RegionCall", "find_regions", "split_shared", "walk_order"]

# a shared untypable chain is recomputed per reader up to this many ops and elements each
SHARED_CHAIN_MAX_NODES = 8
SHARED_CHAIN_MAX_ELEMENTS = 1 << 16


@dataclass
class Region:
    members: list[torch.fx.Node]  # in graph order
    inputs: list[torch.fx.Node]  # nodes outside it that it reads, first read first
    outputs: list[torch.fx.Node]  # its nodes read outside it, in graph order
    call: RegionCall | None = None
    targets: list[str] = field(default_factory=list)  # its ATen ops, for the report


class RegionError(Exception):
    """The region cannot run as one call; ``node`` says where."""

    def __init__(self, node: torch.fx.Node, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


def untypable(val: Any) -> bool:
    """A tensor (or a tuple holding one) whose dtype kiln's IR has no type for."""
    if isinstance(val, (list, tuple)):
        return any(untypable(v) for v in val)
    if not isinstance(val, torch.Tensor):
        return False
    try:
        DType.from_torch(val.dtype)
    except UnsupportedDType:
        return True
    return False


def split_shared(gm: torch.fx.GraphModule) -> bool:
    """Give each reader after the first of a small shared untypable value its own copy of
    the ops that make it (the value and its untypable ancestors, up to
    `SHARED_CHAIN_MAX_NODES` ops of at most `SHARED_CHAIN_MAX_ELEMENTS` elements each, made
    from typable values only), so that the readers' regions stay apart. Whether the graph
    changed (it is then recompiled)."""
    nodes = list(gm.graph.nodes)
    bad = {n for n in nodes if n.op != "output" and untypable(n.meta.get("val"))}
    changed = False
    for node in nodes:
        readers = [u for u in node.users if u.op == "call_function"]
        if node not in bad or node.op != "call_function" or len(readers) < 2:
            continue
        chain = _chain(node, bad)
        if chain is None:
            continue
        for reader in readers[1:]:
            copies: dict[torch.fx.Node, torch.fx.Node] = {}
            with gm.graph.inserting_before(reader):
                for member in chain:
                    copies[member] = gm.graph.node_copy(
                        member, lambda a, made=copies: made.get(a, a))
            reader.replace_input_with(node, copies[node])
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed


def _chain(node: torch.fx.Node, bad: set[torch.fx.Node]) -> list[torch.fx.Node] | None:
    """``node`` and its untypable ancestors, in graph order; None where they are too many or
    too large, or one is not an op (an untypable weight or input stays one shared value)."""
    chain: dict[torch.fx.Node, None] = {}
    todo = [node]
    while todo:
        n = todo.pop()
        if n in chain:
            continue
        val = n.meta.get("val")
        cheap = (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                 and calls.pure_target(n.target) and isinstance(val, torch.Tensor)
                 and val.numel() <= SHARED_CHAIN_MAX_ELEMENTS)
        if not cheap:
            return None
        chain[n] = None
        if len(chain) > SHARED_CHAIN_MAX_NODES:
            return None
        todo.extend(src for src in n.all_input_nodes if src in bad)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    return sorted(chain, key=order.__getitem__)


def find_regions(gm: torch.fx.GraphModule, constants: Mapping[torch.fx.Node, torch.Tensor]
                 ) -> list[Region]:
    """The graph's regions, registered in the table. ``constants``: the placeholders and
    attributes that are weights (they may join a region); any other placeholder of an
    untypable dtype raises `RegionError`, as does a region that cannot run alone."""
    nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    bad = {n for n in nodes if n.op != "output" and untypable(n.meta.get("val"))}
    if not bad:
        return []
    for n in bad:
        if n.op in ("placeholder", "get_attr") and n not in constants:
            raise RegionError(n, f"dtype {n.meta['val'].dtype} is not supported by kiln in a "
                                 f"graph input")
    # seeds: a node that makes or reads an untypable value; joined along those values
    parent: dict[torch.fx.Node, torch.fx.Node] = {}

    def find(n: torch.fx.Node) -> torch.fx.Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    def union(a: torch.fx.Node, b: torch.fx.Node) -> None:
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        parent[find(a)] = find(b)

    for n in nodes:
        if n.op != "call_function":
            continue
        for src in n.all_input_nodes:
            if src in bad:
                union(src, n)
        if n in bad:
            union(n, n)
    groups = _groups(parent, find)
    groups = _convex(groups, nodes, index)
    return [_region(gm, sorted(g, key=index.__getitem__), constants) for g in groups]


def _groups(parent: dict[torch.fx.Node, torch.fx.Node], find: Any) -> list[set[torch.fx.Node]]:
    by_root: dict[torch.fx.Node, set[torch.fx.Node]] = {}
    for n in parent:
        by_root.setdefault(find(n), set()).add(n)
    return list(by_root.values())


def _convex(groups: list[set[torch.fx.Node]], nodes: list[torch.fx.Node],
            index: Mapping[torch.fx.Node, int]) -> list[set[torch.fx.Node]]:
    """Each group grown by the nodes on a path from it back to it, and by the getitems of
    its members; groups that then meet are merged. Repeated until nothing changes."""
    changed = True
    while changed:
        changed = False
        grown = []
        for g in groups:
            between = _descendants(g) & _ancestors(g)
            between |= {u for n in g | between for u in n.users
                        if u.op == "call_function" and u.target is operator.getitem}
            if not between <= g:
                g = g | between
                changed = True
            grown.append(g)
        merged: list[set[torch.fx.Node]] = []
        for g in grown:
            meets = [m for m in merged if m & g]
            for m in meets:
                merged.remove(m)
                g = g | m
                changed = True
            merged.append(g)
        groups = merged
    return sorted(groups, key=lambda g: min(index[n] for n in g))


def _descendants(group: set[torch.fx.Node]) -> set[torch.fx.Node]:
    return _reach(group, lambda n: n.users)


def _ancestors(group: set[torch.fx.Node]) -> set[torch.fx.Node]:
    return _reach(group, lambda n: n.all_input_nodes)


def _reach(group: set[torch.fx.Node], step: Any) -> set[torch.fx.Node]:
    """The nodes outside ``group`` reachable from it by ``step`` (users or operands)."""
    seen: set[torch.fx.Node] = set()
    todo = [s for n in group for s in step(n) if s not in group]
    while todo:
        n = todo.pop()
        if n not in seen and n not in group:
            seen.add(n)
            todo.extend(step(n))
    return seen


def _region(gm: torch.fx.GraphModule, members: list[torch.fx.Node],
            constants: Mapping[torch.fx.Node, torch.Tensor]) -> Region:
    inside = set(members)
    inputs: list[torch.fx.Node] = []
    targets = []
    for n in members:
        if n.op == "call_function" and n.target is not operator.getitem:
            _check_callable(n)
            targets.append(str(n.target))
        for src in n.all_input_nodes:
            if src not in inside and src not in inputs:
                if not isinstance(src.meta.get("val"), torch.Tensor):
                    raise RegionError(n, f"it reads {src.name}, which is not a tensor")
                inputs.append(src)
    outputs = [n for n in members if any(u not in inside for u in n.users)]
    for n in outputs:
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise RegionError(n, f"a region of ops kiln cannot type gives {n.name}, which is "
                                 f"not a tensor")
        if untypable(val):  # (any other reader joined the region): the graph's own result
            raise RegionError(n, f"dtype {val.dtype} is not supported by kiln in a result "
                                 f"of the graph")
    module = _module(gm, members, inputs, outputs, constants)
    specs = tuple((tuple(n.meta["val"].shape), n.meta["val"].dtype) for n in outputs)
    return Region(members, inputs, outputs, RegionCall(module, specs), targets)


def _check_callable(n: torch.fx.Node) -> None:
    target = n.target
    if not isinstance(target, torch._ops.OpOverload):
        raise RegionError(n, f"{target!r} is not an ATen op")
    if not calls.pure_target(target):
        raise RegionError(n, f"{target} has an effect or draws random numbers")


def _module(gm: torch.fx.GraphModule, members: list[torch.fx.Node],
            inputs: list[torch.fx.Node], outputs: list[torch.fx.Node],
            constants: Mapping[torch.fx.Node, torch.Tensor]) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    root = torch.nn.Module()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for i, n in enumerate(inputs):
        env[n] = graph.placeholder(f"in{i}")
    for n in members:
        if n.op in ("placeholder", "get_attr"):
            name = f"c{len(root._buffers)}"
            root.register_buffer(name, constants[n])
            env[n] = graph.get_attr(name)
        else:
            env[n] = graph.node_copy(n, env.__getitem__)
    graph.output(tuple(env[n] for n in outputs))
    return torch.fx.GraphModule(root, graph)


# -- the call a region becomes ------------------------------------------------------------

_SCHEMA = torch._C.parse_schema("kiln::region(Tensor[] inputs) -> Tensor[]")


class RegionCall:
    """A region's fx graph as a CALL's target (see the module docstring)."""

    namespace, _opname, tags, _schema = "kiln", "region", (), _SCHEMA

    def __init__(self, module: torch.fx.GraphModule,
                 specs: tuple[tuple[tuple[int, ...], torch.dtype], ...]) -> None:
        self.module = module
        self.specs = specs  # each result's shape and dtype
        self._overloadname = hashlib.sha256(module.code.encode()).hexdigest()[:12]

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if any(x.device.type == "meta" for x in inputs):  # (type inference)
            return [torch.empty(shape, dtype=dtype, device="meta")
                    for shape, dtype in self.specs]
        results = self.module(*inputs)
        storages = {x.untyped_storage().data_ptr() for x in inputs}
        # dense results of their own: the compiled graph takes an opaque call's results
        # as dense, and none may alias an operand a later op overwrites
        return [r if r.is_contiguous() and r.untyped_storage().data_ptr() not in storages
                else r.clone(memory_format=torch.contiguous_format) for r in results]

    def __repr__(self) -> str:
        return f"kiln.region[{self._overloadname}]"


def walk_order(nodes: Sequence[torch.fx.Node], regions: Sequence[Region]
               ) -> Iterator[torch.fx.Node | Region]:
    """The graph's nodes with each region in one step, dependencies first, otherwise in
    graph order (a region runs as soon as what it reads is ready)."""
    owner = {n: r for r in regions for n in r.members}
    index = {n: i for i, n in enumerate(nodes)}
    items: list[torch.fx.Node | Region] = [n for n in nodes if n not in owner] + list(regions)

    def rank(item: torch.fx.Node | Region) -> int:
        return index[item.members[0]] if isinstance(item, Region) else index[item]

    def reads(item: torch.fx.Node | Region) -> set[int]:
        sources = item.inputs if isinstance(item, Region) else item.all_input_nodes
        return {id(owner.get(s, s)) for s in sources}

    waiting = {id(item): reads(item) for item in items}
    readers: dict[int, list[torch.fx.Node | Region]] = {}
    for item in items:
        for source in waiting[id(item)]:
            readers.setdefault(source, []).append(item)
    ready = [(rank(item), id(item), item) for item in items if not waiting[id(item)]]
    heapq.heapify(ready)
    done = 0
    while ready:
        _, _, item = heapq.heappop(ready)
        done += 1
        yield item
        for reader in readers.get(id(item), []):
            waiting[id(reader)].discard(id(item))
            if not waiting[id(reader)]:
                heapq.heappush(ready, (rank(reader), id(reader), reader))
    if done != len(items):  # regions are closed (`_convex`): a cycle is kiln's bug
        raise AssertionError("regions left a cycle in the graph")
