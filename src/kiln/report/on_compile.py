"""``Options(report="path.html")``: a page per compiled graph, written as each compile ends.

torch.compile may hand kiln several graphs (one per graph break, one per new input shape or
recompile), each compiled on its own. The first graph compiled in a process writes
``path.html``, the next ``path.2.html``, then ``path.3.html`` and so on. A page records which
process wrote it (``RUN_ID``), so a new process starts again at ``path.html``, overwriting
the pages of earlier runs in order; nothing is kept in memory between compiles.
"""

from __future__ import annotations

from pathlib import Path

from kiln.report.compile_report import GraphReport
from kiln.report.html import RUN_ID, write_html

HEAD_BYTES = 600  # the run id's meta tag sits within the page's first lines


def write_after_compile(report: GraphReport, path: str | Path) -> Path:
    """Write the page of one freshly compiled graph; returns the file written."""
    return write_html(report, next_free_page(Path(path)))


def next_free_page(path: Path) -> Path:
    """``path``, or its first numbered sibling that this process has not written yet."""
    candidate, number = path, 1
    while written_by_this_run(candidate):
        number += 1
        candidate = path.with_name(f"{path.stem}.{number}{path.suffix}")
    return candidate


def written_by_this_run(page: Path) -> bool:
    try:
        with page.open("r", encoding="utf-8", errors="replace") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        return False
    return f'name="kiln-run" content="{RUN_ID}"' in head
