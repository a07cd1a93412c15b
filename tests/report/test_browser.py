"""The report in a real browser: headless Chromium opens the page with no console error, draws
every node of both graphs, and a click on a node shows its details.

Runs Debian's Chromium (/usr/bin/chromium) through Playwright, which needs no browser download;
skipped, saying what is missing, where Playwright, Chromium or Graphviz's dot is not installed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; no browser download needed)"
    if not CHROMIUM.exists():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    if shutil.which("dot") is None:
        return "Graphviz's dot is not installed (apt-get install graphviz)"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def test_report_renders_in_chromium_with_every_node(compiled_bert, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    graph = compiled_bert.report.graphs[0]
    first = graph.details.step_of_node.index(0)  # the node of the first call
    page_path = compiled_bert.report.to_html(tmp_path / "report.html")
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.goto(page_path.as_uri())
            page.wait_for_load_state("load")
            before = page.locator('[data-graph="g0-before"] svg g.node.op').count()
            after = page.locator('[data-graph="g0-after"] svg g.node.op').count()
            boxes = page.locator('[data-graph="g0-after"] svg g.cluster.kernel').count()
            page.locator(f'[id="g0-after-n{first}"]').click()
            details = page.locator("#g0-graphs aside.node-details").inner_text()
            rendered = page.locator('[data-graph="g0-after"] svg').bounding_box()
        finally:
            browser.close()
    assert errors == []
    assert before == graph.nodes_before
    assert after == graph.nodes_after
    assert boxes == sum(k.kind != "library" and len(k.nodes) > 1 for k in graph.kernels)
    node = graph.details.optimized.nodes[first]
    assert f"= {node.op.text}" in details and "step 0:" in details
    assert rendered is not None and rendered["height"] > 100
