"""Compile C source to a shared library, through an on-disk cache, and load it with ctypes.

    lib = build(source, "softmax_128x768", options)
    if isinstance(lib, CompilerUnavailable):
        ...                       # fall back to a library call
    fn = lib.function("kernel")   # a ctypes function

The cache entry for one kernel is three files in ``<cache dir>/<key[:2]>/``::

    <key>.c                     the source, kept for inspection (also when it fails to compile)
    <key>.<digest[:16]>.so      the library, named by the sha256 of its own bytes
    <key>.json                  manifest: library file name, its sha256 and size, compiler, flags

``key`` is the sha256 of the source, the flags, the link libraries, the compiler's identity
and (with ``-march=native``) the host CPU. Every file is written to a temporary name in the
same folder and moved into place with ``os.replace``, so a reader sees either no entry or a
whole one, and several processes compiling the same kernel at once all end up with a valid
library. A library is loaded only after its bytes hash to the digest in the manifest; anything
else (missing, truncated, corrupt, unparsable manifest, a library that does not load) is
rebuilt, never loaded. Where this process cannot write into the cache folder (read-only, a file
where the folder should be, an unwritable home), entries found there are still loaded, new
ones go to a private temporary folder removed at exit, and one warning says so.

One OpenMP runtime per process: torch's Linux wheels ship their own libgomp (``torch/lib``, or
``torch.libs`` under a hashed soname), and ATen's and MKL's parallel regions run on its thread
pool. A kernel linked with the compiler's plain ``-fopenmp`` needs the system's libgomp. Under
one soname the loader maps only the first of the two, so which one torch and kiln share
depends on load order (a kernel loaded before torch puts torch on the system's); under two
names both are mapped, and a kernel whose OpenMP calls bind to the system's (torch's wins only
while it sits in the global symbol scope) runs a second pool, whose idle workers spin for
several ms after each parallel region on the cores the next ATen call computes on
(benchmarks/threads.py: that call ~2x slower). So the toolchain links kernels against torch's
libgomp by path, with an rpath to its folder and ``--as-needed`` (the compiler's own
``-lgomp``, later on the line, is then left out), and falls back to the compiler's runtime
where torch has no libgomp of its own (macOS, a torch built against the system's) or a probe
kernel does not build and load against it::

    cc -O3 -march=native -fno-math-errno -fno-trapping-math -fopenmp -shared -fPIC -o k.so k.c \
        -Xlinker --as-needed .../torch/lib/libgomp.so.1 -Xlinker -rpath -Xlinker .../torch/lib -lm
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from kiln.options import Options

__all__ = [
    "BuiltLibrary",
    "CompileError",
    "CompilerUnavailable",
    "Toolchain",
    "build",
    "bundled_openmp_runtime",
    "cache_dir",
    "cache_key",
    "host_identity",
    "toolchain",
    "torch_openmp_runtime",
    "writable_cache_dir",
    "write_atomic",
]

_CANDIDATES = ("cc", "gcc", "clang")
_OPENMP_FLAGS = ("-fopenmp", "-qopenmp", "-openmp")
_PROBE_SOURCE = """\
#include <omp.h>
int kiln_probe(void) {
    int n = 0;
    #pragma omp parallel reduction(+:n)
    n += 1;
    return n + omp_get_max_threads() * 0;
}
"""
_PLAIN_PROBE_SOURCE = "int kiln_probe(void) { return 1; }\n"
_MVEC_PROBE_SOURCE = """\
#include <math.h>
#pragma omp declare simd notinbranch
float expf(float);
float kiln_x[64];
int kiln_probe(void) {
    #pragma omp simd
    for (int i = 0; i < 64; ++i) kiln_x[i] = expf(kiln_x[i]);
    return 1;
}
"""
_MVEC_FLAGS = ("-DKILN_LIBMVEC",)
_TORCH_RUNTIME_DIRS = ("lib", "../torch.libs")  # relative to the torch package folder
_TORCH_RUNTIME_GLOB = "libgomp*.so*"


class CompileError(RuntimeError):
    """The compiler rejected a kernel; the source stays on disk at ``source_path``."""

    def __init__(self, name: str, message: str, source_path: Path, command: list[str]) -> None:
        self.name = name
        self.message = message
        self.source_path = source_path
        self.command = command
        super().__init__(
            f"kiln: C compiler failed on kernel {name!r} (source kept at {source_path})\n"
            f"command: {' '.join(command)}\n{message.strip()}"
        )


@dataclass(frozen=True)
class CompilerUnavailable:
    """No usable C compiler: the caller falls back to a library call for this kernel."""

    reason: str


@dataclass(frozen=True)
class Toolchain:
    """A working compiler: its path, identity and the flags that work with it."""

    compiler: str  # absolute path
    version: str  # first line of ``--version`` plus the resolved path
    flags: tuple[str, ...]  # Options.c_flags, minus OpenMP if the compiler lacks it
    openmp: bool
    libs: tuple[str, ...]  # link flags: torch's OpenMP runtime, -lmvec where it links, -lm
    host: str  # CPU identity folded into cache keys when flags say -march=native
    openmp_runtime: str = ""  # the OpenMP library kernels link to by path; "" = the compiler's

    def command(self, source: Path, output: Path) -> list[str]:
        return [self.compiler, *self.flags, "-shared", "-fPIC", "-o", str(output), str(source),
                *self.libs]


@dataclass(frozen=True)
class BuiltLibrary:
    """A loaded, verified shared library from the kernel cache."""

    name: str
    key: str
    path: Path
    source_path: Path
    cdll: ctypes.CDLL
    cache_hit: bool

    def function(self, symbol: str) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
        return getattr(self.cdll, symbol)


def cache_dir(options: Options) -> Path:
    """The kernel cache folder: Options.kernel_cache_dir, else ~/.cache/kiln/kernels."""
    if options.kernel_cache_dir:
        return Path(options.kernel_cache_dir).expanduser()
    return Path.home() / ".cache" / "kiln" / "kernels"


def writable_cache_dir(options: Options) -> Path:
    """Where this process writes new cache entries: `cache_dir`, if it can be created and
    written to; else a private temporary folder, removed at exit (one warning per process)."""
    return _writable(str(cache_dir(options)))


@functools.cache
def _writable(folder: str) -> Path:
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".kiln-write-test-")
        os.close(fd)
        os.unlink(probe)
        return Path(folder)
    except OSError as err:
        private = Path(tempfile.mkdtemp(prefix="kiln-kernels-"))
        atexit.register(shutil.rmtree, private, ignore_errors=True)
        _warn_once(f"kiln: cannot write to the kernel cache {folder} ({err}); kernels not "
                   f"found there are compiled into {private}, for this process only. Set "
                   f"KILN_CACHE_DIR (Options.kernel_cache_dir) to a writable folder.")
        return private


def find_compiler(options: Options) -> str | None:
    """Absolute path of the C compiler to use, or None.

    Options.c_compiler (which Options.from_env fills from $CC) wins; it may be a name on PATH
    or a path. Otherwise the first of cc, gcc, clang on PATH.
    """
    if options.c_compiler:
        found = shutil.which(options.c_compiler)
        return str(Path(found).resolve()) if found else None
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return str(Path(found).resolve())
    return None


def toolchain(options: Options) -> Toolchain | CompilerUnavailable:
    """Find and probe the compiler once per (compiler, flags) per process.

    A missing or broken compiler gives one warning per process and a CompilerUnavailable; a
    compiler without OpenMP gives one warning and a Toolchain without the OpenMP flag.
    """
    return _probe(options.c_compiler, options.c_flags, str(cache_dir(options)))


def torch_openmp_runtime() -> Path | None:
    """The libgomp that the installed torch ships and loads, found without importing torch.

    ``torch/lib/libgomp.so.1`` in the Linux wheels (``torch.libs/libgomp-<hash>.so.1`` in
    wheels renamed by auditwheel); None where torch has no libgomp of its own: no torch, macOS
    (libomp), a torch built against the system's or conda's runtime (the same ``libgomp.so.1``
    the compiler links, so one runtime anyway).
    """
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return bundled_openmp_runtime(Path(list(spec.submodule_search_locations)[0]))


def bundled_openmp_runtime(package: Path) -> Path | None:
    """The libgomp in a torch package folder's ``lib``, or in ``torch.libs`` beside it."""
    for folder in _TORCH_RUNTIME_DIRS:
        found = sorted((package / folder).glob(_TORCH_RUNTIME_GLOB))
        if found:
            return found[0].resolve()
    return None


