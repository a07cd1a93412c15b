"""The compiler driver and the on-disk kernel cache."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import multiprocessing
import os
import shutil
import stat
import subprocess
import sys
import uuid
import warnings
from pathlib import Path

import pytest
import torch

from kiln.codegen import build as build_mod
from kiln.codegen.build import (
    BuiltLibrary,
    CompileError,
    CompilerUnavailable,
    build,
    bundled_openmp_runtime,
    cache_dir,
    cache_key,
    toolchain,
    torch_openmp_runtime,
)
from kiln.options import Options


def _source(tag: str, value: int = 7) -> str:
    """A tiny library with one function; ``tag`` makes the source (and key) unique."""
    return f"/* {tag} */\nint answer(int x) {{ return x + {value}; }}\n"


def _fresh(options: Options, tmp_path: Path) -> Options:
    return dataclasses.replace(options, kernel_cache_dir=str(tmp_path / "cache"))


def test_miss_then_hit_loads_the_same_entry(options: Options, tmp_path: Path) -> None:
    opts = _fresh(options, tmp_path)
    first = build(_source("hit"), "answer", opts)
    assert isinstance(first, BuiltLibrary) and not first.cache_hit
    assert first.function("answer")(35) == 42
    second = build(_source("hit"), "answer", opts)
    assert isinstance(second, BuiltLibrary) and second.cache_hit
    assert second.path == first.path and second.key == first.key
    assert first.path.parent.parent == cache_dir(opts)
    assert first.source_path.read_text() == _source("hit")


def test_key_depends_on_source_and_flags(options: Options, tmp_path: Path) -> None:
    opts = _fresh(options, tmp_path)
    base = build(_source("key"), "answer", opts)
    other_source = build(_source("key", 8), "answer", opts)
    other_flags = build(_source("key"), "answer",
                        dataclasses.replace(opts, c_flags=("-O1", *opts.c_flags[1:])))
    assert isinstance(base, BuiltLibrary)
    assert isinstance(other_source, BuiltLibrary) and isinstance(other_flags, BuiltLibrary)
    assert len({base.key, other_source.key, other_flags.key}) == 3
    assert not other_flags.cache_hit
    assert other_source.function("answer")(0) == 8


def _replace_file(path: Path, data: bytes) -> None:
    """Overwrite by rename, as a crash or another writer would leave it (never in place:
    this process may have the old library mapped)."""
    tmp = path.with_suffix(".corrupting")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest", "missing"])
def test_damaged_entry_is_rebuilt_not_loaded(options: Options, tmp_path: Path,
                                             damage: str) -> None:
    opts = _fresh(options, tmp_path)
    src = _source(f"damage-{damage}")
    lib = build(src, "answer", opts)
    assert isinstance(lib, BuiltLibrary)
    data = lib.path.read_bytes()
    manifest = lib.path.parent / f"{lib.key}.json"
    if damage == "truncate":
        _replace_file(lib.path, data[: len(data) // 2])
    elif damage == "flip":
        _replace_file(lib.path, data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif damage == "manifest":
        _replace_file(manifest, b'{"library": "x.so", "sha2')
    else:
        lib.path.unlink()
    again = build(src, "answer", opts)
    assert isinstance(again, BuiltLibrary)
    assert not again.cache_hit  # it was rebuilt
    assert again.path.read_bytes() == data  # the same library again
    assert json.loads(manifest.read_text())["size"] == len(data)
    assert again.function("answer")(1) == 8


def _compile_in_child(cache: str, src: str, barrier: multiprocessing.synchronize.Barrier,
                      results: multiprocessing.queues.Queue) -> None:
    barrier.wait()
    lib = build(src, "answer", Options(kernel_cache_dir=cache))
    assert isinstance(lib, BuiltLibrary)
    results.put((str(lib.path), lib.function("answer")(1)))


def test_concurrent_compiles_of_one_kernel(options: Options, tmp_path: Path) -> None:
    opts = _fresh(options, tmp_path)
    toolchain(opts)  # probe once here; the children find the probe record in the cache
    src = _source(f"race-{uuid.uuid4()}")
    ctx = multiprocessing.get_context("spawn")
    n = 4
    barrier = ctx.Barrier(n)
    results = ctx.Queue()
    procs = [ctx.Process(target=_compile_in_child,
                         args=(opts.kernel_cache_dir, src, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * n
    got = [results.get(timeout=5) for _ in range(n)]
    assert {value for _, value in got} == {8}
    assert len({path for path, _ in got}) == 1  # all load the same entry
    folder = Path(got[0][0]).parent
    assert not [f for f in os.listdir(folder) if f.endswith(".tmp")]  # no temporaries left
    lib = build(src, "answer", opts)
    assert isinstance(lib, BuiltLibrary) and lib.cache_hit


def test_missing_compiler_warns_once_and_falls_back(tmp_path: Path) -> None:
    opts = Options(c_compiler=f"kiln-no-such-cc-{uuid.uuid4().hex[:8]}",
                   kernel_cache_dir=str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = build(_source("nocc"), "answer", opts)
        second = build(_source("nocc"), "answer", opts)
    assert isinstance(first, CompilerUnavailable) and isinstance(second, CompilerUnavailable)
    assert opts.c_compiler in first.reason
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert "Install gcc or clang" in messages[0] and "CC" in messages[0]


def test_compile_error_names_kernel_and_keeps_source(options: Options, tmp_path: Path) -> None:
    opts = _fresh(options, tmp_path)
    bad = "int answer(int x) { return x + undefined_name; }\n"
    with pytest.raises(CompileError) as info:
        build(bad, "my_kernel", opts)
    err = info.value
    assert err.name == "my_kernel" and "my_kernel" in str(err)
    assert "undefined_name" in err.message
    assert err.source_path.read_text() == bad
    assert str(err.source_path) in str(err)
    assert not list(err.source_path.parent.glob("*.so"))


def test_compiler_without_openmp_drops_the_flag(options: Options, tmp_path: Path) -> None:
    real = toolchain(options)
    assert not isinstance(real, CompilerUnavailable)
    fake = tmp_path / "cc-without-openmp"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do\n"
                    "  if [ \"$a\" = -fopenmp ]; then echo 'no openmp here' >&2; exit 1; fi\n"
                    f"done\nexec {shutil.which(real.compiler) or real.compiler} \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    opts = Options(c_compiler=str(fake), kernel_cache_dir=str(tmp_path / "cache"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chain = toolchain(opts)
    assert not isinstance(chain, CompilerUnavailable)
    assert not chain.openmp and "-fopenmp" not in chain.flags
    assert any("OpenMP" in str(w.message) for w in caught)
    lib = build(_source("noomp"), "answer", opts)
    assert isinstance(lib, BuiltLibrary) and lib.function("answer")(0) == 7


# --- one OpenMP runtime: kernels link to the libgomp torch ships ----------------------------

_OMP_SOURCE = """\
#include <omp.h>
/* {tag} */
void *runtime_entry(void) {{ return (void *)&omp_get_max_threads; }}
int threads_seen(void) {{
    int n = 0;
    #pragma omp parallel reduction(+:n)
    n += 1;
    return n;
}}
"""

_MAPPED_GOMP = """\
import ctypes, sys
ctypes.CDLL(sys.argv[1])
print("\\n".join(sorted({line.split()[-1] for line in open("/proc/self/maps")
                         if "libgom" in line})))
