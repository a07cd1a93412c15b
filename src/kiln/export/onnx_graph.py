"""A kiln Graph as an ONNX model: walk the nodes once, emit each through the op table.

    kiln                                        ONNX (opset 17)
    %x = input {index=0} : f32[2, 8]            graph input x: float[2, 8]
    %w = constant {name='fc.weight'} ...        initializer fc.weight
    %y = addmm_act(%b, %x, %w) {relu}           Gemm(x, fc.weight, fc.bias) -> Relu -> output

Constants become initializers, Python numbers small initializers of the dtype their user
computes in. Every value keeps kiln's type as value_info, so onnx.checker's full check (strict
shape inference) compares what each ONNX op computes with what kiln says it computes.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

import onnx
from onnx import helper

from kiln.export import onnx_nn, onnx_ops
from kiln.export.onnx_builder import CONTRIB_DOMAIN, OnnxBuilder, value_info
from kiln.export.onnx_context import EmitContext, EmitterTable, OnnxExportError
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op
from kiln.ir.types import TensorType

# Opset 17 has LayerNormalization (the transformers' normalization as one op) and is the
# oldest that does: a file kiln writes loads in every ONNX Runtime since 1.12 and in most
# other runtimes. GELU (an op only from opset 20) is written as its Erf/Tanh arithmetic.
DEFAULT_OPSET = 17
MIN_OPSET = 17
# protobuf cannot serialize a message of 2 GiB; past this, weights go to external data
EXTERNAL_DATA_BYTES = 1_800_000_000

EMITTERS: EmitterTable = {**onnx_ops.EMITTERS, **onnx_nn.EMITTERS}


def export_graph(graph: Graph, *, input_names: Sequence[str] | None = None,
                 output_names: Sequence[str] | None = None, opset: int = DEFAULT_OPSET,
                 contrib_ops: bool = False, check: bool = True) -> onnx.ModelProto:
    """The ONNX model computing what ``graph`` computes; checked with onnx.checker's full
    check unless ``check`` is False. Raises OnnxExportError naming the node it cannot write."""
    if not isinstance(opset, int) or opset < MIN_OPSET:
        raise OnnxExportError(f"opset {opset!r} is not supported: kiln writes opset "
                              f"{MIN_OPSET} or newer (LayerNormalization)")
    builder = OnnxBuilder()
    ins = _names("input", input_names, [n.name for n in graph.inputs])
    outs = _names("output", output_names, ["output" if len(graph.outputs) == 1 else
                                           f"output_{i}" for i in range(len(graph.outputs))])
    for name in ins + outs:
        builder.reserve(name)
    names: dict[Value, str] = {node.out(): name for node, name in zip(graph.inputs, ins)}
    types: dict[str, TensorType] = {}
    _emit_body(graph, builder, names, types, contrib_ops)
    _bind_outputs(graph, builder, names, types, outs)
    model = _model(graph, builder, ins, outs, types, opset)
    if check:
        check_model(model)
    return model


def _names(kind: str, given: Sequence[str] | None, default: list[str]) -> list[str]:
    if given is None:
        return list(unique_names_of(default))
    given = list(given)
    if len(given) != len(default):
        raise OnnxExportError(f"the graph has {len(default)} {kind}(s); {len(given)} "
                              f"{kind} name(s) given")
    if len(set(given)) != len(given) or not all(isinstance(n, str) and n for n in given):
        raise OnnxExportError(f"{kind} names must be distinct non-empty strings: {given}")
    return given


def unique_names_of(labels: Sequence[str]) -> list[str]:
    """ONNX-safe, distinct names from kiln labels (``x``, ``x_1``, ...)."""
    taken: set[str] = set()
    result = []
    for label in labels:
        base = "".join(c if c.isalnum() or c in "_." else "_" for c in label) or "v"
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        result.append(name)
    return result


def _emit_body(graph: Graph, builder: OnnxBuilder, names: dict[Value, str],
               types: dict[str, TensorType], contrib: bool) -> None:
    read = {v for node in graph.nodes for v in node.inputs} | set(graph.outputs)
    weights: dict[str, str] = {}
    for node in graph.nodes:
        if node.op is Op.SCALAR:
            continue  # written where it is used, in the dtype its user computes in
        if node.op is Op.CONSTANT:
            key = node.attrs.name  # type: ignore[attr-defined]
            if key not in weights:
                weights[key] = builder.initializer(graph.constant(node), key)
            names[node.out()] = weights[key]
            continue
        emitter = EMITTERS.get(node.op)
        if emitter is None:
            raise _unsupported(node)
        results = emitter(EmitContext(builder, node, names, read, contrib))
        for value, name in zip(node.outputs, results, strict=True):
            if not name:
                if value in read:
                    raise OnnxExportError(f"kiln bug: node {node.name} ({node.op.text}) left "
                                          f"output {value.index} unwritten")
                continue
            names[value] = name
            types.setdefault(name, value.type)


def _unsupported(node: Node) -> OnnxExportError:
    return OnnxExportError(f"cannot write node {node.name} as ONNX: kiln has no ONNX form for "
                           f"the op {node.op.text}")


def _bind_outputs(graph: Graph, builder: OnnxBuilder, names: dict[Value, str],
                  types: dict[str, TensorType], outs: list[str]) -> None:
    """Name each output's value as asked: rename the node output that computes it, or copy
    (Identity) an input, a weight, or a value that is already another output."""
    computed = {name for node in builder.nodes for name in node.output}
    taken: set[str] = set()
    for value, out in zip(graph.outputs, outs):
        name = names.get(value)
        if name is None:  # a Python number as an output
            name = builder.literal(value.node.attrs.value, value.type.dtype)  # type: ignore
        if name in computed and name not in taken:
            _rename(builder, name, out)
            types[out] = types.pop(name, value.type)
            for v, n in names.items():
                if n == name:
                    names[v] = out
            computed.discard(name)
        else:
            builder.add("Identity", [name], out)
            builder.nodes[-1].output[0] = out
            types[out] = value.type
        taken.add(out)


def _rename(builder: OnnxBuilder, old: str, new: str) -> None:
    for node in builder.nodes:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                if name == old:
                    field[i] = new


def _model(graph: Graph, builder: OnnxBuilder, ins: list[str], outs: list[str],
           types: dict[str, TensorType], opset: int) -> onnx.ModelProto:
    boundary = set(ins) | set(outs)
    initialized = {t.name for t in builder.initializers}
    inner = [value_info(name, t) for name, t in types.items()
             if name not in boundary and name not in initialized]
    proto = helper.make_graph(
        builder.nodes, "kiln_optimized",
        inputs=[value_info(name, node.type) for name, node in zip(ins, graph.inputs)],
        outputs=[value_info(name, types[name]) for name in outs],
        initializer=builder.initializers, value_info=inner)
    opsets = [helper.make_opsetid("", opset)]
    if builder.uses_contrib:
        opsets.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    model = helper.make_model(proto, opset_imports=opsets, producer_name="kiln")
    model.ir_version = helper.find_min_ir_version_for(opsets, ignore_unknown=True)
    return model


def initializer_bytes(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) for t in model.graph.initializer)


def check_model(model: onnx.ModelProto) -> None:
    """onnx.checker's full check (strict shape inference); a model too large for one protobuf
    message is checked from a file with external data."""
    try:
        if initializer_bytes(model) < EXTERNAL_DATA_BYTES:
            onnx.checker.check_model(model, full_check=True)
            return
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model.onnx")
            save_model(model, path)
            onnx.checker.check_model(path, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise OnnxExportError(f"kiln bug: the ONNX model kiln wrote fails onnx.checker: "
                              f"{first}") from err


def save_model(model: onnx.ModelProto, path: str | os.PathLike[str]) -> None:
    """Write ``model``; weights go to ``<name>.data`` beside it when the file would pass
    protobuf's 2 GiB limit."""
    external = initializer_bytes(model) >= EXTERNAL_DATA_BYTES
    onnx.save_model(model, os.fspath(path), save_as_external_data=external,
                    all_tensors_to_one_file=True,
                    location=os.path.basename(os.fspath(path)) + ".data", size_threshold=1024)
