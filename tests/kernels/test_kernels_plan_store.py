"""Plans kept on disk (`kiln.kernels.plan_store`): a stored plan reads back equal, with the
program its build gives, and compiles to a kernel that computes what torch does; a copy with
more post-passes builds again; a damaged entry is made again; a changed kiln or a different
space never reads another's entry; the option off stores nothing; a compile stores its
kernels' plans and a second compile in a fresh process state reads them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

import kiln
from kiln.codegen.build import CompilerUnavailable, toolchain
from kiln.codegen.isa import Isa
from kiln.codegen.kernel import compile_kernel
from kiln.ir.ops import Op
from kiln.kernels import plan_store
from kiln.kernels.conv_config import ConvShape
from kiln.kernels.plan import Epilogue, Serial
from kiln.kernels.plan_store import plan_path, stored_plan
from kiln.options import Options
from kiln.tir.printer import print_func
from kiln.tune.space import GemmSpace
from kiln.tune.space_window import WindowSpace

RELU = Epilogue(Op.RELU)


def _spaces() -> list:
    conv = WindowSpace("conv", ConvShape(1, 5, 9, 11, 24, (3, 3), (1, 1), (1, 1), bias=True),
                       Isa.AVX512, 2, RELU, "stored_conv")
    gemm = GemmSpace(37, 50, 29, Isa.AVX2, 2, bias=True, name="stored_gemm")
    return [conv, gemm]


def _fresh() -> None:
    """As a new process starts: nothing remembered in memory."""
    stored_plan.cache_clear()


@pytest.mark.parametrize("space", _spaces(), ids=lambda s: s.name)
def test_a_stored_plan_reads_back_equal_and_builds_the_same_program(space, tmp_path: Path
                                                                    ) -> None:
    options = Options(kernel_cache_dir=str(tmp_path))
    config = space.config(space.default())
    made = space.plan_config(config)
    _fresh()
    first = stored_plan(space, config, options)
    path = plan_path(space, config, options)
    assert path.is_file()
    _fresh()
    read = stored_plan(space, config, options)
    assert read is not first  # (from the file, not from memory)
    assert read == made and read.as_python() == made.as_python()
    assert read.prebuilt is not None and read.build() is read.prebuilt[2]
    assert print_func(read.build()) == print_func(made.build())
    assert print_func(read.replayed()) == print_func(made.build())


def test_a_stored_plan_computes_what_torch_computes(tmp_path: Path) -> None:
    options = Options(kernel_cache_dir=str(tmp_path))
    if isinstance(toolchain(options), CompilerUnavailable):
        pytest.skip("no C compiler")
    space = _spaces()[1]
    config = space.config(space.default())
    stored_plan(space, config, options)
    _fresh()
    kernel = compile_kernel(stored_plan(space, config, options).build(), options)
    a, b, bias = torch.randn(37, 29), torch.randn(29, 50), torch.randn(50)
    a[3, 4], a[5, 6], b[7, 8] = float("nan"), float("inf"), float("-inf")
    out = torch.empty(37, 50)
    kernel(a, b, bias, out)
    torch.testing.assert_close(out, torch.addmm(bias, a, b), equal_nan=True)


def test_a_copy_with_more_post_passes_builds_again(tmp_path: Path) -> None:
    options = Options(kernel_cache_dir=str(tmp_path))
    space = GemmSpace(256, 256, 128, Isa.AVX2, 2, bias=True, name="parallel_gemm")
    config = space.config(space.default())
    stored_plan(space, config, options)
    _fresh()
    read = stored_plan(space, config, options)
    assert " in parallel(" in print_func(read.build())
    serial = read.with_post(Serial("test"))
    assert " in parallel(" not in print_func(serial.build())
    assert print_func(serial.build()) == print_func(space.plan_config(config)
                                                    .with_post(Serial("test")).build())


def test_a_damaged_entry_is_made_again_and_rewritten(tmp_path: Path) -> None:
    options = Options(kernel_cache_dir=str(tmp_path))
    space = _spaces()[0]
    config = space.config(space.default())
    stored_plan(space, config, options)
    path = plan_path(space, config, options)
    whole = path.read_bytes()
    for damaged in (whole[: len(whole) // 2], b"not a pickle", b""):
        path.write_bytes(damaged)
        _fresh()
        assert stored_plan(space, config, options) == space.plan_config(config)
        assert path.read_bytes() != damaged
    path.write_bytes(whole)


def test_keys_separate_spaces_configurations_and_kiln_versions(tmp_path: Path,
                                                              monkeypatch) -> None:
    options = Options(kernel_cache_dir=str(tmp_path))
    conv, gemm = _spaces()
    config = gemm.config(gemm.default())
    paths = {plan_path(gemm, config, options),
             plan_path(dataclasses.replace(gemm, threads=1), config, options),
             plan_path(dataclasses.replace(gemm, isa=Isa.AVX512), config, options),
             plan_path(gemm, dataclasses.replace(config, mr=config.mr - 1), options),
             plan_path(conv, conv.config(conv.default()), options)}
    assert len(paths) == 5
    before = plan_path(gemm, config, options)
    monkeypatch.setattr(plan_store, "kiln_digest", lambda: "another kiln")
    assert plan_path(gemm, config, options) != before


def test_the_option_off_stores_nothing(tmp_path: Path) -> None:
    options = Options(kernel_cache_dir=str(tmp_path), store_plans=False)
    space = _spaces()[0]
    config = space.config(space.default())
    assert stored_plan(space, config, options) == space.plan_config(config)
    assert not (tmp_path / "plans").exists()


def test_a_second_compile_reads_the_plans_the_first_stored(tmp_path: Path,
                                                          monkeypatch) -> None:
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(16 * 12 * 12, 40)).eval()
    x = torch.randn(1, 8, 12, 12)
    options = Options(kernel_cache_dir=str(tmp_path), measure_kernels=False)
    _fresh()
    first = kiln.compile(model, (x,), options=options)
    entries = sorted((tmp_path / "plans").rglob("*.pickle"))
    generated = [k.ops for g in first.report.graphs for k in g.kernels if k.kind == "generated"]
    # (the convolution's own kernel only where the layout pass measured channels-last faster)
    assert ("addmm",) in generated and len(entries) >= len(generated)
    made = []
    original = GemmSpace.plan_config
    monkeypatch.setattr(GemmSpace, "plan_config",
                        lambda self, cfg: made.append(self) or original(self, cfg))
    monkeypatch.setattr(WindowSpace, "plan_config", lambda self, cfg: made.append(self))
    _fresh()
    second = kiln.compile(model, (x,), options=options)
    assert made == []  # every plan read from its entry
    assert sorted((tmp_path / "plans").rglob("*.pickle")) == entries
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(second(x), expected)
        torch.testing.assert_close(first(x), expected)
