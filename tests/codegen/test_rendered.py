"""codegen.rendered keeps C sources on disk by program and by kiln's code."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kiln.codegen import rendered as rendered_module
from kiln.codegen.c import CRenderer
from kiln.codegen.isa import Isa
from kiln.codegen.rendered import code_version, rendered, rendered_key
from kiln.kernels.gemm_schedule import GemmConfig, gemm_func
from kiln.options import Options

AVX2 = GemmConfig.for_isa(Isa.AVX2)  # (register tiles: the renderer's costliest part)


def _entries(root: Path) -> list[Path]:
    return sorted((root / "rendered").rglob("*.c"))


def test_a_rendered_source_is_the_renderers_and_is_read_back_without_rendering(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = Options(kernel_cache_dir=str(tmp_path))
    func = gemm_func(9, 33, 17, AVX2, name="g")
    source = rendered(func, opts)
    assert source == CRenderer().render(func)
    assert len(_entries(tmp_path)) == 1
    monkeypatch.setattr(CRenderer, "render", lambda self, f: pytest.fail("rendered again"))
    assert rendered(func, opts) == source


def test_rendering_is_a_function_of_the_program_alone() -> None:
    """One renderer, several programs: each text is what a fresh renderer gives (the names
    of hoisted values and register tiles start again in each)."""
    funcs = [gemm_func(9, 33, 17, AVX2, name="a"), gemm_func(5, 7, 3, AVX2, name="b")]
    shared = CRenderer()
    assert [shared.render(f) for f in funcs] == [CRenderer().render(f) for f in funcs]


def test_the_key_follows_the_program_and_kilns_code(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = gemm_func(9, 33, 17, AVX2, name="g"), gemm_func(9, 33, 18, AVX2, name="g")
    assert rendered_key(a) == rendered_key(gemm_func(9, 33, 17, AVX2, name="g"))
    assert rendered_key(a) != rendered_key(b)
    assert rendered_key(a) != rendered_key(dataclasses.replace(a, name="h"))
    before = rendered_key(a)
    rendered_key.cache_clear()
    monkeypatch.setattr(rendered_module, "code_version", lambda: code_version() + "changed")
    try:
        assert rendered_key(a) != before
    finally:
        rendered_key.cache_clear()


def test_a_damaged_entry_is_rendered_again_and_replaced(tmp_path: Path) -> None:
    opts = Options(kernel_cache_dir=str(tmp_path))
    func = gemm_func(9, 33, 17, AVX2, name="g")
    source = rendered(func, opts)
    (entry,) = _entries(tmp_path)
    text = entry.read_text()
    entry.write_text(text.replace("for (", "for(", 1))  # still C, but not what was written
    assert rendered(func, opts) == source
    assert entry.read_text() == text
    entry.write_bytes(b"\xff\xfe")  # not even text
    assert rendered(func, opts) == source


def test_an_unwritable_cache_still_renders(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache folder should be
    func = gemm_func(5, 7, 3, name="g")
    with pytest.warns(RuntimeWarning, match="cannot write to the kernel cache"):
        assert rendered(func, Options(kernel_cache_dir=str(blocked))) == \
            CRenderer().render(func)
