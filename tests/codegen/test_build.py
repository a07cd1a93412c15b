"""The compiler driver and the on-disk kernel cache."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import shutil
import stat
import uuid
import warnings
from pathlib import Path

import pytest

from kiln.codegen.build import (
    BuiltLibrary,
    CompileError,
    CompilerUnavailable,
    build,
    cache_dir,
    toolchain,
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
