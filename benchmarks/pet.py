"""What the PET pass finds on each model: subprograms, mutants generated, tested, shown
correct and applied, the corrections' cost, and its compile time, with the end-to-end timing
of the PET row against plain kiln taken by `kiln bench --pet` (interleaved, one process).

    python benchmarks/pet.py --models resnet18,mobilenet_v2,bert,hf_vit [--quick] [--batch N]

``--batch N`` builds the CNNs' inputs at batch N (PET's batch-merging pays only above 1);
it repeats the model's first input along the batch axis.
"""

from __future__ import annotations

import argparse
import time

import torch

import kiln
from kiln import bench, models


def summarize(name: str, quick: bool, batch: int) -> None:
    model, inputs = models.build(name, quick=quick, seed=0)
    if batch > 1:
        inputs = tuple(x.expand(batch, *x.shape[1:]).contiguous() if x.dim() == 4 else x
                       for x in inputs)
    for pet in (False, True):
        start = time.perf_counter()
        compiled = kiln.compile(model, inputs, options=kiln.Options(pet=pet))
        seconds = time.perf_counter() - start
        if pet:
            for g in compiled.report.graphs:
                for p in g.passes:
                    if p.pet is not None:
                        print(f"{name}: {p.pet.describe()}")
                        print(f"  rejected: {dict(p.pet.rejected)}")
        with torch.no_grad():
            err = (compiled(*inputs) - model(*inputs)).abs().max().item() \
                if isinstance(model(*inputs), torch.Tensor) else float("nan")
        print(f"{name}: compile {'with' if pet else 'without'} pet {seconds:.1f} s, "
              f"max abs error vs eager {err:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="resnet18,mobilenet_v2,bert")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--no-bench", action="store_true", help="only the PET summaries")
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    for name in names:
        summarize(name, args.quick, args.batch)
    if not args.no_bench and args.batch == 1:
        results = bench.run_bench(names, quick=args.quick, pet=True)
        from kiln.cli.output import markdown_table

        print(markdown_table(results))


if __name__ == "__main__":
    main()
