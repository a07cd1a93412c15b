"""A tir PrimFunc compiled to a C kernel that runs on torch tensors.

    kernel = compile_kernel(func, options)       # CompiledKernel, or CompilerUnavailable
    kernel(x, w, out)                            # tensors in PrimFunc parameter order
    kernel.run_unchecked(x.data_ptr(), w.data_ptr(), out.data_ptr())   # the runtime's path

Calling checks each tensor against its parameter buffer (device, dtype, shape, strides) and
passes its data pointer; ``run_unchecked`` skips the checks for callers that have already
proven them (the runtime's static memory plan). Output tensors are written in place.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from kiln.codegen.build import (
    BuiltLibrary,
    CompileError,
    CompilerUnavailable,
    build,
    toolchain,
    writable_cache_dir,
)
from kiln.codegen.c import CRenderer, UnsupportedForC
from kiln.codegen.rendered import rendered
from kiln.options import Options
from kiln.tir.nodes import Buffer, PrimFunc, contiguous_strides

__all__ = ["CompiledKernel", "KernelArgumentError", "compile_kernel", "layout_check",
           "prebuild"]


class KernelArgumentError(ValueError):
    """A tensor passed to a kernel does not match the parameter buffer it stands for."""


class CompiledKernel:
    """A loaded kernel. Call it with tensors in PrimFunc parameter order."""

    __slots__ = ("func", "source", "library", "_fn", "_specs", "_set_threads")

    def __init__(self, func: PrimFunc, source: str, library: BuiltLibrary,
                 fn: ctypes._CFuncPtr) -> None:  # type: ignore[name-defined]
        self.func = func
        self.source = source
        self.library = library
        self._fn = fn
        # (dtype, shape, strides where they matter) per parameter, checked on every call
        self._specs = tuple((b.dtype.torch, torch.Size(b.shape), _layout_ok(b))
                            for b in func.params)
        self._set_threads = library.function("kiln_set_num_threads")
        self._set_threads.argtypes = [ctypes.c_int]
        self._set_threads.restype = None
        self.set_num_threads(torch.get_num_threads())

    def set_num_threads(self, n: int) -> None:
        """Threads for the kernel's parallel loops (the runtime keeps this equal to
        torch.get_num_threads(), so kiln uses the threads the user gave torch)."""
        self._set_threads(n)

    @property
    def name(self) -> str:
        return self.func.name

    def __call__(self, *tensors: torch.Tensor) -> None:
        if len(tensors) != len(self._specs):
            raise KernelArgumentError(f"kernel {self.name} takes {len(self._specs)} tensors "
                                      f"({', '.join(b.name for b in self.func.params)}), "
                                      f"got {len(tensors)}")
        for (dtype, shape, layout_ok), t in zip(self._specs, tensors):
            if (not isinstance(t, torch.Tensor) or t.dtype is not dtype or t.shape != shape
                    or not t.is_cpu or not layout_ok(t)):
                self._explain(tensors)
        self._fn(*[t.data_ptr() for t in tensors])

    def run_unchecked(self, *pointers: int) -> None:
        """Call with raw data pointers, in parameter order; no checks."""
        self._fn(*pointers)

    def _explain(self, tensors: tuple[torch.Tensor, ...]) -> None:
        for buf, t in zip(self.func.params, tensors):
            _check(self.name, buf, t)


def compile_kernel(func: PrimFunc, options: Options | None = None,
                   renderer: CRenderer | None = None) -> CompiledKernel | CompilerUnavailable:
    """Render (`kiln.codegen.rendered`'s cache, unless ``renderer`` is given), build
    (through the kernel cache) and load ``func``.

    Returns CompilerUnavailable when there is no C compiler (the caller uses a library call);
    raises kiln.codegen.build.CompileError when the compiler rejects the generated source.
    """
    options = options if options is not None else Options.from_env()
    source = renderer.render(func) if renderer is not None else rendered(func, options)
    renderer = renderer if renderer is not None else CRenderer()
    chain = toolchain(options)
    if isinstance(chain, CompilerUnavailable):
        return chain
    library = build(source, func.name, options)
    if isinstance(library, CompilerUnavailable):
        return library
    fn = library.function(renderer.entry_name(func))
    fn.argtypes = [ctypes.c_void_p] * len(func.params)
    fn.restype = None
    return CompiledKernel(func, source, library, fn)


def prebuild(funcs: Sequence[PrimFunc], options: Options | None = None) -> None:
    """Compile every distinct kernel of ``funcs`` into the kernel cache, several compiler
    processes at once (one per core), so that the `compile_kernel` calls that follow, one by
    one, find them there. Failures (the compiler's, or the file system's) are left for those
    calls to report: prebuilding only saves time."""
    options = options if options is not None else Options.from_env()
    if isinstance(toolchain(options), CompilerUnavailable):
        return
    sources: dict[str, str] = {}
    for func in funcs:
        try:
            sources.setdefault(rendered(func, options), func.name)
        except UnsupportedForC:
            continue
    if len(sources) < 2:
        return
    writable_cache_dir(options)  # settled (and warned about) once, before the threads start

    def one(item: tuple[str, str]) -> None:
        try:
            build(item[0], item[1], options)
        except (CompileError, OSError):
            pass  # reported by compile_kernel (a rejected source stays on disk)
    with ThreadPoolExecutor(max_workers=max(os.cpu_count() or 1, 1)) as pool:
        list(pool.map(one, sources.items()))


def layout_check(buf: Buffer) -> Callable[[torch.Tensor], bool]:
    """A fast test that a tensor's strides match ``buf``'s wherever they are used (dims of
    size 1 are free), for callers that check operands themselves (the runtime)."""
    return _layout_ok(buf)


def _layout_ok(buf: Buffer) -> Callable[[torch.Tensor], bool]:
    """A fast test that a tensor's strides match ``buf`` wherever they are used."""
    if buf.numel <= 1:
        return _any_layout
    if buf.strides is None or tuple(buf.strides) == contiguous_strides(buf.shape):
        return torch.Tensor.is_contiguous  # ignores the strides of size-1 dims, as we do
    dims = [(d, s) for d, (n, s) in enumerate(zip(buf.shape, buf.strides)) if n > 1]
    return lambda t: all(t.stride(d) == s for d, s in dims)


def _any_layout(t: torch.Tensor) -> bool:
    return True


def _check(kernel: str, buf: Buffer, t: torch.Tensor) -> None:
    """Raise KernelArgumentError saying how ``t`` differs from ``buf`` (if it does)."""
    problem = None
    if not isinstance(t, torch.Tensor):
        problem = f"expected a tensor, got {type(t).__name__}"
    elif not t.is_cpu:
        problem = f"tensor is on {t.device}, kernels run on the CPU"
    elif t.dtype is not buf.dtype.torch:
        problem = f"dtype {t.dtype}, expected {buf.dtype.torch}"
    elif tuple(t.shape) != buf.shape:
        problem = f"shape {tuple(t.shape)}, expected {buf.shape}"
    elif not _layout_ok(buf)(t):
        problem = f"strides {tuple(t.stride())}, expected {buf.elem_strides}"
    if problem:
        raise KernelArgumentError(f"kernel {kernel}, parameter {buf.name}: {problem}")
