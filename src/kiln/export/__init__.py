"""Write kiln's optimized graph out in standard formats (kiln.export.onnx: ONNX)."""
