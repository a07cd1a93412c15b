"""C sources as `CRenderer` writes them, kept on disk by what decides them, so that a warm
compile finds a kernel's source without rendering it again.

    source = rendered(func, options)    # == CRenderer().render(func)

Rendering walks the whole scheduled program and matches its register tiles (`kiln.tir.
tensorize`): 0.3 s of ResNet-50's and 0.45 s of HF GPT-2's warm compile, where the kernel
cache (`kiln.codegen.build`) then finds every library already built. The text is a function
of two things only, so the key is the sha256 of both:

* the program, as ``repr(func)``: tir nodes are frozen dataclasses, so the repr spells every
  field (float constants round-trip exactly); about a fifth of the time of a render;
* kiln's own code: the bytes of every module of the package, read once a process, so an
  entry written by another version of the renderer is never read.

An entry is ``<cache dir>/rendered/<key[:2]>/<key>.c``: a first line with the sha256 of the
rest, then the source. It is written to a temporary name and moved into place; one whose
text does not hash to its first line is rendered again and replaced, never compiled.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import kiln
from kiln.codegen.build import cache_dir, writable_cache_dir, write_atomic
from kiln.codegen.c import CRenderer
from kiln.options import Options
from kiln.tir.nodes import PrimFunc

__all__ = ["code_version", "rendered", "rendered_key"]

_HEADER = "// kiln rendered source, sha256 of the rest: "


def rendered(func: PrimFunc, options: Options) -> str:
    """``func``'s C source: from the cache where an intact entry is there, else rendered
    (raising `kiln.codegen.c.UnsupportedForC` as the renderer does) and stored."""
    key = rendered_key(func)
    name = Path("rendered", key[:2], f"{key}.c")
    for root in dict.fromkeys((cache_dir(options), writable_cache_dir(options))):
        source = _read(root / name)
        if source is not None:
            return source
    source = CRenderer().render(func)
    path = writable_cache_dir(options) / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, (_HEADER + _sha256(source) + "\n" + source).encode())
    except OSError:
        pass  # only a cache: the next compile renders it again
    return source


@functools.lru_cache(maxsize=256)  # (a compile asks for each kernel twice: prebuild, load)
def rendered_key(func: PrimFunc) -> str:
    """sha256 of the program and of the code that renders it."""
    digest = hashlib.sha256(code_version().encode())
    digest.update(b"\0")
    digest.update(repr(func).encode())
    return digest.hexdigest()


@functools.cache
def code_version() -> str:
    """sha256 of kiln's modules (paths and bytes), once a process."""
    root = Path(kiln.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _read(path: Path) -> str | None:
    try:
        header, _, source = path.read_text().partition("\n")
    except (OSError, UnicodeDecodeError):
        return None
    return source if header == _HEADER + _sha256(source) else None


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
