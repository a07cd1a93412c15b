"""Load an ONNX model safely: parse, check, resolve the opset, load external data.

Every way a file can be wrong ends in one OnnxImportError: a truncated or corrupt file, an
opset or domain kiln does not take, a tensor whose declared size is past the limit (refused
before anything that size is allocated), external data that names a file outside the model's
directory (``../``, an absolute path, a symlink out: a known attack on ONNX loaders).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from pathlib import Path

from google.protobuf.message import DecodeError

import onnx
from kiln.frontend.onnx.errors import OnnxImportError
from onnx import TensorProto, helper

MIN_OPSET, MAX_OPSET = 13, 21  # default-domain opsets kiln's op table is written for
DEFAULT_DOMAINS = ("", "ai.onnx")
# A tensor declared larger than this is refused before loading; 4 GiB holds any weight of
# the models kiln compiles (a 7B model's embedding is 0.5 GiB in f32)
MAX_TENSOR_BYTES = 4 << 30
_PROTOBUF_LIMIT = 2 << 30  # a serialized ModelProto cannot be larger (protobuf's own limit)


def load_onnx(source: str | os.PathLike[str] | onnx.ModelProto, *,
              max_tensor_bytes: int = MAX_TENSOR_BYTES) -> onnx.ModelProto:
    """The model, checked, its local functions inlined and its external data loaded."""
    if isinstance(source, onnx.ModelProto):
        model, base = source, None
    elif isinstance(source, (str, os.PathLike)):
        model, base = _parse_file(Path(source)), Path(source).resolve().parent
    else:
        raise OnnxImportError(f"kiln.compile takes an ONNX file path or an onnx.ModelProto, "
                              f"got {type(source).__name__}")
    if not model.HasField("graph"):
        raise OnnxImportError("the ONNX model has no graph (truncated or corrupt file?)")
    check_sizes(model, max_tensor_bytes)
    check_domains(model)
    opset_version(model)  # raises for an opset kiln does not take
    if base is None and _external_tensors(model):
        raise OnnxImportError("this ModelProto refers to external data files; pass the .onnx "
                              "file's path instead, so kiln can find them next to it")
    if base is None:
        _check(model)
    else:
        reads = external_reads(model, base)  # refuses a bad reference before anything
        # the checker takes the file itself: it finds external data from the model's folder,
        # and checks a model past 2 GiB as stored
        _check(os.fspath(source))  # type: ignore[arg-type]
        for read in reads:  # parsed here, so nobody else holds it: filled in place
            read()
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    return model


def _check(model: onnx.ModelProto | str) -> None:
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise OnnxImportError(f"the ONNX model is not valid: {first}") from None


def _parse_file(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise OnnxImportError(f"no ONNX file at {path}")
    size = path.stat().st_size
    if size == 0:
        raise OnnxImportError(f"{path} is empty")
    if size > _PROTOBUF_LIMIT:
        raise OnnxImportError(f"{path} is {size} bytes, more than an ONNX protobuf can hold; "
                              f"save large weights as external data")
    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise OnnxImportError(f"{path} is not a readable ONNX model (truncated or corrupt "
                              f"file?): {type(err).__name__}: {str(err)[:120]}") from None
    return model


def opset_version(model: onnx.ModelProto) -> int:
    """The default-domain opset kiln reads the model at. A model declaring a newer opset is
    read at MAX_OPSET when every op it uses has, there, the same inputs, outputs and
    attributes (newer versions of most ops only admit more element types)."""
    declared = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not declared:
        raise OnnxImportError("the ONNX model imports no default-domain opset")
    version = declared[0]
    if version < MIN_OPSET:
        raise OnnxImportError(
            f"the model uses ONNX opset {version}; kiln takes opsets {MIN_OPSET}-{MAX_OPSET}: "
            f"convert it with onnx.version_converter.convert_version(model, {MIN_OPSET}) "
            f"or export it again with a newer opset")
    if version <= MAX_OPSET:
        return version
    for op_type in sorted(_op_types(model.graph)):
        if not _same_signature(op_type, version):
            raise OnnxImportError(
                f"the model uses ONNX opset {version}, and its op {op_type} changed after "
                f"opset {MAX_OPSET}, the newest kiln takes: export it again with "
                f"opset {MAX_OPSET} or lower")
    return MAX_OPSET


def _same_signature(op_type: str, version: int) -> bool:
    """Whether ``op_type`` at ``version`` has MAX_OPSET's inputs, outputs and attributes."""
    try:
        newer = onnx.defs.get_schema(op_type, version, "")
        older = onnx.defs.get_schema(op_type, MAX_OPSET, "")
    except onnx.defs.SchemaError:
        return False
    return newer.since_version == older.since_version or _signature(newer) == _signature(older)


def _signature(schema: onnx.defs.OpSchema) -> tuple[object, ...]:
    def params(ps: list[onnx.defs.OpSchema.FormalParameter]) -> tuple[object, ...]:
        return tuple((p.name, p.option) for p in ps)

    attributes = tuple(sorted((a.name, a.type, a.required, a.default_value.SerializeToString())
                              for a in schema.attributes.values()))
    return (params(schema.inputs), params(schema.outputs), attributes,
            schema.min_input, schema.max_input, schema.min_output, schema.max_output)


