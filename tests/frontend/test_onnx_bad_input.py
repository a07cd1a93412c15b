"""Bad ONNX input: each case ends in one OnnxImportError with a one-line message."""

import os

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import kiln  # noqa: E402
from kiln.frontend.onnx import OnnxImportError, load_onnx  # noqa: E402


def _add_model(opset=17, weight=None, domain=""):
    """y = x + w, w an initializer (given, or 2x3 of ones)."""
    w = weight if weight is not None else numpy_helper.from_array(
        np.ones((2, 3), np.float32), "w")
    node = helper.make_node("Add", ["x", "w"], ["y"], name="add0", domain=domain)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w])
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=imports)


def _refused(source, *words):
    with pytest.raises(OnnxImportError) as info:
        kiln.compile(source)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    return message


def _external(tmp_path, location, data=None, dims=(2, 3)):
    """A model whose initializer w is external data at ``location``."""
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(dims))
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value=location)
    if data is not None:
        w.external_data.add(key="length", value=str(len(data)))
    path = tmp_path / "model.onnx"
    path.write_bytes(_add_model(weight=w).SerializeToString())
    return path


def test_valid_model_and_external_data_load(tmp_path):
    """The control for the cases below: the same model, well formed, compiles and runs."""
    weights = np.arange(6, dtype=np.float32).reshape(2, 3)
    (tmp_path / "w.bin").write_bytes(weights.tobytes())
    path = _external(tmp_path, "w.bin", weights.tobytes())
    compiled = kiln.compile(str(path))
    x = torch.randn(2, 3)
    torch.testing.assert_close(compiled(x), x + torch.from_numpy(weights))


def test_missing_empty_truncated_and_corrupt_files(tmp_path):
    _refused(str(tmp_path / "absent.onnx"), "no ONNX file")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    _refused(str(empty), "empty")
    data = _add_model().SerializeToString()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(data[: len(data) // 2])
    _refused(str(truncated))
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 4000, np.uint8)))
    _refused(str(corrupt))


def test_truncated_at_every_cut_is_refused_or_loads_whole(tmp_path):
    """Whatever byte a file is cut at, kiln refuses it cleanly (never a bare traceback)."""
    data = _add_model().SerializeToString()
    path = tmp_path / "cut.onnx"
    for cut in range(1, len(data), 7):
        path.write_bytes(data[:cut])
        with pytest.raises(OnnxImportError):
            kiln.compile(str(path))


def test_wrong_opset_and_unknown_domain():
    _refused(_add_model(opset=11), "opset 11", "13-21")
    _refused(_add_model(domain="com.example.custom"), "com.example.custom")


def test_newer_opset_with_a_changed_op_is_refused():
    model = _add_model(opset=25)
    model.graph.node.append(helper.make_node("Cast", ["y"], ["z"], to=TensorProto.INT32))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.INT32,
                                                                 [2, 3]))
    _refused(model, "Cast", "changed after opset 21")


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd", "sub/../../x.bin"])
def test_external_data_outside_the_model_directory_is_refused(tmp_path, location):
    inner = tmp_path / "model_dir"
    inner.mkdir()
    (tmp_path / "outside.bin").write_bytes(bytes(24))
    _refused(str(_external(inner, location)), "refused")


def test_external_data_through_a_symlink_out_is_refused(tmp_path):
    inner = tmp_path / "model_dir"
    inner.mkdir()
    (tmp_path / "secret.bin").write_bytes(bytes(24))
    os.symlink(tmp_path / "secret.bin", inner / "w.bin")
    _refused(str(_external(inner, "w.bin")), "symlink", "refused")


def test_external_data_too_short_or_missing(tmp_path):
    (tmp_path / "w.bin").write_bytes(bytes(8))
    _refused(str(_external(tmp_path, "w.bin")), "too short")
    _refused(str(_external(tmp_path, "gone.bin")), "missing")


def test_model_proto_with_external_data_needs_its_path(tmp_path):
    path = _external(tmp_path, "w.bin")
    _refused(onnx.load_model(str(path), load_external_data=False), "path")


def test_huge_declared_tensor_is_refused_before_loading(tmp_path):
    """2**40 floats, declared in an external tensor whose file does not even exist: refused
    on the dims alone, so nothing that size is ever allocated."""
    path = _external(tmp_path, "huge.bin", dims=(1 << 20, 1 << 20))
    _refused(str(path), "limit")
    huge = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 30, 1 << 10])
    huge.raw_data = b"\0" * 16  # inline bytes that disagree with the dims
    _refused(_add_model(weight=huge), "limit")


def test_stored_bytes_must_match_the_dims():
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 3], raw_data=bytes(20))
    _refused(_add_model(weight=w), "truncated or corrupt")


def test_load_onnx_returns_a_checked_model(tmp_path):
    path = tmp_path / "ok.onnx"
    path.write_bytes(_add_model().SerializeToString())
    assert load_onnx(str(path)).graph.node[0].op_type == "Add"
    with pytest.raises(OnnxImportError, match="takes an ONNX file path"):
        load_onnx(42)


def test_dynamic_dims_need_shapes():
    model = _add_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    message = _refused(model, "batch", "shapes=")
    assert "--shape x=" in message
    with pytest.raises(OnnxImportError, match="not inputs"):
        kiln.compile(model, shapes={"nope": (2, 3)})


def test_node_making_a_huge_tensor_is_refused_before_it_runs():
    """ConstantOfShape to 2**40 floats: ONNX's shape inference says so, kiln refuses."""
    shape = numpy_helper.from_array(np.array([1 << 20, 1 << 20], np.int64), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"], name="fill"),
             helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0),
             helper.make_node("Add", ["x", "s"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _refused(model, "ConstantOfShape node 'fill'", "limit")
