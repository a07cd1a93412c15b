"""What kiln did to a model, for people: passes, counts, memory, time, fallbacks."""

from kiln.report.compile_report import CompileReport, GraphReport, KernelInfo

__all__ = ["CompileReport", "GraphReport", "KernelInfo"]
