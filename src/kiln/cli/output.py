"""Terminal output for the command line: tables and progress, drawn by rich where it is
installed (the cli extra), as plain lines where it is not or where the stream is no terminal.

Tables are Markdown either way, so a bench table pasted into an issue or a README reads the
same as on screen.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

try:  # rich is optional: a bare `pip install kiln` needs only torch and numpy
    from rich import box
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
    from rich.table import Table
except ImportError:  # pragma: no cover - exercised by tests that hide rich
    Console = None  # type: ignore[assignment,misc]


def has_rich() -> bool:
    return Console is not None


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table with aligned columns."""
    if Console is None:
        return "\n".join(_plain_markdown([list(header), *map(list, rows)]))
    table = Table(box=box.MARKDOWN)
    for title in header:
        table.add_column(title, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    buffer = io.StringIO()
    # wide enough that no cell wraps; no colour codes, so files and pipes get clean text
    Console(file=buffer, width=10_000, color_system=None, force_terminal=False).print(table)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines() if line.strip())


def _plain_markdown(table: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in table]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return lines


class StepProgress:
    """Progress of a long command: a live bar on a terminal (rich), otherwise one line per
    reported step, so logs of CI runs still show where a run was."""

    def __init__(self, stream: TextIO, total: float = 1.0) -> None:
        self.stream = stream
        self.total = total
        self.live = Console is not None and stream.isatty()
        self.last_key: object = None
        if self.live:
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                     TaskProgressColumn(),
                                     console=Console(file=stream), transient=True)
            self.task = self.progress.add_task("", total=total)
            self.progress.start()

    def update(self, done: float, text: str, key: object = None) -> None:
        """``key``: off a terminal, a line is printed only when it changes (default: the
        line itself), so a fast inner loop can report every step without flooding a log."""
        if self.live:
            self.progress.update(self.task, completed=done, description=text)
            return
        line = f"[{done / self.total:4.0%}] {text}" if self.total else text
        key = line if key is None else key
        if key != self.last_key:
            self.stream.write(line + "\n")
            self.stream.flush()
            self.last_key = key

    def close(self) -> None:
        if self.live:
            self.progress.stop()


@contextmanager
def step_progress(stream: TextIO, total: float = 1.0) -> Iterator[StepProgress]:
    bar = StepProgress(stream, total)
    try:
        yield bar
    finally:
        bar.close()
