"""What kiln did to a model, for people: passes, counts, memory, time, fallbacks.

``print(report)`` gives the text; ``write_html(report, path)`` (or ``report.to_html(path)``)
one self-contained HTML page with the graphs drawn (kiln.report.html).
"""

from kiln.report.compile_report import CompileReport, GraphReport, KernelInfo
from kiln.report.html import ReportWarning, write_html

__all__ = ["CompileReport", "GraphReport", "KernelInfo", "ReportWarning", "write_html"]
