"""The compile report as one self-contained HTML page: `write_html(report, path)`.

For each compiled graph, six sections (each ``<section data-section=...>``): the graph
before and after optimization (``graphs``), the passes (``passes``), the rules fired and
where (``rules``), the kernels (``kernels``), the memory plan over time (``memory``) and the
time of each call in one run (``profile``). Everything is inline (SVG, style, script), so
the file opens anywhere with no network.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path

from kiln.ir.ops import Op, OpGroup
from kiln.passes.pipeline import PassRecord
from kiln.report.compile_report import CompileReport, GraphReport, KernelInfo
from kiln.report.details import Profile
from kiln.report.graph_svg import (
    AFTER_KINDS,
    BEFORE_KINDS,
    KIND_COLOURS,
    GraphvizMissing,
    draw_graph,
)
from kiln.report.page_assets import SCRIPT, STYLE
from kiln.report.plots import Bar, bar_chart_svg, memory_timeline_svg, size_text, time_text

SECTIONS = ("graphs", "passes", "rules", "kernels", "memory", "profile")
MAX_PROFILE_ROWS = 300  # calls drawn one bar each; the by-op chart always covers all
MAX_WHERE = 24  # node names listed per rule; the count says how many there were
# identifies this process in the pages it writes (`kiln.report.on_compile` numbers by it)
RUN_ID = f"{os.getpid()}-{time.time_ns()}"


class ReportWarning(UserWarning):
    """Part of the report could not be drawn (the rest of the page is written)."""


def write_html(report: CompileReport | GraphReport, path: str | Path) -> Path:
    """Write ``report`` (a whole compile, or one graph of it) to ``path`` as one HTML page;
    returns the path. Without Graphviz the pictures are replaced by a message saying what
    to install, and a ReportWarning says the same."""
    target = Path(path)
    page = render_html(report)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    return target


def render_html(report: CompileReport | GraphReport) -> str:
    whole = report if isinstance(report, CompileReport) else CompileReport([report])
    nodes: dict[str, dict[str, str]] = {}
    missing: list[str] = []
    body = [_section_html(i, g, nodes, missing) for i, g in enumerate(whole.graphs)]
    if missing:
        warnings.warn(f"kiln report: graphs not drawn: {missing[0]}", ReportWarning,
                      stacklevel=3)
    if not whole.graphs:
        body.append('<p class="warning">No graph was compiled: nothing to show.</p>')
    data = json.dumps(nodes).replace("</", "<\\/")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta name="kiln-run" content="{RUN_ID}">',
        '<link rel="icon" href="data:,">', "<title>kiln compile report</title>",
        f"<style>{STYLE}</style></head><body>", _header(whole), "<main>", *body, "</main>",
        f'<script type="application/json" id="kiln-node-data">{data}</script>',
        f"<script>{SCRIPT}</script>", "</body></html>"])


def _header(report: CompileReport) -> str:
    links = "".join(f'<a href="#g{i}-{s}">graph {i} {s}</a>' if len(report.graphs) > 1
                    else f'<a href="#g{i}-{s}">{s}</a>'
                    for i in range(len(report.graphs)) for s in SECTIONS)
    fallbacks = "".join(f"<p>fallback: {escape(f)}</p>" for f in report.fallbacks)
    return (f"<header><h1>kiln compile report</h1>"
            f"<p>{len(report.graphs)} graph(s) compiled in "
            f"{report.compile_seconds * 1e3:.1f} ms; {report.nodes_before} nodes captured, "
            f"{report.nodes_after} run; written {time.strftime('%Y-%m-%d %H:%M:%S')}</p>"
            f"{fallbacks}<nav>{links}</nav></header>")


def _section_html(i: int, g: GraphReport, nodes: dict[str, dict[str, str]],
                  missing: list[str]) -> str:
    profile = _profile(g)
    parts = [f'<h2 style="border:none">Graph {i}: {g.nodes_before} nodes captured, '
             f'{g.nodes_after} after optimization, {len(g.kernels)} calls per run</h2>']
    for name, draw in (("graphs", lambda: _graphs(i, g, nodes, missing)),
                       ("passes", lambda: _passes(g.passes)),
                       ("rules", lambda: _rules(g.passes)),
                       ("kernels", lambda: _kernels(g, profile)),
                       ("memory", lambda: _memory(g)),
                       ("profile", lambda: _profile_section(g, profile))):
        parts.append(f'<section id="g{i}-{name}" data-section="{name}">'
                     f"{_guarded(name, draw)}</section>")
    return f'<div class="graph-report" id="g{i}">' + "\n".join(parts) + "</div>"


def _guarded(name: str, draw: Callable[[], str]) -> str:
    """A section that fails to draw says so in its place; the page still comes out."""
    try:
        return draw()
    except Exception as err:  # noqa: BLE001 - one broken section must not lose the others
        return (f"<h2>{name}</h2><p class='warning'>This section could not be drawn: "
                f"{escape(type(err).__name__)}: {escape(str(err))}</p>")


def _profile(g: GraphReport) -> Profile | str:
    """One timed run of the graph (the kernels and profile sections share it): a Profile,
    or why there is none."""
    if g.details is None or g.details.profiler is None:
        return "this report holds no compiled graph to run"
    try:
        return g.details.profiler()
    except Exception as err:  # noqa: BLE001 - a failed run leaves the section empty
        return f"the timed run failed ({type(err).__name__}: {err})"


def _graphs(i: int, g: GraphReport, nodes: dict[str, dict[str, str]],
            missing: list[str]) -> str:
    d = g.details
    head = "<h2>Graph before and after optimization</h2>"
    if d is None:
        return head + "<p class='note'>This report holds no graphs to draw.</p>"
    pictures = []
    for title, prefix, graph, steps, kernels, kinds in (
            (f"captured: {g.nodes_before} nodes", f"g{i}-before", d.captured, None, None,
             BEFORE_KINDS),
            (f"optimized: {g.nodes_after} nodes, {len(g.kernels)} calls", f"g{i}-after",
             d.optimized, d.step_of_node, g.kernels, AFTER_KINDS)):
        legend = "".join(f'<span><span class="swatch" style="background:{KIND_COLOURS[k][0]}">'
                         f"</span>{escape(KIND_COLOURS[k][1])}</span>" for k in kinds)
        try:
            drawn = draw_graph(graph, prefix, steps, kernels)
            canvas = drawn.svg
            nodes.update(drawn.nodes)
        except GraphvizMissing as err:
            missing.append(str(err))
            canvas = f'<p class="warning">No picture: {escape(str(err))}.</p>'
        except ValueError as err:
            canvas = f'<p class="warning">No picture: {escape(str(err))}.</p>'
        pictures.append(f'<div class="picture" data-graph="{prefix}"><h3>{escape(title)}'
                        f'<button class="fit">fit width</button></h3>'
                        f'<div class="legend">{legend}</div>'
                        f'<div class="canvas">{canvas}</div></div>')
    note = ("<p class='note'>Hover a node for its op and types; click it for everything "
            "(operands, attributes, kernel). Dashed boxes are fused kernels: their nodes run "
            "as one call. Weights and numbers are not drawn; they are listed among a node's "
            "operands.</p>")
    return (head + note + '<div class="pictures">' + "".join(pictures) +
            '<aside class="node-details"><p class="note">Click a node.</p></aside></div>')


def _passes(passes: Sequence[PassRecord]) -> str:
    longest = max((p.seconds for p in passes), default=0.0) or 1.0
    rows = "".join(
        f"<tr><td>{escape(p.name)}</td><td class='num'>{p.nodes_before}</td>"
        f"<td class='num'>{p.nodes_after}</td><td class='num'>{p.seconds * 1e3:.2f} ms</td>"
        f"<td><span class='timebar' style='width:{200 * p.seconds / longest:.0f}px'>"
        f"</span></td><td class='num'>{sum(s.fired for s in p.rules.values())}</td></tr>"
        for p in passes)
    search = "".join(f"<p class='note'>{escape(p.name)}: {escape(p.search.describe())}</p>"
                     for p in passes if p.search is not None)
    search += "".join(f"<pre class='note'>{escape(p.pet.describe())}</pre>"
                      for p in passes if p.pet is not None)
    return ("<h2>Passes</h2><p class='note'>In pipeline order; node counts leave out weights "
            "and numbers.</p><table><tr><th>pass</th><th>nodes before</th><th>nodes after"
            "</th><th>time</th><th></th><th>rewrites</th></tr>" + rows + "</table>" + search)


def rule_firings(passes: Sequence[PassRecord]) -> list[tuple[str, str, int, list[str]]]:
    """(pass, rule, times fired, where: the root nodes' names) for every rule that fired,
    in pipeline order, most often first within a pass."""
    rows = []
    for p in passes:
        where: dict[str, list[str]] = {}
        for event in p.trace:
            if event.fired:
                where.setdefault(event.rule, []).append(event.node)
        if p.search is not None:
            for rule, node in p.search.path:
                where.setdefault(rule, []).append(node)
        fired = {name: s.fired for name, s in p.rules.items() if s.fired}
        for rule in where:
            fired.setdefault(rule, len(where[rule]))
        for rule, count in sorted(fired.items(), key=lambda kv: (-kv[1], kv[0])):
            rows.append((p.name, rule, count, where.get(rule, [])))
    return rows


def _rules(passes: Sequence[PassRecord]) -> str:
    rows = []
    for pass_name, rule, count, where in rule_firings(passes):
        shown = ", ".join(escape(n) for n in where[:MAX_WHERE])
        more = f" … and {len(where) - MAX_WHERE} more" if len(where) > MAX_WHERE else ""
        rows.append(f"<tr><td>{escape(pass_name)}</td><td>{escape(rule)}</td>"
                    f"<td class='num'>{count}</td><td class='where'>{shown}{more}</td></tr>")
    if not rows:
        return "<h2>Rules fired</h2><p>No rewrite rule fired.</p>"
    return ("<h2>Rules fired</h2><p class='note'>Where: the node each rewrite matched at "
            "(its root), named as in the graph the pass received.</p><table><tr><th>pass"
            "</th><th>rule</th><th>times</th><th>where</th></tr>" + "".join(rows) + "</table>")


def _kernels(g: GraphReport, profile: Profile | str) -> str:
    times = profile.by_step if isinstance(profile, Profile) else {}
    rows = []
    for step, k in enumerate(g.kernels):
        colour = KIND_COLOURS[_colour_kind(k)][0]
        measured = time_text(times[step]) if step in times else ""
        covered = ", ".join(f"{escape(n)} ({escape(o)})" for n, o in zip(k.nodes, k.ops))
        code = _code_details(k)
        rows.append(f"<tr><td class='num'>{step}</td><td><span class='kind' style='background:"
                    f"{colour}'>{escape(k.kind)}</span></td><td class='num'>{measured}</td>"
                    f"<td>{escape(k.decision)}</td><td class='code'>{covered}{code}</td></tr>")
    generated = sum(k.kind == "generated" for k in g.kernels)
    return (f"<h2>Kernels</h2><p class='note'>{len(g.kernels)} calls per run: {generated} "
            f"generated kernels, the others library calls. Decision: the measured times that "
            f"chose the kernel (library vs generated, on these shapes, at compile time), or "
            f"why no generated kernel stands there. Time in this run: from the profile below."
            f"</p><table><tr><th>step</th><th>kind</th><th>time in this run</th><th>decision</th>"
            f"<th>nodes (ops)</th></tr>" + "".join(rows) + "</table>")


def _colour_kind(k: KernelInfo) -> str:
    """The kernel's colour class, as the graph picture colours its nodes."""
    if k.kind == "library" and len(k.ops) == 1 and Op.parse(k.ops[0]).is_a(OpGroup.VIEW):
        return "view"
    return k.kind if k.kind in KIND_COLOURS else "library"


def _code_details(k: KernelInfo) -> str:
    parts = []
    if k.source:
        parts.append(f"<details><summary>source</summary><pre>{escape(k.source)}</pre>"
                     "</details>")
    if k.trace:
        parts.append(f"<details><summary>schedule trace</summary><pre>{escape(k.trace)}</pre>"
                     "</details>")
    return "".join(parts)


def _memory(g: GraphReport) -> str:
    head = ("<h2>Memory plan</h2>"
            f"<p>Arena: {size_text(g.planned_peak_bytes)} holds "
            f"{size_text(g.planned_bytes)} of planned intermediates "
            f"({size_text(g.intermediate_bytes)} of intermediates in all, "
            f"{size_text(g.planned_peak_bytes_before)} of arena before rewrites).</p>")
    d = g.details
    if d is None or not d.buffers:
        return head + "<p class='note'>No planned buffers (memory planning off, or every " \
                      "intermediate is returned, a view, or made by a call without out=).</p>"
    note = ("<p class='note'>Each rectangle is one planned buffer: across, the calls during "
            "which it is alive; up, its bytes in the arena. Buffers stacked at the same "
            "height reuse the same memory at different times.</p>")
    return head + note + memory_timeline_svg(d.buffers, d.arena_bytes, len(g.kernels))


def _profile_section(g: GraphReport, profile: Profile | str) -> str:
    head = "<h2>Profile of one run</h2>"
    if isinstance(profile, str):
        return head + f"<p class='note'>Not measured: {escape(profile)}.</p>"
    by_op: dict[str, tuple[float, str]] = {}
    calls = []
    for s in profile.steps:
        k = g.kernels[s.step]
        label = f"{k.kind}: {'+'.join(k.ops)}" if k.kind != "library" else k.ops[0]
        colour = KIND_COLOURS[_colour_kind(k)][0]
        seconds, _ = by_op.get(label, (0.0, colour))
        by_op[label] = (seconds + s.seconds, colour)
        where = ", ".join(k.nodes)
        calls.append(Bar(f"{s.step}: {label}", s.seconds, colour, f"step {s.step}: {where}"))
    ranked = sorted(by_op.items(), key=lambda kv: -kv[1][0])
    op_bars = [Bar(label, sec, colour) for label, (sec, colour) in ranked]
    summed = sum(s.seconds for s in profile.steps)
    shown = calls[:MAX_PROFILE_ROWS]
    cut = (f" (the first {MAX_PROFILE_ROWS} of {len(calls)})" if len(calls) > len(shown)
           else "")
    return (head + f"<p>One call of the graph: {time_text(profile.total_seconds)}; its calls "
            f"timed one by one add up to {time_text(summed)}.</p>"
            f"<p class='note'>How: {escape(profile.method)}.</p>"
            "<h3>Time by op</h3>" + bar_chart_svg(op_bars, "profile-by-op") +
            f"<h3>Time per call, in run order{cut}</h3>" +
            bar_chart_svg(shown, "profile-by-call"))
