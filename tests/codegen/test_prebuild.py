"""codegen.kernel.prebuild fills the kernel cache with parallel compiler runs."""

from __future__ import annotations

import dataclasses

from kiln.codegen.kernel import CompiledKernel, compile_kernel, prebuild
from kiln.kernels.gemm_schedule import gemm_func
from kiln.options import Options


def test_prebuild_compiles_each_distinct_kernel_once_into_the_cache(options: Options,
                                                                    tmp_path) -> None:  # noqa: ANN001
    opts = dataclasses.replace(options, kernel_cache_dir=str(tmp_path))
    funcs = [gemm_func(5, 7, 3, name="a"), gemm_func(9, 33, 17, name="b"),
             gemm_func(5, 7, 3, name="a")]  # the same source twice
    prebuild(funcs, opts)
    assert len(list(tmp_path.rglob("*.so"))) == 2
    assert len(list(tmp_path.rglob("*.c"))) == 2
    for func in funcs:  # found in the cache: nothing new is built
        assert isinstance(compile_kernel(func, opts), CompiledKernel)
    assert len(list(tmp_path.rglob("*.so"))) == 2
