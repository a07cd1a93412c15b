"""The kernel cache under stress, whole models through kiln.compile: 8 processes compiling one
model into one fresh cache at once, every entry damaged on disk, a cache folder that cannot be
written. None of them crashes (``strict`` turns any swallowed error into a failure here), none
changes an answer, and damaged entries are rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import kiln
from kiln import models
from kiln.codegen import build as build_mod
from kiln.codegen.build import BuiltLibrary, build, cache_dir
from kiln.options import Options

MODEL = "mlp"  # quick: three generated kernels (GEMM + bias + relu chains)
PROCESSES = 8

# Run by a fresh interpreter: capture once (warm), then fork the 8 compiles from that process,
# which has run nothing on more than one thread (forking an OpenMP team is not safe).
_CONCURRENT = """\
import json, multiprocessing, sys
import torch, kiln
from kiln import models
torch.set_num_threads(1)
model, inputs = models.build(sys.argv[1], quick=True)
with torch.no_grad():
    expected = model(*inputs)
kiln.compile(model, inputs, kiln.Options(opt_level=1))  # warms capture; touches no cache

def work(cache):
    options = kiln.Options(kernel_cache_dir=cache, measure_kernels=False, strict=True)
    compiled = kiln.compile(model, inputs, options)
    out = compiled(*inputs)
    kinds = [k.kind for g in compiled.report.graphs for k in g.kernels]
    return bool(torch.allclose(out, expected, rtol=1e-5, atol=1e-6)), kinds

if __name__ == "__main__":
    n = int(sys.argv[3])
    with multiprocessing.get_context("fork").Pool(n) as pool:
        print(json.dumps(pool.map(work, [sys.argv[2]] * n, chunksize=1)))
