"""kiln.compile of ONNX models: the zoo exported by torch.onnx.export matches eager PyTorch;
dynamic dims specialize; nodes kiln has no translation for run as they are, correctly."""

import warnings

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

import kiln  # noqa: E402
from kiln import models  # noqa: E402
from kiln.frontend.onnx import OnnxImportError, import_onnx, parse_shapes  # noqa: E402
from kiln.ir.graph import Graph  # noqa: E402

ZOO = ["mlp", "resnet18", "mobilenet_v2", "inception", "bert", "gpt2", "vit_b16"]
FAST = kiln.Options(opt_level=1)  # passes and runtime, no generated kernels: fast compiles


def _export(model, inputs, path, dynamo=False, **kwargs):
    if dynamo:
        pytest.importorskip("onnxscript")  # the torch.export-based exporter needs it
    else:
        kwargs["opset_version"] = 17
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter's notice
        torch.onnx.export(model, inputs, str(path), dynamo=dynamo, **kwargs)
    return path


@pytest.mark.parametrize("name", ZOO)
def test_zoo_model_matches_eager(name, tmp_path):
    model, inputs = models.build(name, quick=True)
    path = _export(model, inputs, tmp_path / f"{name}.onnx")
    options = kiln.Options() if name in ("resnet18", "bert") else FAST  # default level twice
    compiled = kiln.compile(str(path), options=options)
    with torch.no_grad():
        expected = model(*inputs)
    torch.testing.assert_close(compiled(*inputs), expected, rtol=1e-4, atol=1e-4)
    assert compiled.report.graphs and not compiled.report.fallbacks


def test_attention_of_an_exported_model_is_fused(tmp_path):
    """The zoo GPT-2's attention (a causal ``masked_fill``, the scale a constant as the
    importer leaves it) becomes one attention call through ONNX too, and matches eager."""
    model, inputs = models.build("gpt2", quick=True)
    path = _export(model, inputs, tmp_path / "gpt2.onnx")
    compiled = kiln.compile(str(path), options=kiln.Options(measure_kernels=False,
                                                            generated_kernels=False))
    graph = compiled.report.graphs[0].details.optimized
    ops = [n.op.text for n in graph.nodes]
    assert "softmax" not in ops and ops.count("call") == len(model.blocks)
    with torch.no_grad():
        expected = model(*inputs)
    torch.testing.assert_close(compiled(*inputs), expected, rtol=1e-4, atol=1e-4)


def test_dynamic_dims_specialize_with_shapes(tmp_path):
    model, (ids,) = models.build("bert", quick=True)
    path = _export(model, (ids,), tmp_path / "bert.onnx", input_names=["input_ids"],
                   dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}})
    with pytest.raises(OnnxImportError, match="shapes="):
        kiln.compile(str(path))
    imported = import_onnx(str(path), shapes={"input_ids": (2, 8)})
    assert isinstance(imported.graph, Graph)
    assert imported.input_names == ["input_ids"] and len(imported.output_names) == 1
    (example,) = imported.example_inputs()
    assert example.shape == (2, 8) and example.dtype == torch.int64
    assert 0 <= int(example.min()) and int(example.max()) < 2
    compiled = kiln.compile(str(path), shapes={"input_ids": (2, 8)}, options=FAST)
    other = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(compiled(other), model(other), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="expected"):
        compiled(torch.randint(0, 100, (1, 8)))  # compiled for (2, 8) only


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _value(name, dims, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def _ort(model, *arrays):
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, arrays)))


def test_node_without_translation_runs_as_is():
    """Hardmax and TopK have no translation: they run by onnxruntime inside the compiled
    graph, between kiln's ops, and the result is onnxruntime's."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Hardmax", ["r"], ["h"], axis=1),
             helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
             helper.make_node("Add", ["h", "v"], ["y"])]
    k = onnx.numpy_helper.from_array(np.array([4], np.int64), "k")
    model = _model(nodes, [_value("x", [3, 4])], [_value("y", [3, 4]),
                                                 _value("i", [3, 4], TensorProto.INT64)], [k])
    compiled = kiln.compile(model, options=FAST)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    y, i = compiled(x)  # numpy in, torch out
    expected_y, expected_i = _ort(model, x)
    np.testing.assert_allclose(y.numpy(), expected_y, rtol=1e-6)
    np.testing.assert_array_equal(i.numpy(), expected_i)
    opaque = compiled.report.graphs[0].opaque_ops
    assert "onnx::Hardmax" in opaque and "onnx::TopK" in opaque
    assert "onnx::Relu" not in opaque


def test_data_dependent_output_shape_raises_not_a_wrong_answer():
    """NonZero's output size depends on the data: specialized on the example, and any
    input giving another size raises."""
    model = _model([helper.make_node("NonZero", ["x"], ["y"])], [_value("x", [4])],
                   [_value("y", [1, None], TensorProto.INT64)])
    example = torch.tensor([1.0, 0.0, 2.0, 0.0])
    compiled = kiln.compile(model, (example,), options=FAST)
    assert compiled(torch.tensor([0.0, 3.0, 0.0, 5.0])).tolist() == [[1, 3]]
    with pytest.raises(Exception, match="depends on the data"):
        compiled(torch.tensor([1.0, 1.0, 1.0, 0.0]))


def test_onnx_semantics_that_differ_from_torch():
    """Integer Div truncates, Mod follows the divisor's sign, Gemm transposes and scales,
    Reshape's 0 copies a dimension: each compared with onnxruntime."""
    b = onnx.numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "b")
    shape = onnx.numpy_helper.from_array(np.array([0, -1], np.int64), "shape")
    nodes = [helper.make_node("Div", ["p", "q"], ["div"]),
             helper.make_node("Mod", ["p", "q"], ["mod"]),
             helper.make_node("Gemm", ["a", "b"], ["gemm0"], transA=1, transB=1, alpha=0.5),
             helper.make_node("Reshape", ["gemm0", "shape"], ["gemm"])]
    ints = [3, 4]
    model = _model(nodes, [_value("p", ints, TensorProto.INT32),
                           _value("q", ints, TensorProto.INT32), _value("a", [3, 2])],
                   [_value("div", ints, TensorProto.INT32),
                    _value("mod", ints, TensorProto.INT32), _value("gemm", [2, 4])], [b, shape])
    rng = np.random.default_rng(1)
    p = rng.integers(-20, 20, ints).astype(np.int32)
    q = rng.choice([-7, -3, 2, 5], ints).astype(np.int32)
    a = rng.standard_normal((3, 2)).astype(np.float32)
    compiled = kiln.compile(model, (p, q, a), options=FAST)
    for got, expected in zip(compiled(p, q, a), _ort(model, p, q, a)):
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)
    opaque = compiled.report.graphs[0].opaque_ops  # ATen ops kiln calls as they are may be
    assert not [op for op in opaque if op.startswith("onnx::")]  # but no node runs as is


