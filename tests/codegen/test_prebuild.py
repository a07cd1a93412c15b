"""codegen.kernel.prebuild fills the kernel cache with parallel compiler runs."""

from __future__ import annotations

import dataclasses

from kiln.codegen.isa import Isa
from kiln.codegen.kernel import CompiledKernel, compile_kernel, prebuild
from kiln.kernels.gemm_schedule import GemmConfig, gemm_func
from kiln.options import Options


def test_prebuild_compiles_each_distinct_kernel_once_into_the_cache(options: Options,
                                                                    tmp_path) -> None:  # noqa: ANN001
    opts = dataclasses.replace(options, kernel_cache_dir=str(tmp_path))
    # register tiles (AVX2's config: any x86 compiler builds its portable path): their
    # renderings name variables by a counter, which once ran on from one kernel into the
    # next under prebuild's one renderer, so the load below found none of its sources
    avx2 = GemmConfig.for_isa(Isa.AVX2)
    funcs = [gemm_func(5, 7, 3, avx2, name="a"), gemm_func(9, 33, 17, avx2, name="b"),
             gemm_func(5, 7, 3, avx2, name="a")]  # the same source twice
    prebuild(funcs, opts)
    assert len(list(tmp_path.rglob("*.so"))) == 2
    assert len(list(tmp_path.glob("[0-9a-f][0-9a-f]/*.c"))) == 2
    for func in funcs:  # found in the cache: nothing new is built
        assert isinstance(compile_kernel(func, opts), CompiledKernel)
    assert len(list(tmp_path.rglob("*.so"))) == 2
