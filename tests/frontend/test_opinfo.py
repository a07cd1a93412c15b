"""Every OpInfo op of PyTorch that runs on the CPU, through both frontends, matches eager.

CI runs each op's first sample: float32 for every op through both frontends; float64, int64,
bool and bfloat16 through torch.compile for the ops kiln converts to its own IR (the others
stay calls of the same ATen op, so their dtype is ATen's business). ``KILN_OPINFO=all`` runs
every sample of every op in every dtype through both frontends (hours on two cores): run it
as its own command, ``KILN_OPINFO=all pytest tests/frontend/test_opinfo.py``.

A fallback to eager fails a case unless its reason is one listed in
``opinfo_support.FALLBACK_REASONS``; the op's own skips and the ops with undefined outputs
(``empty*``) are not run, and every other skip is in ``opinfo_support.SKIPS`` with its reason.
"""

import logging
import os
import warnings

import pytest
import torch

pytest.importorskip("expecttest")  # torch's OpInfo database imports it

from opinfo_support import (  # noqa: E402
    FRONTENDS,
    SKIPS,
    kiln_converts,
    ops_for,
    run_case,
    samples,
)

EVERY_SAMPLE = os.environ.get("KILN_OPINFO", "").lower() == "all"


def _every_op(op):
    return True


# dtype -> (frontends, which ops) in CI; KILN_OPINFO=all: every op through both frontends
DTYPES = {
    torch.float32: (FRONTENDS, _every_op),
    torch.float64: (("dynamo",), kiln_converts),
    torch.int64: (("dynamo",), kiln_converts),
    torch.bool: (("dynamo",), kiln_converts),
    torch.bfloat16: (("dynamo",), kiln_converts),
}


def _cases():
    for dtype, (frontends, chosen) in DTYPES.items():
        if EVERY_SAMPLE:
            frontends, chosen = FRONTENDS, _every_op
        for op in filter(chosen, ops_for(dtype)):
            for frontend in frontends:
                name = f"{op.name}-{op.variant_test_name}" if op.variant_test_name else op.name
                marks = ()
                if (op.name, frontend) in SKIPS:
                    marks = pytest.mark.skip(reason=SKIPS[op.name, frontend])
                yield pytest.param(op, dtype, frontend, marks=marks,
                                   id=f"{name}-{str(dtype).removeprefix('torch.')}-{frontend}")


@pytest.fixture(autouse=True)
def _quiet():
    logger = logging.getLogger("kiln")
    level = logger.level
    logger.setLevel(logging.ERROR)  # a listed fallback warns; the test decides
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    logger.setLevel(level)
    torch._dynamo.reset()


@pytest.mark.parametrize(("op", "dtype", "frontend"), list(_cases()))
def test_op_matches_eager(op, dtype, frontend):
    ran = 0
    failures = []
    for i, sample in enumerate(samples(op, dtype, EVERY_SAMPLE)):
        try:
            result = run_case(op, sample, frontend)
        except Exception as err:  # noqa: BLE001 - every sample runs; all failures are listed
            failures.append(f"sample {i}: {type(err).__name__}: {err}")
            continue
        ran += result is not None
    assert not failures, "\n".join(failures)
    if ran == 0:
        pytest.skip("eager raises on every sample (they test error paths)")