def _runtime_libs(runtime: Path) -> tuple[str, ...]:
    """Link ``runtime`` by path, found through an rpath at load time; ``--as-needed`` drops
    the compiler's own ``-lgomp`` (which comes later on the line) when nothing needs it."""
    return ("-Xlinker", "--as-needed", str(runtime),
            "-Xlinker", "-rpath", "-Xlinker", str(runtime.parent))


def cache_key(source: str, chain: Toolchain) -> str:
    """sha256 of everything that decides the bytes of the library (and what it links to)."""
    digest = hashlib.sha256()
    for part in (source, "\0".join(chain.flags), "\0".join(chain.libs), chain.version,
                 chain.host):
        digest.update(part.encode())
        digest.update(b"\x00\x01")
    return digest.hexdigest()


def build(source: str, name: str, options: Options) -> BuiltLibrary | CompilerUnavailable:
    """Compile ``source`` (or find it in the cache) and load it.

    ``name`` is for messages only (the kernel it holds). Raises CompileError when the compiler
    rejects the source; returns CompilerUnavailable when there is no compiler.
    """
    chain = toolchain(options)
    if isinstance(chain, CompilerUnavailable):
        return chain
    key = cache_key(source, chain)
    folder = writable_cache_dir(options) / key[:2]
    for root in dict.fromkeys((cache_dir(options), folder.parent)):  # the shared cache first
        loaded = _load_verified(root / key[:2], key)
        if loaded is not None:
            path, cdll = loaded
            source_path = root / key[:2] / f"{key}.c"
            return BuiltLibrary(name, key, path, source_path, cdll, cache_hit=True)
    folder.mkdir(parents=True, exist_ok=True)
    source_path = folder / f"{key}.c"
    write_atomic(source_path, source.encode())
    path = _compile_entry(chain, folder, key, source_path, name)
    loaded = _load_verified(folder, key)
    if loaded is None:  # another process replaced the entry with a bad one meanwhile: load ours
        try:
            cdll = ctypes.CDLL(str(path))
        except OSError as err:  # built, but the loader refuses it: the kernel is not usable
            raise CompileError(name, f"the compiled library does not load: {err}", source_path,
                               chain.command(source_path, path)) from err
        return BuiltLibrary(name, key, path, source_path, cdll, cache_hit=False)
    path, cdll = loaded
    return BuiltLibrary(name, key, path, source_path, cdll, cache_hit=False)


