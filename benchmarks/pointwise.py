"""Pointwise (1x1) convolution benchmark: kiln's GEMM over the pixels of NHWC data
(`kiln.passes.pointwise` + `kiln.kernels.gemm`) side by side with ATen's NHWC convolution and
oneDNN on a weight reordered once, on the 1x1 layers of MobileNetV2 and ResNet-50 (batch 1,
fp32, bias + activation, and the residual where the model has one).

    python benchmarks/pointwise.py [--quick] [--threads 2] [--rounds 15] [--json out.json]

All contenders run in one process, interleaved sample by sample (`benchmarks/ops.py`'s
``measure``), on the same NHWC input, epilogue included: ATen is conv, then add_ (residual)
and the activation in place; oneDNN is ``_convolution_pointwise`` with the bias as a post-op
(then the same in-place epilogue); kiln is the GEMM kernel the compiler builds for this
layer: B packed once, the bias (or residual + bias, added by an ATen add first, as the pass
writes it) as the register tile's start, the activation in its write-back, reading and
writing the NHWC tensors in place. Printed per layer: median microseconds, GFLOP/s and the
best library contender's time over kiln's.
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
from kiln.kernels.gemm_schedule import GemmConfig, default_gemm_config, gemm_plan, pack_b
from kiln.kernels.plan import Epilogue
from kiln.options import Options

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ops import layer_args, layer_row, layer_table, measure  # noqa: E402  (benchmarks/ops.py: interleaved samples, settle pause)

# (input size, C_in, C_out, stride, activation, residual)
MOBILENET = ((112, 32, 16, 1, None, False), (112, 16, 96, 1, "relu6", False),
             (56, 96, 24, 1, None, False), (56, 24, 144, 1, "relu6", False),
             (56, 144, 24, 1, None, True), (28, 144, 32, 1, None, False),
             (28, 192, 32, 1, None, True), (14, 192, 64, 1, None, False),
             (14, 384, 64, 1, None, True), (14, 384, 96, 1, None, False),
             (14, 576, 96, 1, None, True), (7, 576, 160, 1, None, False),
             (7, 960, 160, 1, None, True), (7, 960, 320, 1, None, False),
             (7, 320, 1280, 1, "relu6", False))
RESNET50 = ((56, 64, 64, 1, "relu", False), (56, 64, 256, 1, "relu", True),
            (56, 256, 64, 1, "relu", False), (56, 256, 512, 2, None, False),
            (28, 512, 128, 1, "relu", False), (28, 128, 512, 1, "relu", True),
            (28, 512, 1024, 2, None, False), (14, 1024, 256, 1, "relu", False),
            (14, 256, 1024, 1, "relu", True), (14, 1024, 2048, 2, None, False),
            (7, 2048, 512, 1, "relu", False), (7, 512, 2048, 1, "relu", True))
QUICK = ((112, 16, 96, 1, "relu6", False), (14, 576, 96, 1, None, True),
         (7, 512, 2048, 1, "relu", True))
ACTS = {"relu": (Op.RELU, ()), "relu6": (Op.CLAMP, (0.0, 6.0))}


def bench_layer(layer: tuple, options: Options, rounds: int, settle_s: float) -> dict:
    size, c_in, c_out, stride, act, residual = layer
    out_size = (size - 1) // stride + 1
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, c_in, size, size, generator=gen).contiguous(
        memory_format=torch.channels_last)
    w = torch.randn(c_out, c_in, 1, 1, generator=gen) / c_in ** 0.5
    b = torch.randn(c_out, generator=gen)
    r = torch.randn(1, c_out, out_size, out_size, generator=gen).contiguous(
        memory_format=torch.channels_last)
    w_cl = w.contiguous(memory_format=torch.channels_last)
    m, k, n = out_size * out_size, c_in, c_out
    isa = target_isa(options)
    epilogue = Epilogue(*ACTS[act]) if act else None
    cfg = default_gemm_config(m, n, k, base=GemmConfig.for_isa(isa), b_prepacked=True,
                              one_k_block=epilogue is not None)
    plan = gemm_plan(m, n, k, cfg, bias=True, name=f"pw_{size}_{c_in}_{c_out}_{stride}",
                     b_prepacked=True, epilogue=epilogue, bias_matrix=residual)
    kernel = compile_kernel(plan.build(), options)
    packed = pack_b(w.view(n, k).t(), cfg.nr)
    out = torch.empty(1, c_out, out_size, out_size).contiguous(memory_format=torch.channels_last)
    rows = x.permute(0, 2, 3, 1)[:, ::stride, ::stride]
    mkldnn = torch.ops.mkldnn
    reordered = mkldnn._reorder_convolution_weight(w_cl, [0, 0], [stride, stride], [1, 1], 1,
                                                   [1, c_in, size, size])

    def epilogue_in_place(y: torch.Tensor) -> torch.Tensor:
        if residual:
            y.add_(r)
        if act == "relu":
            y.relu_()
        elif act == "relu6":
            y.clamp_(0.0, 6.0)
        return y

    def aten() -> object:
        return epilogue_in_place(torch.nn.functional.conv2d(x, w_cl, b, stride))

    def onednn() -> object:
        return epilogue_in_place(mkldnn._convolution_pointwise(
            x, reordered, b, [0, 0], [stride, stride], [1, 1], 1, "none", [], ""))

    def kiln() -> object:
        a = rows.reshape(m, k)  # a view at stride 1, a copy of every s-th pixel otherwise
        start = (r.permute(0, 2, 3, 1).reshape(m, n) + b) if residual else b
        return kernel(a, packed, start, out.permute(0, 2, 3, 1).view(m, n))

    contenders = {"aten": aten, "onednn_packed": onednn, "kiln": kiln}
    with torch.no_grad():
        kiln()
        want = aten()
        err = float((out - want).abs().max())
        timings = measure(contenders, samples=rounds, settle_s=settle_s)
    label = (f"{size}x{size} {c_in}->{c_out} s{stride}{' +r' if residual else ''}"
             f"{' ' + act if act else ''}")
    return layer_row(label, 2 * m * k * n, err, timings)


def main(argv: list[str] | None = None) -> int:
    args = layer_args(__doc__.splitlines()[0], argv)
    options = Options.from_env()
    layers = QUICK if args.quick else MOBILENET + RESNET50
    rows = [bench_layer(layer, options, args.rounds, args.settle) for layer in layers]
    ratios = layer_table(rows, "1x1 convolution, NHWC fp32", width=32)
    for label, group in (("MobileNetV2", MOBILENET), ("ResNet-50", RESNET50)):
        picked = [(row, ratio) for row, ratio, layer in zip(rows, ratios, layers)
                  if layer in group]
        if picked:
            print(f"{label}: geomean best library / kiln "
                  f"{statistics.geometric_mean([r for _, r in picked]):.2f}x over {len(picked)} "
                  f"layers; max |error| {max(row['max_abs_err'] for row, _ in picked):.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