def _op_types(graph: onnx.GraphProto) -> set[str]:
    ops = set()
    for node in graph.node:
        ops.add(node.op_type)
        for attr in node.attribute:
            for sub in [attr.g, *attr.graphs]:
                ops |= _op_types(sub)
    return ops


def check_domains(model: onnx.ModelProto) -> None:
    local = {f.domain for f in model.functions}
    known = set(DEFAULT_DOMAINS) | local
    for opset in model.opset_import:
        if opset.domain not in known:
            raise OnnxImportError(
                f"the model imports operator domain '{opset.domain}', which kiln does not "
                f"know (it takes the standard ONNX domain): export it without custom or "
                f"vendor ops")
    for node in model.graph.node:
        if node.domain not in known:
            raise OnnxImportError(f"node '{node.name}' ({node.op_type}) is in operator domain "
                                  f"'{node.domain}', which kiln does not know")


def _tensors(graph: onnx.GraphProto) -> list[TensorProto]:
    found = list(graph.initializer)
    found += [s.values for s in graph.sparse_initializer]
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                found.append(attr.t)
            found.extend(attr.tensors)
            for sub in [attr.g, *attr.graphs]:
                found += _tensors(sub)
    return found


def declared_bytes(tensor: TensorProto) -> int:
    if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return 0
    itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return math.prod(tensor.dims) * itemsize


def check_sizes(model: onnx.ModelProto, limit: int) -> None:
    """Refuses a tensor whose declared dims are negative or too large, before any data is
    read for it, and one whose stored bytes disagree with its dims."""
    for tensor in _tensors(model.graph):
        if any(d < 0 for d in tensor.dims):
            raise OnnxImportError(f"tensor '{tensor.name}' declares negative dims "
                                  f"{list(tensor.dims)} (corrupt file?)")
        try:
            size = declared_bytes(tensor)
        except (KeyError, ValueError):
            raise OnnxImportError(f"tensor '{tensor.name}' has unknown element type "
                                  f"{tensor.data_type} (corrupt file?)") from None
        if size > limit:
            raise OnnxImportError(
                f"tensor '{tensor.name}' declares {list(tensor.dims)} elements, {size} bytes, "
                f"more than kiln's limit of {limit} bytes per tensor: refused before loading")
        if tensor.HasField("raw_data") and len(tensor.raw_data) != size and (
                tensor.data_type not in _SUB_BYTE):
            raise OnnxImportError(
                f"tensor '{tensor.name}' holds {len(tensor.raw_data)} bytes but its dims "
                f"{list(tensor.dims)} need {size} (truncated or corrupt file?)")


_SUB_BYTE = {getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
             if hasattr(TensorProto, n)}


def _external_tensors(model: onnx.ModelProto) -> list[TensorProto]:
    return [t for t in _tensors(model.graph) if t.data_location == TensorProto.EXTERNAL]


def external_reads(model: onnx.ModelProto, base: Path) -> list[Callable[[], None]]:
    """For each external tensor, checked now (a file inside ``base``, long enough for its
    dims), a call that reads its bytes into the model."""
    root = base.resolve()
    reads = []
    for tensor in _external_tensors(model):
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        path = _inside(root, location, tensor.name)
        offset, length = int(info.get("offset", 0) or 0), info.get("length")
        size = declared_bytes(tensor)
        if length is not None and int(length) != size:
            raise OnnxImportError(f"external tensor '{tensor.name}' says length {length} but "
                                  f"its dims need {size} bytes (corrupt model?)")
        available = path.stat().st_size - offset
        if offset < 0 or available < size:
            raise OnnxImportError(f"external data file '{location}' is too short for tensor "
                                  f"'{tensor.name}' ({size} bytes at offset {offset})")
        reads.append(functools.partial(_read, tensor, path, offset, size))
    return reads


def _read(tensor: TensorProto, path: Path, offset: int, size: int) -> None:
    with path.open("rb") as f:
        f.seek(offset)
        tensor.raw_data = f.read(size)
    del tensor.external_data[:]
    tensor.data_location = TensorProto.DEFAULT


def _inside(root: Path, location: str, tensor: str) -> Path:
    """``location`` resolved inside ``root``, symlinks followed; refused if it leaves it."""
    relative = Path(location)
    if not location or relative.is_absolute() or ".." in relative.parts or (
            os.path.splitdrive(location)[0]):
        raise OnnxImportError(f"external data for tensor '{tensor}' names '{location}', "
                              f"outside the model's directory: refused (kiln reads external "
                              f"data only from files next to the model)")
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise OnnxImportError(f"external data for tensor '{tensor}' ('{location}') leads out "
                              f"of the model's directory through a symlink: refused")
    if not path.is_file():
        raise OnnxImportError(f"external data file '{location}' for tensor '{tensor}' is "
                              f"missing next to the model")
    return path