"""


def _maps() -> list[tuple[int, int, str]]:
    """(start, end, file) of this process's file mappings."""
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            out.append((start, end, fields[5]))
    return out


def _openmp_chain(options: Options) -> build_mod.Toolchain:
    if not Path("/proc/self/maps").exists():
        pytest.skip("needs /proc/self/maps")
    chain = toolchain(options)
    assert not isinstance(chain, CompilerUnavailable)
    if not chain.openmp:
        pytest.skip("the compiler builds no OpenMP code")
    return chain


def test_kernels_use_torchs_openmp_runtime(options: Options, tmp_path: Path) -> None:
    """One thread pool: a kernel's OpenMP calls land in the libgomp torch loaded, and a
    kernel loaded with no torch in the process pulls in torch's libgomp, not the system's."""
    chain = _openmp_chain(options)
    runtime = torch_openmp_runtime()
    if runtime is None:
        pytest.skip("this torch ships no libgomp of its own")
    assert chain.openmp_runtime == str(runtime) and str(runtime) in chain.libs
    torch.ones(1 << 16).exp_()  # ATen's parallel region: torch's pool exists
    lib = build(_OMP_SOURCE.format(tag=uuid.uuid4()), "omp_probe", _fresh(options, tmp_path))
    assert isinstance(lib, BuiltLibrary)
    assert lib.function("threads_seen")() >= 1
    entry = lib.function("runtime_entry")
    entry.restype = ctypes.c_void_p
    address = entry()
    maps = _maps()
    owner = [f for start, end, f in maps if start <= address < end]
    assert owner and Path(owner[0]).samefile(runtime)
    gomps = {f for _, _, f in maps if Path(f).name.startswith(("libgom", "libomp", "libiomp"))}
    assert len(gomps) == 1, gomps
    alone = subprocess.run([sys.executable, "-c", _MAPPED_GOMP, str(lib.path)],
                           capture_output=True, text=True, check=True)
    mapped = alone.stdout.split()
    assert len(mapped) == 1 and Path(mapped[0]).samefile(runtime), alone.stdout


