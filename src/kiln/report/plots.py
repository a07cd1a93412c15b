"""The report's two plots as inline SVG: the memory plan over time, and time per call.

Plain SVG text, no plotting library: the page must open with no network. Every mark has an
SVG ``<title>``, which browsers show on hover.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from kiln.report.details import Buffer

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#86bcb6")
FONT = 'font-family="Helvetica, Arial, sans-serif" font-size="11"'


def size_text(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def time_text(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def memory_timeline_svg(buffers: Sequence[Buffer], arena_bytes: int, steps: int,
                        width: int = 960, height: int = 300) -> str:
    """Each planned buffer as a rectangle: across, the steps it is alive; up, its bytes in
    the arena. Rectangles never overlap when the plan is right, so the picture shows reuse."""
    left, right, top, bottom = 64, 12, 10, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    steps = max(steps, 1)
    arena = max(arena_bytes, 1)

    def x(step: float) -> float:
        return left + plot_w * step / steps

    def y(offset: float) -> float:
        return top + plot_h * (1 - offset / arena)

    parts = [_svg_open(width, height, "memory-timeline"),
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" '
             f'stroke="#cccccc"/>']
    for i, b in enumerate(buffers):
        x0, x1 = x(b.first), x(b.last + 1)
        y0, y1 = y(b.offset + b.nbytes), y(b.offset)
        title = (f"{b.name}: {size_text(b.nbytes)} at offset {size_text(b.offset)}, "
                 f"alive from step {b.first} to step {b.last}")
        parts.append(f'<rect class="buffer" x="{x0:.1f}" y="{y0:.1f}" '
                     f'width="{max(x1 - x0, 1):.1f}" height="{max(y1 - y0, 1):.1f}" '
                     f'fill="{PALETTE[i % len(PALETTE)]}" fill-opacity="0.8" stroke="#ffffff" '
                     f'stroke-width="0.5"><title>{escape(title)}</title></rect>')
    for k in range(5):
        offset = arena * k / 4
        parts.append(f'<text x="{left - 4}" y="{y(offset) + 4:.1f}" text-anchor="end" '
                     f'{FONT}>{size_text(offset)}</text>')
    for step in _ticks(steps):
        parts.append(f'<line x1="{x(step):.1f}" x2="{x(step):.1f}" y1="{top + plot_h}" '
                     f'y2="{top + plot_h + 4}" stroke="#888888"/>'
                     f'<text x="{x(step):.1f}" y="{top + plot_h + 16}" text-anchor="middle" '
                     f'{FONT}>{step}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 2}" text-anchor="middle" '
                 f'{FONT}>step (library or kernel call, in run order)</text>')
    parts.append("</svg>")
    return "\n".join(parts)


@dataclass(frozen=True)
class Bar:
    label: str
    seconds: float
    colour: str
    title: str = ""  # hover text; the label if empty


def bar_chart_svg(bars: Sequence[Bar], css_class: str, width: int = 960) -> str:
    """Horizontal bars, one row each, in the given order, scaled to the longest."""
    label_w, value_w, row_h = 300, 80, 16
    height = row_h * len(bars) + 8
    longest = max((b.seconds for b in bars), default=0.0) or 1.0
    bar_room = width - label_w - value_w
    parts = [_svg_open(width, height, css_class)]
    for i, b in enumerate(bars):
        y = 4 + i * row_h
        w = max(bar_room * b.seconds / longest, 1)
        label = b.label if len(b.label) <= 48 else b.label[:47] + "…"
        title = escape(b.title or b.label)
        parts.append(f'<g class="bar"><title>{title}: {time_text(b.seconds)}</title>'
                     f'<text x="{label_w - 6}" y="{y + 11}" text-anchor="end" {FONT}>'
                     f'{escape(label)}</text>'
                     f'<rect x="{label_w}" y="{y + 1}" width="{w:.1f}" height="{row_h - 3}" '
                     f'fill="{b.colour}" stroke="#555555" stroke-width="0.4"/>'
                     f'<text x="{label_w + w + 4:.1f}" y="{y + 11}" {FONT}>'
                     f'{time_text(b.seconds)}</text></g>')
    parts.append("</svg>")
    return "\n".join(parts)


def _svg_open(width: int, height: int, css_class: str) -> str:
    return (f'<svg class="{css_class}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img">')


def _ticks(steps: int) -> list[int]:
    """About ten round step numbers from 0 to ``steps``."""
    stride = 1
    for candidate in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000):
        stride = candidate
        if steps / candidate <= 12:
            break
    return list(range(0, steps + 1, stride))
