"""The HTML compile report: one self-contained page with every section, pictures that draw every
node and box every fused kernel, a memory timeline of the plan and a profile of one run."""

from __future__ import annotations

import re
import shutil
import warnings
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest

import kiln
from kiln.report import CompileReport
from kiln.report.html import SECTIONS, ReportWarning, render_html, rule_firings, write_html

needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz's dot is not installed (apt-get install graphviz)")


class Links(HTMLParser):
    """Every src/href of a page, and the sections it has."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.sections: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "xlink:href") and value is not None:
                self.links.append(value)
            if name == "data-section" and value is not None:
                self.sections.append(value)


def picture(page: str, prefix: str) -> str:
    """The SVG of one graph picture (``g0-before`` or ``g0-after``)."""
    start = page.index(f'data-graph="{prefix}"')
    return unescape(page[start:page.index("</svg>", start)])  # dot writes "-" as &#45;


def drawn_ops(svg: str) -> list[str]:
    return re.findall(r'<g id="([^"]+)" class="node op [a-z]+"', svg)


@needs_dot
def test_page_is_self_contained_with_every_section(compiled_bert, tmp_path: Path) -> None:
    path = compiled_bert.report.to_html(tmp_path / "bert.html")
    page = path.read_text(encoding="utf-8")
    parser = Links()
    parser.feed(page)
    assert parser.sections == list(SECTIONS)
    outside = [link for link in parser.links if not link.startswith(("#", "data:"))]
    assert outside == [], "the page must open with no network and no files beside it"
    assert "<script src" not in page and "@import" not in page
    for section in SECTIONS:
        assert "could not be drawn" not in page, section


@needs_dot
def test_pictures_draw_every_node_before_and_after(compiled_bert) -> None:
    graph = compiled_bert.report.graphs[0]
    page = render_html(compiled_bert.report)
    before, after = drawn_ops(picture(page, "g0-before")), drawn_ops(picture(page, "g0-after"))
    assert len(before) == graph.nodes_before == graph.details.captured.num_ops()
    assert len(after) == graph.nodes_after == graph.details.optimized.num_ops()
    assert len(set(before + after)) == len(before) + len(after)
    assert graph.nodes_before > graph.nodes_after  # bert's rewrites remove nodes


def _points(svg_fragment: str) -> list[tuple[float, float]]:
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", svg_fragment)]
    return list(zip(numbers[0::2], numbers[1::2]))


@needs_dot
def test_fused_kernels_are_boxed_around_their_nodes(compiled_bert) -> None:
    graph = compiled_bert.report.graphs[0]
    svg = picture(render_html(compiled_bert.report), "g0-after")
    fused = [step for step, k in enumerate(graph.kernels)
             if k.kind != "library" and len(k.nodes) > 1]
    assert fused, "bert quick has fused kernels (residual add + layer norm)"
    boxes = re.findall(r'<g id="g0-after-k(\d+)" class="cluster kernel">.*?'
                       r'<path[^>]* d="([^"]+)"', svg, re.S)
    assert sorted(int(step) for step, _ in boxes) == fused
    nodes_of = compiled_bert.report.graphs[0].details.group_of_step()
    index = {n: i for i, n in enumerate(graph.details.optimized.nodes)}
    for step, outline in boxes:
        xs, ys = zip(*_points(outline))
        for node in nodes_of[int(step)]:
            shape = re.search(rf'<g id="g0-after-n{index[node]}" class="node op [a-z]+">.*?'
                              r'<path[^>]* d="([^"]+)"', svg, re.S)
            assert shape is not None
            for x, y in _points(shape.group(1)):  # the node's outline lies inside the box
                assert min(xs) <= x <= max(xs) and min(ys) <= y <= max(ys)


def test_rules_say_where_they_fired(compiled_bert) -> None:
    graph = compiled_bert.report.graphs[0]
    rows = rule_firings(graph.passes)
    assert rows
    for pass_name, rule, count, where in rows:
        record = next(p for p in graph.passes if p.name == pass_name)
        assert count == record.rules[rule].fired == len(where)
    assert {(rule, sum(r[2] for r in rows if r[1] == rule)) for _, rule, _, _ in rows} == set(
        graph.rules_fired().items())


def test_memory_timeline_holds_the_plan(compiled_bert) -> None:
    graph = compiled_bert.report.graphs[0]
    buffers = graph.details.buffers
    assert buffers and len(buffers) == len(compiled_bert.report.graphs[0].details.buffers)
    for a in buffers:
        assert 0 <= a.first <= a.last < len(graph.kernels)
        assert a.offset + a.nbytes <= graph.planned_peak_bytes
        for b in buffers:
            if a is not b and a.first <= b.last and b.first <= a.last:  # alive together
                assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset
    page = render_html(graph)
    assert page.count('<rect class="buffer"') == len(buffers)


def test_profile_times_every_call(compiled_resnet) -> None:
    graph = compiled_resnet.report.graphs[0]
    profile = graph.details.profiler()
    assert [s.step for s in profile.steps] == list(range(len(graph.kernels)))
    assert all(s.seconds > 0 for s in profile.steps)
    assert profile.total_seconds > 0
    assert "perf_counter" in profile.method


@needs_dot
def test_a_report_of_one_graph_or_none(compiled_resnet, tmp_path: Path) -> None:
    one = write_html(compiled_resnet.report.graphs[0], tmp_path / "sub" / "one.html")
    assert one.read_text().count('data-section="graphs"') == 1
    empty = write_html(CompileReport(), tmp_path / "empty.html").read_text()
    assert "No graph was compiled" in empty


def test_missing_dot_leaves_a_message_and_the_other_sections(compiled_resnet, tmp_path: Path,
                                                               monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot on it
    with pytest.warns(ReportWarning, match="dot"):
        page = render_html(compiled_resnet.report)
    assert "No picture: drawing graphs needs Graphviz" in page
    assert "apt-get install graphviz" in page
    for section in SECTIONS:
        assert f'data-section="{section}"' in page
    assert page.count('class="bar"') > 0  # the profile still drawn


@needs_dot
def test_options_report_writes_a_page_per_graph_on_torch_compile(report_options,
                                                                  tmp_path: Path) -> None:
    import dataclasses

    import torch

    def two_graphs(x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x @ x.T) + 1
        torch._dynamo.graph_break()
        return torch.tanh(y) * 2

    target = tmp_path / "run.html"
    options = dataclasses.asdict(report_options) | {"report": str(target)}
    torch._dynamo.reset()
    compiled = torch.compile(two_graphs, backend="kiln", options=options)
    x = torch.randn(8, 8)
    torch.testing.assert_close(compiled(x), two_graphs(x))
    pages = sorted(p.name for p in tmp_path.iterdir())
    assert pages == ["run.2.html", "run.html"]
    for page in pages:
        text = (tmp_path / page).read_text()
        assert all(f'data-section="{s}"' in text for s in SECTIONS)


def test_a_report_that_cannot_be_written_is_one_warning(report_options, tmp_path: Path) -> None:
    import dataclasses

    from kiln import models

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    options = dataclasses.replace(report_options, report=str(blocked / "report.html"))
    model, inputs = models.build("mlp", quick=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = kiln.compile(model, inputs, options)
    ours = [w for w in caught if "could not write the report" in str(w.message)]
    assert len(ours) == 1
    import torch

    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs))


def test_report_path_from_the_environment_or_a_path() -> None:
    assert kiln.Options.from_env({"KILN_REPORT": "out/r.html"}).report == "out/r.html"
    assert kiln.Options.from_env({}).report == ""
    assert kiln.Options(report=Path("out") / "r.html").report == "out/r.html"
    with pytest.raises(TypeError, match="Options.report must be a string"):
        kiln.Options(report=1)
