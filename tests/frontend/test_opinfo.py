"""Every OpInfo op of PyTorch that runs on the CPU, through both frontends, matches eager.

CI runs each op's first sample: float32 through both frontends, float64, int64, bool and one
bfloat16 pass through torch.compile. ``KILN_OPINFO=all`` runs every sample of every op, every
dtype through both frontends (about an hour on two cores): run it as its own command,
``KILN_OPINFO=all pytest tests/frontend/test_opinfo.py``.

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

from opinfo_support import FRONTENDS, SKIPS, ops_for, run_case, samples  # noqa: E402

EVERY_SAMPLE = os.environ.get("KILN_OPINFO", "").lower() == "all"

# (dtype, frontends) run in CI; KILN_OPINFO=all runs every dtype through both frontends
DTYPES = (
    (torch.float32, FRONTENDS),
    (torch.float64, FRONTENDS if EVERY_SAMPLE else ("dynamo",)),
    (torch.int64, FRONTENDS if EVERY_SAMPLE else ("dynamo",)),
    (torch.bool, FRONTENDS if EVERY_SAMPLE else ("dynamo",)),
    (torch.bfloat16, FRONTENDS if EVERY_SAMPLE else ("dynamo",)),
)


def _cases():
    for dtype, frontends in DTYPES:
        for op in ops_for(dtype):
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
