"""Import an ATen-level fx graph (functional, static shapes) into a kiln Graph.

Every ATen call becomes the kiln op its converter chooses, or an opaque CALL node that runs
the original op. A converter's result is checked against the types the capture recorded, so
a converter mistake falls back to CALL instead of computing something else.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch._higher_order_ops.effects import with_effects

from kiln.frontend import patches  # noqa: F401 - registers its converters
from kiln.frontend.aten import CONVERTERS
from kiln.frontend.regions import Region, RegionError, find_regions, split_shared, walk_order
from kiln.frontend.strided import STRIDED_READS, OutsideOperand
from kiln.ir import attrs as A
from kiln.ir.builder import GraphBuilder
from kiln.ir.graph import Graph, Value
from kiln.ir.infer import InferenceError
from kiln.ir.ops import Op
from kiln.ir.types import TensorType, UnsupportedDType

log = logging.getLogger("kiln")


class UnsupportedGraph(Exception):
    """The fx graph has something kiln's IR cannot hold; the caller runs it eagerly."""

    def __init__(self, node: torch.fx.Node | None, reason: str) -> None:
        where = f" at node '{node.name}' ({_describe(node)})" if node is not None else ""
        super().__init__(f"{reason}{where}")
        self.node = node
        self.reason = reason


@dataclass
class ImportedGraph:
    graph: Graph
    tensor_positions: tuple[int, ...]  # which call arguments feed graph inputs, in order
    opaque: list[str] = field(default_factory=list)  # ATen ops kept as CALL nodes
    # The fx outputs in order: an int is the index of a graph output, a Literal a value that
    # is not a tensor (None for a gradient nobody asked for, a saved size in training graphs)
    output_template: tuple[int | Literal, ...] = ()


@dataclass(frozen=True)
class Literal:
    value: Any


def fill_outputs(template: Sequence[int | Literal], results: Sequence[Any]) -> list[Any]:
    return [results[t] if isinstance(t, int) else t.value for t in template]


def import_fx(gm: torch.fx.GraphModule, frozen: Mapping[int, tuple[str, torch.Tensor]],
              device: torch.device | str = "cpu") -> ImportedGraph:
    """``frozen`` maps a placeholder position to the (name, tensor) of a weight to inline."""
    importer = _Importer(GraphBuilder(device))
    return importer.run(gm, frozen)


