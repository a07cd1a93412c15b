"""The README's example is part of the suite: if it breaks, the README is wrong."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python example"
    exec(compile(blocks[0], "README.md", "exec"), {})  # noqa: S102 - our own README
    printed = capsys.readouterr().out
    assert "kiln compile report" in printed
    assert "'conv_act'" in printed and "'batch_norm'" not in printed


def test_readme_setup_commands_use_the_constraints():
    text = README.read_text()
    commands = [line for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S)
                for line in block.splitlines() if "python3 -m venv" in line]
    assert len(commands) == 2
    assert all("-c constraints.txt" in c for c in commands)
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[1] in ci, ".ci/run must run exactly the README's test command"


def test_readme_onnx_example_runs(tmp_path, monkeypatch):
    """The second example: ONNX import, the HTML report and ONNX export."""
    import pytest

    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    monkeypatch.chdir(tmp_path)  # it writes its files where it runs
    exec(compile(blocks[1], "README.md", "exec"), {})  # noqa: S102 - our own README
    assert (tmp_path / "resnet18.html").stat().st_size > 10_000
    import onnx

    onnx.checker.check_model(onnx.load(str(tmp_path / "resnet18.opt.onnx")), full_check=True)