# --- cache entries ---------------------------------------------------------------------------


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary name in the same folder: a reader sees
    the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _unlink(Path(tmp))
        raise


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _load_verified(folder: Path, key: str) -> tuple[Path, ctypes.CDLL] | None:
    """Load the entry's library if its manifest parses and its bytes match; else None."""
    try:
        manifest = json.loads((folder / f"{key}.json").read_text())
        library = folder / manifest["library"]
        expected = manifest["sha256"]
        if Path(manifest["library"]).name != manifest["library"]:
            return None
        data = library.read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if len(data) != manifest.get("size") or hashlib.sha256(data).hexdigest() != expected:
        return None
    try:
        return library, ctypes.CDLL(str(library))
    except OSError:
        return None


def _compile_entry(chain: Toolchain, folder: Path, key: str, source_path: Path,
                   name: str) -> Path:
    """Compile to a temporary file, then move the library and its manifest into place."""
    fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".so.tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    command = chain.command(source_path, tmp)
    try:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise CompileError(name, done.stderr or done.stdout, source_path, command)
        data = tmp.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        library = folder / f"{key}.{digest[:16]}.so"
        os.replace(tmp, library)
    finally:
        _unlink(tmp)
    manifest = {
        "name": name,
        "library": library.name,
        "sha256": digest,
        "size": len(data),
        "compiler": chain.version,
        "flags": list(chain.flags),
        "libs": list(chain.libs),
    }
    write_atomic(folder / f"{key}.json", json.dumps(manifest, indent=1).encode())
    return library


# --- compiler probing ------------------------------------------------------------------------


def host_identity() -> str:
    """CPU model and feature flags: a library built with -march=native is only valid here."""
    parts = [platform.machine()]
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags", "Features")):
                parts.append(line.split(":", 1)[1].strip())
                if len(parts) >= 3:
                    break
    except OSError:
        parts.append(platform.processor())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _version(compiler: str) -> str | None:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    first = (done.stdout or done.stderr).strip().splitlines()
    return f"{first[0] if first else '?'} ({compiler})"