"""


def _options(cache: Path | str) -> Options:
    return Options(kernel_cache_dir=str(cache), measure_kernels=False, strict=True)


def _compile_and_check(cache: Path | str) -> list[str]:
    """Compile the quick model into ``cache``, check it against eager; the kernel kinds."""
    model, inputs = models.build(MODEL, quick=True)
    with torch.no_grad():
        expected = model(*inputs)
    compiled = kiln.compile(model, inputs, _options(cache))
    torch.testing.assert_close(compiled(*inputs), expected, rtol=1e-5, atol=1e-6)
    assert not compiled.report.fallbacks
    return [k.kind for g in compiled.report.graphs for k in g.kernels]


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*/*.json"))


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory, options: Options) -> tuple[Path, list]:
    """A fresh cache that 8 processes compiled the model into at once, and their results."""
    cache = tmp_path_factory.mktemp("shared") / "cache"
    # no GPU seen: with one, torch.export initializes CUDA in the warming compile, and the
    # forked workers' exports then fail (torch cannot re-initialize CUDA after a fork)
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-c", _CONCURRENT, MODEL, str(cache),
                           str(PROCESSES)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return cache, json.loads(done.stdout.strip().splitlines()[-1])


def test_8_processes_compile_one_model_into_one_fresh_cache(populated) -> None:
    cache, results = populated
    assert len(results) == PROCESSES
    assert all(match for match, _ in results), results
    kinds = {tuple(k) for _, k in results}
    assert len(kinds) == 1 and "generated" in next(iter(kinds))  # the same kernels everywhere
    entries = _entries(cache)
    assert entries
    for manifest in entries:  # whole entries only: each manifest names a library it hashes to
        record = json.loads(manifest.read_text())
        library = manifest.parent / record["library"]
        assert hashlib.sha256(library.read_bytes()).hexdigest() == record["sha256"]
    assert not [p for p in cache.rglob("*") if p.name.endswith(".tmp")]  # no temporaries left


def _damage(path: Path) -> None:
    """Truncate libraries, garble manifests, sources and probe records, in place."""
    data = path.read_bytes()
    if path.suffix == ".so":
        path.write_bytes(data[: len(data) // 3])
    elif path.suffix == ".json":
        path.write_bytes(data[: len(data) // 2] + b"\x00garbage")
    else:
        path.write_bytes(b"int broken(void) { return ; \n")


def test_every_entry_damaged_is_rebuilt_and_the_model_still_matches(populated,
                                                                     tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(populated[0], cache)  # (never loaded by this process: safe to truncate)
    before = {m.name: json.loads(m.read_text()) for m in _entries(cache)}
    files = [p for p in cache.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} >= {".so", ".json", ".c"}
    for path in files:
        _damage(path)
    kinds = _compile_and_check(cache)
    assert kinds == populated[1][0][1]  # every kernel generated again, none left to the library
    after = {m.name: json.loads(m.read_text()) for m in _entries(cache)}
    assert after.keys() == before.keys()
    for name, record in after.items():  # rebuilt: the same library bytes as before
        library = cache / name[:2] / record["library"]
        assert record["sha256"] == before[name]["sha256"]
        assert hashlib.sha256(library.read_bytes()).hexdigest() == record["sha256"]
        assert "broken" not in (cache / name[:2] / f"{name[:-5]}.c").read_text()
    for probe in cache.glob("toolchain-*.json"):  # probed again and recorded again
        assert json.loads(probe.read_text())["flags"]


def _fallback_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "cannot write to the kernel cache" in
            str(w.message)]


def test_a_file_where_the_cache_folder_should_be(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kinds = _compile_and_check(blocker / "cache")
    assert "generated" in kinds  # compiled into a private folder, not left to the library
    assert len(_fallback_warnings(caught)) == 1, [str(w.message) for w in caught]
    assert blocker.read_text() == "a file"


def test_unwritable_home_falls_back_with_one_warning(options: Options, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    monkeypatch.setenv("HOME", str(home))
    opts = Options(c_compiler=options.c_compiler, c_flags=options.c_flags)
    assert cache_dir(opts).is_relative_to(home)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        libs = [build(f"int answer(int x) {{ return x + {i}; }}\n", "answer", opts)
                for i in range(3)]
    assert [lib.function("answer")(1) for lib in libs] == [1, 2, 3]  # type: ignore[union-attr]
    assert len(_fallback_warnings(caught)) == 1


def test_read_only_cache_loads_its_entries_and_builds_new_ones_elsewhere(
        options: Options, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    opts = Options(c_compiler=options.c_compiler, c_flags=options.c_flags,
                   kernel_cache_dir=str(shared))
    old = build("int answer(int x) { return x + 100; }\n", "answer", opts)
    assert isinstance(old, BuiltLibrary)
    private = tmp_path / "private"
    private.mkdir()
    monkeypatch.setattr(build_mod, "_writable", lambda folder: private)  # as if read-only
    hit = build("int answer(int x) { return x + 100; }\n", "answer", opts)
    assert isinstance(hit, BuiltLibrary) and hit.cache_hit and hit.path == old.path
    new = build("int answer(int x) { return x + 200; }\n", "answer", opts)
    assert isinstance(new, BuiltLibrary) and not new.cache_hit
    assert new.path.parent.parent == private and new.function("answer")(1) == 201
    again = build("int answer(int x) { return x + 200; }\n", "answer", opts)
    assert isinstance(again, BuiltLibrary) and again.cache_hit and again.path == new.path


def test_chmod_read_only_cache(populated, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(populated[0], cache)
    folders = [cache, *[p for p in cache.rglob("*") if p.is_dir()]]
    for folder in folders:
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(cache, os.W_OK):
            pytest.skip("running as root: chmod does not stop writes")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kinds = _compile_and_check(cache)
        assert kinds == populated[1][0][1]  # loaded from the read-only cache
        assert len(_fallback_warnings(caught)) == 1
    finally:
        for folder in folders:
            folder.chmod(stat.S_IRWXU)