class _Importer:
    def __init__(self, builder: GraphBuilder) -> None:
        self.b = builder
        self.device = builder.device
        self.env: dict[torch.fx.Node, Any] = {}
        self.opaque: list[str] = []
        # set per converted call, read by converters through the Context protocol
        self.out_types: tuple[TensorType, ...] = ()
        self.target: Any = None

    # -- Context protocol used by converters ---------------------------------------------------
    def operand(self, x: Any) -> Value:
        return x if isinstance(x, Value) else self.b.scalar(x)

    def emit(self, op: Op, *inputs: Value, attrs: A.Attrs = A.NO_ATTRS) -> tuple[Value, ...]:
        return self.b.node(op, *inputs, attrs=attrs, name=self.name).outputs

    def constant_value(self, x: Value) -> torch.Tensor | None:
        if x.node.op is not Op.CONSTANT:
            return None
        return self.b.constants[x.node.attrs.name]  # type: ignore[attr-defined]

    # -- the walk ------------------------------------------------------------------------------
    def run(self, gm: torch.fx.GraphModule,
            frozen: Mapping[int, tuple[str, torch.Tensor]]) -> ImportedGraph:
        positions = []
        outputs: list[Value] = []
        template: list[int | Literal] = []
        split_shared(gm)  # (a shared complex table: each reader's region its own copy)
        nodes = list(gm.graph.nodes)
        placeholders = {n: i for i, n in enumerate(n for n in nodes if n.op == "placeholder")}
        weights = {n: frozen[i][1] for n, i in placeholders.items() if i in frozen}
        weights.update((n, getattr(gm, n.target)) for n in nodes if n.op == "get_attr")
        try:
            regions = find_regions(gm, weights)
        except RegionError as err:
            raise UnsupportedGraph(err.node, err.reason) from None
        for node in walk_order(nodes, regions):
            if isinstance(node, Region):
                self._region(node)
                continue
            self.name = node.name
            if node.op == "placeholder":
                i = placeholders[node]
                if i in frozen:
                    name, tensor = frozen[i]
                    self.env[node] = self._typed(node, self.b.constant, name, tensor)
                elif isinstance(node.meta.get("val"), torch.Tensor):
                    val_type = self._type_of(node, node.meta["val"])
                    self.env[node] = self.b.input(node.name, val_type)
                    positions.append(i)
                else:
                    self.env[node] = None  # a size or flag argument, already specialized
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "get_attr":
                tensor = getattr(gm, node.target)
                self.env[node] = self._typed(node, self.b.constant, node.target, tensor)
            elif node.op == "output":
                outputs, template = self._outputs(node)
            else:
                raise UnsupportedGraph(node, f"fx node kind '{node.op}' is not supported")
        return ImportedGraph(self.b.build(*outputs), tuple(positions), self.opaque,
                             tuple(template))

    def _region(self, region: Region) -> None:
        """Nodes kiln cannot type, run as one call (`kiln.frontend.regions`)."""
        operands = [self.env[n] for n in region.inputs]
        if not all(isinstance(v, Value) for v in operands):
            raise UnsupportedGraph(region.members[0], "a region reads a value that is not a "
                                                      "tensor")
        attrs = A.CallAttrs(region.call, (tuple(A.Operand(i) for i in range(len(operands))),))
        types = tuple(self._type_of(n, n.meta["val"]) for n in region.outputs)
        self.opaque.append(f"kiln.region({', '.join(region.targets)})")
        built = self.b.node(Op.CALL, *operands, attrs=attrs, types=types,
                            name=f"region_{region.members[0].name}")
        for n, value in zip(region.outputs, built.outputs):
            self.env[n] = value

    def _typed(self, node: torch.fx.Node, make: Any, *args: Any) -> Value:
        try:
            return make(*args)
        except (UnsupportedDType, TypeError) as err:
            raise UnsupportedGraph(node, str(err)) from None

    def _outputs(self, node: torch.fx.Node) -> tuple[list[Value], list[int | Literal]]:
        flat, _ = torch.utils._pytree.tree_flatten(node.args[0])
        values: list[Value] = []
        template: list[int | Literal] = []
        for item in flat:
            value = self.env.get(item) if isinstance(item, torch.fx.Node) else item
            if isinstance(value, Value):
                template.append(len(values))
                values.append(value)
            elif value is None or isinstance(value, (bool, int, float)):
                template.append(Literal(value))
            else:
                raise UnsupportedGraph(node, f"graph output {item!r} is not a tensor")
        return values, template

    def _call(self, node: torch.fx.Node) -> Any:
        if node.target is operator.getitem:
            source, index = node.args
            parts = self.env[source]
            if not isinstance(parts, tuple):
                raise UnsupportedGraph(node, "getitem on a value that is not a tuple")
            return parts[index]
        if node.target is with_effects:
            return self._effect(node)
        if not isinstance(node.target, torch._ops.OpOverload):
            raise UnsupportedGraph(node, f"call of {node.target!r} is not an ATen op")
        if node.target in _RUNTIME_CHECKS:
            _RUNTIME_CHECKS[node.target](self, node)  # holds for the static types, or raises
            return None
        # an op that returns nothing runs for its effect (one_hot's bounds check,
        # ``_assert_async``, raises on an index out of range): a CALL without results
        returns_nothing = node.meta.get("val") is None and not node.target._schema.returns
        self.out_types = () if returns_nothing else self._out_types(node)
        self.target = node.target
        args = torch.fx.node.map_arg(node.args, self.env.__getitem__)
        kwargs = torch.fx.node.map_arg(node.kwargs, self.env.__getitem__)
        if node.target in STRIDED_READS:
            try:
                return STRIDED_READS[node.target](self, node, *args, **kwargs)
            except OutsideOperand as err:
                raise UnsupportedGraph(node, f"{node.target} cannot be made independent of "
                                             f"layouts: {err}") from None
        converter = CONVERTERS.get(node.target)
        if converter is not None:
            result = self._try_convert(converter, node, args, kwargs)
            if result is not None:
                return result[0] if _single(node) else result
        return self._opaque(node, args, kwargs)

    def _try_convert(self, converter: Any, node: torch.fx.Node, args: Any,
                     kwargs: Any) -> tuple[Value, ...] | None:
        mark = len(self.b.nodes)
        try:
            result = converter(self, *args, **kwargs)
        except (InferenceError, TypeError, ValueError, IndexError) as err:
            log.debug("kiln: converter for %s failed on %s: %s", node.target, node.name, err)
            result = None
        if result is not None and self._agrees(node, tuple(result)):
            return tuple(result)
        if result is not None:
            log.debug("kiln: converter for %s gave %s, capture says %s; kept as a call",
                      node.target, [v if v is None else str(v.type) for v in result],
                      self.out_types)
        del self.b.nodes[mark:]  # drop whatever the failed attempt built
        return None

    def _agrees(self, node: torch.fx.Node, result: tuple[Value | None, ...]) -> bool:
        """Same output types as captured; outputs left None must be unread (a ``getitem``
        that nothing reads does not count: make_fx's retrace of a graph with symbolic shapes
        keeps batch norm's unused statistics as such)."""
        if len(result) != len(self.out_types):
            return False
        read = {u.args[1] for u in node.users if u.target is operator.getitem and u.users}
        return all((v is None and i not in read) or (v is not None and v.type == t)
                   for i, (v, t) in enumerate(zip(result, self.out_types)))

    def _effect(self, node: torch.fx.Node) -> tuple[Any, ...]:
        """``with_effects(token, op, *args)``: AOTAutograd threads a token through ops with
        an effect (``_linalg_check_errors`` raises on a singular matrix) to keep them in order.
        The op becomes a CALL kept in graph order (kiln.ir.calls); the token passes through."""
        token, op, *args = node.args
        if not isinstance(op, torch._ops.OpOverload):
            raise UnsupportedGraph(node, f"with_effects of {op!r}, which is not an ATen op")
        results = node.meta["val"][1:]
        self.out_types = tuple(self._type_of(node, v) for v in results if v is not None)
        self.target = op
        args = torch.fx.node.map_arg(tuple(args), self.env.__getitem__)
        kwargs = torch.fx.node.map_arg(node.kwargs, self.env.__getitem__)
        outputs = self._opaque(node, args, kwargs, target=op)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return (self.env[token], *outputs)

    def _opaque(self, node: torch.fx.Node, args: Any, kwargs: Any, target: Any = None) -> Any:
        operands: list[Value] = []

        def template(x: Any) -> Any:
            if isinstance(x, Value):
                operands.append(x)
                return A.Operand(len(operands) - 1)
            if isinstance(x, (list, tuple)):
                return tuple(template(v) for v in x)
            return x

        target = node.target if target is None else target
        attrs = A.CallAttrs(target, template(tuple(args)),
                            tuple((k, template(v)) for k, v in kwargs.items()))
        self.opaque.append(str(target))
        built = self.b.node(Op.CALL, *operands, attrs=attrs, types=self.out_types,
                            name=node.name)
        if not self.out_types:
            return None
        return built.out() if _single(node) else built.outputs

    def _out_types(self, node: torch.fx.Node) -> tuple[TensorType, ...]:
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        return tuple(self._type_of(node, v) for v in vals)

    def _type_of(self, node: torch.fx.Node, val: Any) -> TensorType:
        if not isinstance(val, torch.Tensor):
            raise UnsupportedGraph(node, f"result {val!r} is not a tensor")
        if any(not isinstance(d, int) for d in val.shape):
            raise UnsupportedGraph(node, "symbolic shapes must be specialized before import")
        if val.device != self.device:
            raise UnsupportedGraph(node, f"tensor on {val.device}, graph on {self.device}")
        try:
            return TensorType.of(val)
        except UnsupportedDType as err:
            raise UnsupportedGraph(node, str(err)) from None