def _try_compile(compiler: str, flags: tuple[str, ...], source: str,
                 libs: tuple[str, ...] = ()) -> str | None:
    """None if ``source`` compiles to a loadable library with ``flags``, else the error."""
    with tempfile.TemporaryDirectory(prefix="kiln-probe-") as tmp:
        src = Path(tmp) / "probe.c"
        out = Path(tmp) / "probe.so"
        src.write_text(source)
        command = [compiler, *flags, "-shared", "-fPIC", "-o", str(out), str(src), *libs]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as exc:
            return str(exc)
        if done.returncode != 0:
            return (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        try:
            ctypes.CDLL(str(out)).kiln_probe()
        except (OSError, AttributeError) as exc:
            return f"probe library does not load: {exc}"
    return None


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=4)


@functools.cache
def _probe(setting: str, flags: tuple[str, ...], folder: str) -> Toolchain | CompilerUnavailable:
    compiler = find_compiler(Options(c_compiler=setting))
    what = f"C compiler {setting!r}" if setting else "a C compiler (cc, gcc or clang)"
    if compiler is None:
        return _unavailable(f"kiln could not find {what} on PATH")
    version = _version(compiler)
    if version is None:
        return _unavailable(f"kiln could not run {compiler} --version")
    host = host_identity() if any(f.startswith("-march=native") for f in flags) else ""
    openmp = any(f in _OPENMP_FLAGS for f in flags)
    runtime = torch_openmp_runtime() if openmp else None
    identity = _short_hash(version, *flags, host, _identity(runtime))
    probe_file = Path(folder) / f"toolchain-{identity}.json"
    try:
        cached = json.loads(probe_file.read_text())
        return Toolchain(compiler, version, tuple(cached["flags"]), cached["openmp"],
                         tuple(cached["libs"]), host, cached["openmp_runtime"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    probe_source = _PROBE_SOURCE if openmp else _PLAIN_PROBE_SOURCE
    omp_libs = _runtime_libs(runtime) if runtime is not None else ()
    error = _try_compile(compiler, flags, probe_source, omp_libs)
    if error is not None and omp_libs:  # not with torch's runtime: the compiler's own
        omp_libs = ()
        error = _try_compile(compiler, flags, probe_source)
    if error is not None and openmp:
        plain = tuple(f for f in flags if f not in _OPENMP_FLAGS)
        if _try_compile(compiler, plain, _PLAIN_PROBE_SOURCE) is None:
            _warn_once(f"kiln: {compiler} cannot build OpenMP code with {' '.join(flags)}; "
                       f"generated kernels will run on one thread. Install the compiler's OpenMP "
                       f"runtime (libgomp for gcc, libomp for clang) to use all cores.\n{error}")
            flags, openmp, error = plain, False, None
    if error is not None:
        return _unavailable(f"kiln could not build a test kernel with {compiler} "
                            f"{' '.join(flags)}:\n{error}")
    libs = (*omp_libs, "-lm")
    mvec_libs = (*omp_libs, "-lmvec", "-lm")
    if _try_compile(compiler, flags + _MVEC_FLAGS, _MVEC_PROBE_SOURCE, mvec_libs) is None:
        flags, libs = flags + _MVEC_FLAGS, mvec_libs
    linked = str(runtime) if omp_libs else ""
    chain = Toolchain(compiler, version, flags, openmp, libs, host, linked)
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        record = {"flags": list(flags), "openmp": openmp, "libs": list(libs),
                  "openmp_runtime": linked}
        write_atomic(probe_file, json.dumps(record).encode())
    except OSError:
        pass
    return chain


def _unavailable(reason: str) -> CompilerUnavailable:
    _warn_once(f"{reason}; generated kernels are disabled and kiln calls library kernels "
               f"instead. Install gcc or clang, or set CC (Options.c_compiler) to a C compiler.")
    return CompilerUnavailable(reason)


def _identity(path: Path | None) -> str:
    """A library's path, size and time: a re-installed torch is probed again."""
    if path is None:
        return ""
    try:
        st = path.stat()
    except OSError:
        return str(path)
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def _short_hash(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
