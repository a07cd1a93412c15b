"""Dense convolution benchmark: kiln's generated direct convolution (`kiln.kernels.conv`) side
by side with ATen's convolution and oneDNN on a weight reordered once, on the dense layers of
MobileNetV2, ResNet-50 and Inception v3 that are not 1x1 (batch 1, channels-last, fp32, bias
+ ReLU, or ReLU6 on MobileNetV2's first layer).

    python benchmarks/conv.py [--quick] [--threads 2] [--rounds 15] [--json out.json]

All contenders run in one process, interleaved sample by sample (`benchmarks/ops.py`'s
``measure``), each on the same NHWC input, the epilogue included (ATen: conv, then the
activation in place; oneDNN: bias and activation as post-ops). kiln's kernel is the one the
compiler would build for the layer (`ConvConfig.default`), whether or not
`kiln.kernels.conv.MAX_REDUCTION` lets the compiler offer it: the table is how that limit was
chosen. Printed per layer: median microseconds, GFLOP/s (2 * MACs) and the best library
contender's time over kiln's.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch

from kiln.codegen.isa import target_isa
from kiln.codegen.kernel import compile_kernel
from kiln.cost.machine import full_rate_512
from kiln.ir.ops import Op
from kiln.kernels.conv_config import ConvConfig, ConvShape
from kiln.kernels.conv_schedule import conv_plan, pack_conv_weight
from kiln.kernels.plan import Epilogue
from kiln.options import Options

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ops import layer_args, layer_row, layer_table, measure  # noqa: E402  (benchmarks/ops.py: interleaved samples, settle pause)

# (input size, C_in, C_out, kernel, stride, padding, relu6)
LAYERS = ((224, 3, 32, 3, 2, 1, True),  # MobileNetV2's first layer
          (224, 3, 64, 7, 2, 3, False),  # ResNet-50's first layer
          (56, 64, 64, 3, 1, 1, False), (56, 128, 128, 3, 2, 1, False),  # ResNet-50's 3x3s
          (28, 128, 128, 3, 1, 1, False), (14, 256, 256, 3, 1, 1, False),
          (7, 512, 512, 3, 1, 1, False),
          (299, 3, 32, 3, 2, 0, False), (149, 32, 32, 3, 1, 0, False),  # Inception v3's stem
          (147, 32, 64, 3, 1, 1, False), (35, 64, 96, 3, 1, 1, False))
QUICK = ((224, 3, 32, 3, 2, 1, True), (28, 128, 128, 3, 1, 1, False))


def bench_layer(layer: tuple, options: Options, rounds: int, settle_s: float) -> dict:
    size, c_in, c_out, k, stride, pad, relu6 = layer
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, c_in, size, size, generator=gen).contiguous(
        memory_format=torch.channels_last)
    w = torch.randn(c_out, c_in, k, k, generator=gen) / (c_in * k * k) ** 0.5
    b = torch.randn(c_out, generator=gen)
    w_cl = w.contiguous(memory_format=torch.channels_last)
    shape = ConvShape(1, c_in, size, size, c_out, (k, k), (stride, stride), (pad, pad),
                      bias=True)
    isa = target_isa(options)
    config = ConvConfig.default(shape, isa.f32_lanes, isa.registers, torch.get_num_threads(),
                                full_rate_512(options))
    act = Epilogue(Op.CLAMP, (0.0, 6.0)) if relu6 else Epilogue(Op.RELU, ())
    plan = conv_plan(shape, config, name=f"conv_{size}_{c_in}_{c_out}_{k}_{stride}_{pad}",
                     epilogue=act)
    kernel = compile_kernel(plan.build(), options)
    packed = pack_conv_weight(w, config.nr)
    out = torch.empty(1, c_out, *shape.out).contiguous(memory_format=torch.channels_last)
    pointers = (x.data_ptr(), packed.data_ptr(), b.data_ptr(), out.data_ptr())
    mkldnn = torch.ops.mkldnn
    reordered = mkldnn._reorder_convolution_weight(w_cl, [pad, pad], [stride, stride], [1, 1],
                                                   1, [1, c_in, size, size])
    post, post_args = ("hardtanh", [0.0, 6.0]) if relu6 else ("relu", [])

    def aten() -> object:
        y = torch.nn.functional.conv2d(x, w_cl, b, stride, pad)
        return y.clamp_(0.0, 6.0) if relu6 else y.relu_()

    def onednn() -> object:
        return mkldnn._convolution_pointwise(x, reordered, b, [pad, pad], [stride, stride],
                                             [1, 1], 1, post, post_args, "")

    def kiln() -> object:
        return kernel.run_unchecked(*pointers)

    contenders = {"aten": aten, "onednn_packed": onednn, "kiln": kiln}
    with torch.no_grad():
        kiln()
        err = float((out - aten()).abs().max())
        timings = measure(contenders, samples=rounds, settle_s=settle_s)
    label = f"{size}x{size} {c_in}->{c_out} k{k} s{stride} p{pad}"
    return layer_row(label, 2 * shape.macs, err, timings)


def main(argv: list[str] | None = None) -> int:
    args = layer_args(__doc__.splitlines()[0], argv)
    options = Options.from_env()
    rows = [bench_layer(layer, options, args.rounds, args.settle)
            for layer in (QUICK if args.quick else LAYERS)]
    ratios = layer_table(rows, "dense convolution + bias + activation, NHWC fp32", width=28)
    print(f"geomean best library / kiln {statistics.geometric_mean(ratios):.2f}x; "
          f"max |error| {max(row['max_abs_err'] for row in rows):.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