def _check_metadata(importer: Any, node: torch.fx.Node) -> None:
    """torch.export records each ``.to(dtype)`` as ``_assert_tensor_metadata(x, dtype=...)``:
    a run-time check of what kiln's static types already say. Checked here, once."""
    value = importer.env[node.args[0]]
    t = value.type if isinstance(value, Value) else None
    size = node.kwargs.get("size", node.args[1] if len(node.args) > 1 else None)
    dtype = node.kwargs.get("dtype", node.args[3] if len(node.args) > 3 else None)
    if t is None or (size is not None and tuple(size) != t.shape) or (
            dtype is not None and dtype != t.dtype.torch):
        raise UnsupportedGraph(node, f"tensor metadata check fails on {t} (size {size}, "
                                     f"dtype {dtype})")


def _check_scalar(importer: Any, node: torch.fx.Node) -> None:
    """``_assert_scalar(cond, msg)`` on sizes that are static here: a Python bool."""
    cond = node.args[0]
    if cond is not True:
        raise UnsupportedGraph(node, f"run-time assertion on {cond!r}: {node.args[1]}")


# ops that only check, at run time, what kiln knows statically: verified at import, dropped
_RUNTIME_CHECKS: dict[Any, Any] = {
    torch.ops.aten._assert_tensor_metadata.default: _check_metadata,
    torch.ops.aten._assert_scalar.default: _check_scalar,
}


def _single(node: torch.fx.Node) -> bool:
    return not isinstance(node.meta.get("val"), (list, tuple))


def _describe(node: torch.fx.Node) -> str:
    return str(node.target) if node.op == "call_function" else node.op
