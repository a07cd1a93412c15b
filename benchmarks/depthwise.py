"""Depthwise convolution benchmark: kiln's generated kernel (`kiln.kernels.depthwise`) side by
side with ATen's convolution, oneDNN on a weight reordered once, and ONNX Runtime (optional
peer), on the depthwise layers of MobileNetV2 (batch 1, channels-last, fp32, bias + ReLU6).

    python benchmarks/depthwise.py [--quick] [--threads 2] [--rounds 15] [--json out.json]

All contenders run in one process, interleaved sample by sample (`benchmarks/ops.py`'s
``measure``: a pause, then an untimed call, before each sample), each on the same NHWC input,
with the bias and ReLU6 included (ATen: conv then clamp_ in place; oneDNN: bias as a post-op,
then clamp_; ORT: Conv + Clip in one graph, NCHW in and out, as an ONNX model gives it).
Printed per layer: median microseconds, GFLOP/s (2 * MACs) and the best library contender's
time over kiln's. Timings move with what else runs on the machine: with 2 threads on 2 cores,
another busy process stalls every parallel region for a scheduler time slice (medians of
~8 ms per call, for any contender); repeat the run and compare runs.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch

from kiln.codegen.isa import target_isa
from kiln.codegen.kernel import compile_kernel
from kiln.ir.ops import Op
from kiln.kernels.depthwise_schedule import (
    DepthwiseConfig,
    DepthwiseShape,
    depthwise_plan,
    pack_depthwise_weight,
)
from kiln.kernels.plan import Epilogue
from kiln.options import Options

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ops import layer_args, layer_row, layer_table, measure  # noqa: E402  (benchmarks/ops.py: interleaved samples, settle pause)

# (channels, input size, stride): MobileNetV2 1.0 at 224x224, each distinct depthwise layer
LAYERS = ((32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2),
          (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1))
QUICK = ((32, 112, 1), (96, 112, 2), (576, 14, 1))


def _ort_session(c: int, size: int, stride: int, w: torch.Tensor, b: torch.Tensor):  # noqa: ANN202
    """An ORT session of Conv(group=C) + Clip(0, 6), or None where ORT is not installed."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    out = (size + 2 - 3) // stride + 1
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], group=c, kernel_shape=[3, 3],
                          pads=[1, 1, 1, 1], strides=[stride, stride]),
         helper.make_node("Clip", ["y", "lo", "hi"], ["z"])],
        "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, c, out, out])],
        [numpy_helper.from_array(w.numpy(), "w"), numpy_helper.from_array(b.numpy(), "b"),
         numpy_helper.from_array(torch.tensor(0.0).numpy(), "lo"),
         numpy_helper.from_array(torch.tensor(6.0).numpy(), "hi")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def bench_layer(c: int, size: int, stride: int, options: Options, rounds: int,
                settle_s: float) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, c, size, size, generator=gen)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(c, 1, 3, 3, generator=gen)
    b = torch.randn(c, generator=gen)
    w_cl = w.contiguous(memory_format=torch.channels_last)
    shape = DepthwiseShape(1, c, size, size, (3, 3), (stride, stride), (1, 1), bias=True)
    oh, ow = shape.out
    lanes = target_isa(options).f32_lanes
    plan = depthwise_plan(shape, DepthwiseConfig.default(shape, lanes),
                          name=f"dw_{c}_{size}_{stride}", epilogue=Epilogue(Op.CLAMP, (0.0, 6.0)))
    kernel = compile_kernel(plan.build(), options)
    packed = pack_depthwise_weight(w)
    out = torch.empty(1, c, oh, ow).contiguous(memory_format=torch.channels_last)
    pointers = (x_cl.data_ptr(), packed.data_ptr(), b.data_ptr(), out.data_ptr())
    mkldnn = torch.ops.mkldnn
    reordered = mkldnn._reorder_convolution_weight(w_cl, [1, 1], [stride, stride], [1, 1], c,
                                                   [1, c, size, size])

    def aten() -> object:
        return torch.nn.functional.conv2d(x_cl, w_cl, b, stride, 1, 1, c).clamp_(0.0, 6.0)

    def onednn() -> object:
        return mkldnn._convolution_pointwise(x_cl, reordered, b, [1, 1], [stride, stride],
                                             [1, 1], c, "none", [], "").clamp_(0.0, 6.0)

    def kiln() -> object:
        return kernel.run_unchecked(*pointers)

    contenders = {"aten": aten, "onednn_packed": onednn, "kiln": kiln}
    session = _ort_session(c, size, stride, w, b)
    if session is not None:
        feed = {"x": x.numpy()}
        contenders["ort"] = lambda: session.run(None, feed)
    with torch.no_grad():
        kiln()
        want = aten()
        err = float((out - want).abs().max())
        # a pause before each sample lets the previous contender's pool (ORT's, libgomp's)
        # stop spinning; one untimed call then wakes this contender's own (`ops.measure`)
        timings = measure(contenders, samples=rounds, settle_s=settle_s)
    return layer_row(f"{c}x{size}x{size} s{stride}", 2 * shape.macs, err, timings)


def main(argv: list[str] | None = None) -> int:
    args = layer_args(__doc__.splitlines()[0], argv)
    options = Options.from_env()
    rows = [bench_layer(c, s, st, options, args.rounds, args.settle)
            for c, s, st in (QUICK if args.quick else LAYERS)]
    ratios = layer_table(rows, "depthwise 3x3 + bias + relu6, NHWC fp32")
    print(f"geomean speedup of kiln over the best library contender: "
          f"{statistics.geometric_mean(ratios):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
