"""ONNX import: an ONNX model becomes a kiln Graph, compiled like a PyTorch model.

    compiled = kiln.compile("model.onnx", shapes={"input_ids": (1, 128)})
    imported = import_onnx(model_proto)       # .graph, .input_names, .example_inputs()

Needs the ``onnx`` package; a node kiln has no translation for runs as it is, by onnx's
reference evaluator (or ``onnxruntime``, where that cannot): ``pip install 'kiln[onnx]'``.
"""

from kiln.frontend.onnx.errors import OnnxImportError
from kiln.frontend.onnx.importer import ImportedOnnx, compile_onnx, import_onnx, parse_shapes
from kiln.frontend.onnx.load import load_onnx

__all__ = ["ImportedOnnx", "OnnxImportError", "compile_onnx", "import_onnx", "load_onnx",
           "parse_shapes"]
