"""`kiln compile`, `kiln run`, `kiln optimize`, `kiln report` and the command line's exit codes,
through ``main(argv)`` on quick zoo models and small ONNX files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kiln import models
from kiln.cli import main
from kiln.cli.errors import UsageError
from kiln.cli.model_cmds import parse_shapes


def test_compile_prints_the_report_and_writes_the_artifact(tmp_path: Path, capsys) -> None:
    out = tmp_path / "mlp.kiln"
    assert main(["compile", "mlp", "--quick", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "compiled mlp in " in text and f"to {out}" in text
    report = (out / "report.txt").read_text()
    assert report.strip() and report.strip() in text  # the summary printed is the one written


def test_run_reads_npy_inputs_and_prints_shapes_and_timing(tmp_path: Path, capsys) -> None:
    model, (x,) = models.build("mlp", quick=True)
    x = torch.randn_like(x)
    np.save(tmp_path / "x.npy", x.numpy())
    argv = ["run", "mlp", "--quick", "--input", f"input0={tmp_path / 'x.npy'}", "--repeat", "2",
            "--save", str(tmp_path / "out")]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    with torch.no_grad():
        expected = model(x)
    assert lines[0] == f"output0: {'x'.join(map(str, expected.shape))} float32"
    assert "run median" in lines[-1] and "over 2 calls" in lines[-1]
    saved = np.load(tmp_path / "out" / "output0.npy")
    np.testing.assert_allclose(saved, expected.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("argv, code, says", [
    (["run", "no_such_model"], 2, "known models"),
    (["run", "mlp", "--quick", "--repeat", "0"], 2, "--repeat"),
    (["run", "mlp", "--quick", "--input", "nope=x.npy"], 2, "input0"),
    (["run", "mlp", "--quick", "--shape", "x=1x2"], 2, "--shape is for ONNX"),
    (["run", "missing.onnx"], 1, "missing.onnx: no such file"),
    (["compile", "mlp", "--quick", "-o", "/proc/no/such/dir"], 1, "cannot create"),
])
def test_mistakes_get_one_line_and_the_right_exit_code(argv: list[str], code: int, says: str,
                                                       capsys) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.startswith("kiln: error: ") and says in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_wrong_npy_input_is_a_user_error(tmp_path: Path, capsys) -> None:
    np.save(tmp_path / "x.npy", np.zeros((3, 3), dtype=np.float64))
    assert main(["run", "mlp", "--quick", "--input", f"input0={tmp_path / 'x.npy'}"]) == 1
    err = capsys.readouterr().err
    assert "is 3x3 float64; the model takes" in err


def test_debug_shows_the_traceback_behind_an_error(capsys) -> None:
    assert main(["run", "missing.onnx", "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_an_internal_error_is_one_line_unless_debug(monkeypatch: pytest.MonkeyPatch,
                                                    capsys) -> None:
    from kiln.cli import model_cmds

    def broken(*_args, **_kwargs):
        raise RuntimeError("something inside kiln broke\nsecond line")

    monkeypatch.setattr(model_cmds, "compile_source", broken)
    assert main(["compile", "mlp", "--quick"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kiln: internal error: RuntimeError: something inside kiln broke")
    assert "second line" not in err and "--debug" in err
    with pytest.raises(RuntimeError):
        main(["--debug", "compile", "mlp", "--quick"])


def test_every_command_has_help_with_an_example(capsys) -> None:
    parser_commands = ["bench", "explain", "compile", "run", "optimize", "report", "fuzz",
                       "rules", "rules print", "rules check", "synth", "synth verify",
                       "synth generate"]
    for command in parser_commands:
        assert main([*command.split(), "--help"]) == 0
        text = capsys.readouterr().out
        assert "example: kiln " in text, command


def test_parse_shapes() -> None:
    assert parse_shapes(["input_ids=1x128", "mask=1X128"]) == {"input_ids": (1, 128),
                                                               "mask": (1, 128)}
    for bad in ("input_ids", "=1x2", "x=1xa", "x="):
        with pytest.raises(UsageError, match="NAME=DIMS"):
            parse_shapes([bad])


def test_onnx_file_runs_and_matches_eager(tmp_path: Path, capsys) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("kiln.frontend.onnx")
    model, (x,) = models.build("mlp", quick=True)
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(model, (x,), str(path), input_names=["x"], output_names=["y"],
                      dynamo=False)
    np.save(tmp_path / "x.npy", x.numpy())
    argv = ["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "1",
            "--save", str(tmp_path / "out")]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("y: ")
    with torch.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), expected, rtol=1e-4,
                               atol=1e-5)


def test_a_corrupt_onnx_file_is_one_line(tmp_path: Path, capsys) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("kiln.frontend.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07not a model at all" * 3)
    for command in ("run", "compile", "optimize", "report"):
        extra = ["-o", str(tmp_path / "out")] if command in ("optimize", "report") else []
        assert main([command, str(bad), *extra]) == 1, command
        err = capsys.readouterr().err
        assert err.startswith("kiln: error: ") and "Traceback" not in err, command


def test_optimize_writes_a_checked_onnx_file(tmp_path: Path, capsys) -> None:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("kiln.export.onnx")
    out = tmp_path / "resnet18.onnx"
    assert main(["optimize", "resnet18", "--quick", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("resnet18: ") and f"written to {out}" in text
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert not any(n.op_type == "BatchNormalization" for n in model.graph.node)  # folded


def test_report_writes_html(tmp_path: Path) -> None:
    pytest.importorskip("graphviz")
    report = pytest.importorskip("kiln.report")
    if not hasattr(report, "write_html"):
        pytest.skip("kiln.report has no HTML writer")
    out = tmp_path / "mlp.html"
    assert main(["report", "mlp", "--quick", "-o", str(out)]) == 0
    assert out.read_text().lstrip().lower().startswith("<!doctype html")
