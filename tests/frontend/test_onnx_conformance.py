"""ONNX backend node tests through kiln (kiln.frontend.onnx.conformance).

By default a maintained subset runs (onnx_conformance_subset.txt: cases of the ops kiln
translates, and some that run as they are): each must pass. KILN_ONNX_CONFORMANCE=all runs
every case: none may give a wrong value or crash (a refusal is allowed), and the counts are
printed. benchmarks/onnx_conformance.py prints the same counts with the failing cases.
"""

import logging
import os
from pathlib import Path

import pytest

pytest.importorskip("onnx")
from kiln.frontend.onnx.conformance import (  # noqa: E402
    Outcome,
    node_cases,
    run_case,
    summarize,
)
from kiln.options import Options  # noqa: E402

SUBSET = Path(__file__).with_name("onnx_conformance_subset.txt")
OPTIONS = Options(opt_level=1)


@pytest.fixture(scope="module")
def cases():
    return {case.name: case for case in node_cases()}


@pytest.fixture(autouse=True)
def _quiet():
    logging.getLogger("kiln").setLevel(logging.ERROR)  # fallbacks are counted, not logged
    yield
    logging.getLogger("kiln").setLevel(logging.NOTSET)


def _subset() -> list[str]:
    lines = SUBSET.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_subset_passes(cases):
    missing = [name for name in _subset() if name not in cases]
    assert not missing, f"cases gone from the installed onnx: {missing[:5]}"
    failures = []
    for name in _subset():
        result = run_case(cases[name], OPTIONS)
        if result.outcome is not Outcome.PASS:
            failures.append(f"{name}: {result.outcome.value} {result.detail[:120]}")
    assert not failures, "\n".join(failures)


def test_subset_is_a_few_hundred_cases_of_many_ops(cases):
    names = _subset()
    ops = {node.op_type for name in names for node in cases[name].model.graph.node}
    assert 100 <= len(names) <= 400 and len(ops) >= 80


@pytest.mark.skipif(os.environ.get("KILN_ONNX_CONFORMANCE") != "all",
                    reason="every ONNX node test: set KILN_ONNX_CONFORMANCE=all")
def test_all_cases_never_wrong(cases):
    results = [run_case(case, OPTIONS) for case in cases.values()]
    counts = summarize(results)
    applicable = len(results) - counts[Outcome.NOT_APPLICABLE]
    print(f"{counts[Outcome.PASS]} passing / {applicable} applicable / {len(results)} total")
    bad = [f"{r.name}: {r.outcome.value} {r.detail[:120]}" for r in results
           if r.outcome in (Outcome.WRONG, Outcome.CRASH)]
    assert not bad, "\n".join(bad)