def test_control_flow_is_refused_with_the_node_named():
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [],
                             [_value("t", [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [_value("e", [2])])
    node = helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then,
                            else_branch=other)
    model = _model([node], [_value("c", [], TensorProto.BOOL), _value("x", [2])],
                   [_value("y", [2])])
    with pytest.raises(OnnxImportError, match="If node 'branch'.*control flow"):
        kiln.compile(model)


def test_a_failing_handler_falls_back_to_running_as_is():
    """Pow of integers is outside the Pow handler: it runs as is, and matches onnxruntime."""
    model = _model([helper.make_node("Pow", ["x", "y"], ["z"])],
                   [_value("x", [5], TensorProto.INT64), _value("y", [5], TensorProto.INT64)],
                   [_value("z", [5], TensorProto.INT64)])
    x, y = np.array([2, 3, -2, 5, 0]), np.array([3, 2, 3, 0, 4])
    compiled = kiln.compile(model, options=FAST)
    np.testing.assert_array_equal(compiled(x, y).numpy(), _ort(model, x, y)[0])
    assert "onnx::Pow" in compiled.report.graphs[0].opaque_ops


@pytest.mark.parametrize("factor", [2, 3])
def test_nearest_upsampling_is_translated(factor, tmp_path):
    """nn.Upsample exports as Resize (asymmetric, floor): kiln translates whole-factor
    nearest upsampling itself and matches eager PyTorch exactly."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1),
                                torch.nn.Upsample(scale_factor=factor, mode="nearest")).eval()
    x = torch.randn(1, 3, 5, 7)
    path = _export(model, (x,), tmp_path / "up.onnx")
    compiled = kiln.compile(str(path), options=FAST)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert "onnx::Resize" not in compiled.report.graphs[0].opaque_ops


def test_resize_half_pixel_matches_the_reference():
    """The default Resize rule (half_pixel, round_prefer_floor) with constant scales."""
    from onnx.reference import ReferenceEvaluator

    scales = onnx.numpy_helper.from_array(np.array([1, 1, 3, 2], np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    model = _model([node], [_value("x", [1, 2, 3, 4])], [_value("y", [1, 2, 9, 8])], [scales])
    x = np.random.default_rng(2).standard_normal((1, 2, 3, 4)).astype(np.float32)
    compiled = kiln.compile(model, options=FAST)
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(compiled(x).numpy(), expected)
    assert "onnx::Resize" not in compiled.report.graphs[0].opaque_ops


@pytest.mark.parametrize("name,dynamo", [("hf_bert", False), ("gpt2", True)])
def test_hf_model_and_dynamo_exporter(name, dynamo, tmp_path):
    """A Hugging Face architecture, and the torch.export-based ONNX exporter (opset 18+)."""
    if name.startswith("hf_"):
        pytest.importorskip("transformers")
    model, inputs = models.build(name, quick=True)
    path = _export(model, inputs, tmp_path / f"{name}.onnx", dynamo=dynamo)
    compiled = kiln.compile(str(path), options=FAST)
    other = torch.randint(0, 100, inputs[0].shape)  # not the inputs kiln specialized on
    with torch.no_grad():
        torch.testing.assert_close(compiled(other), model(other), rtol=1e-4, atol=1e-4)
    assert not [op for op in compiled.report.graphs[0].opaque_ops if op.startswith("onnx::")]


def test_parse_shapes_for_the_cli():
    assert parse_shapes(["input_ids=1x128", "mask=2X8", "scale="]) == {
        "input_ids": (1, 128), "mask": (2, 8), "scale": ()}
    for bad in ["input_ids", "=1x2", "x=1xa", "x=1x-2"]:
        with pytest.raises(OnnxImportError, match="NAME=DIMS"):
            parse_shapes([bad])