def test_hashed_runtime_name_is_linked_alone(options: Options, tmp_path: Path) -> None:
    """A libgomp under another soname (as auditwheel renames it) is the only OpenMP library
    a kernel needs: the compiler's own -lgomp is dropped, else a second runtime is mapped."""
    chain = _openmp_chain(options)
    readelf = shutil.which("readelf")
    gomp = [f for _, _, f in _maps() if "libgomp" in Path(f).name]
    if readelf is None or not gomp:
        pytest.skip("needs readelf and a libgomp in this process")
    data = Path(gomp[0]).read_bytes()
    if data.count(b"libgomp.so.1\0") != 1:
        pytest.skip("the loaded libgomp has an unexpected soname")
    hashed = tmp_path / "libgomp-0a1b2c3d.so.1"  # soname libgomX.so.1, same length
    hashed.write_bytes(data.replace(b"libgomp.so.1\0", b"libgomX.so.1\0"))
    linked = dataclasses.replace(chain, libs=(*build_mod._runtime_libs(hashed), "-lm"))
    source, out = tmp_path / "k.c", tmp_path / "k.so"
    source.write_text(_OMP_SOURCE.format(tag="hashed"))
    subprocess.run(linked.command(source, out), check=True, capture_output=True)
    dynamic = subprocess.run([readelf, "-d", str(out)], capture_output=True, text=True,
                             check=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in dynamic.splitlines()
              if "(NEEDED)" in line]
    runtimes = [n for n in needed if n.startswith(("libgom", "libomp", "libiomp"))]
    assert runtimes == ["libgomX.so.1"], needed
    assert str(tmp_path) in dynamic  # the rpath finds it


def test_no_torch_runtime_falls_back_to_the_compilers(options: Options, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torch's libgomp (or with one that does not link) kernels use the compiler's
    runtime, and their cache keys differ from kernels linked to torch's."""
    real = toolchain(options)
    assert not isinstance(real, CompilerUnavailable)
    bogus = tmp_path / "libgomp.so.1"
    bogus.write_text("not a library\n")
    for case, runtime in (("none", None), ("bogus", bogus)):
        monkeypatch.setattr(build_mod, "torch_openmp_runtime", lambda r=runtime: r)
        opts = Options(kernel_cache_dir=str(tmp_path / case))
        chain = toolchain(opts)
        assert not isinstance(chain, CompilerUnavailable)
        assert chain.openmp == real.openmp and chain.openmp_runtime == ""
        assert not any("-Xlinker" in lib or "libgomp" in lib for lib in chain.libs)
        lib = build(_source(f"fallback-{case}"), "answer", opts)
        assert isinstance(lib, BuiltLibrary) and lib.function("answer")(0) == 7
        if real.openmp_runtime:
            assert cache_key("x", chain) != cache_key("x", real)


def test_bundled_runtime_in_lib_or_torch_libs(tmp_path: Path) -> None:
    package = tmp_path / "site" / "torch"
    package.mkdir(parents=True)
    assert bundled_openmp_runtime(package) is None
    (tmp_path / "site" / "torch.libs").mkdir()
    hashed = tmp_path / "site" / "torch.libs" / "libgomp-a34b3233.so.1.0.0"
    hashed.write_bytes(b"")
    assert bundled_openmp_runtime(package) == hashed.resolve()
    (package / "lib").mkdir()
    (package / "lib" / "libgomp.so.1").write_bytes(b"")
    assert bundled_openmp_runtime(package) == (package / "lib" / "libgomp.so.1").resolve()
