"""Comparing outputs: bit-exact with NaN payloads free, CLOSE with the IEEE classes kept, the
float64 twin marking ill-conditioned elements, NEAR leaving zero signs free."""

from __future__ import annotations

import math

import torch

from kiln.fuzz.compare import Strength, compare

nan, inf = math.nan, math.inf
EXACT, CLOSE, NEAR = Strength.EXACT, Strength.CLOSE, Strength.NEAR


def t(*values: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def test_exact_is_bitwise_but_nan_payloads_are_free():
    assert compare(t(1.0, nan, -0.0), t(1.0, nan, -0.0), EXACT) is None
    negative_nan = -t(nan)
    assert compare(torch.cat([negative_nan, t(2.0)]), t(nan, 2.0), EXACT) is None
    assert "values differ" in compare(t(0.0), t(-0.0), EXACT)
    one_ulp = torch.nextafter(t(1.0), t(2.0))
    assert "values differ" in compare(one_ulp, t(1.0), EXACT)
    assert "NaN positions" in compare(t(nan, 1.0), t(1.0, 1.0), EXACT)


def test_types_and_shapes_must_match():
    assert "expected" in compare(t(1.0), t(1.0, dtype=torch.float64), EXACT)
    assert "expected" in compare(t(1.0, 2.0), t(1.0), EXACT)
    assert "tensor" in compare(3.0, t(1.0), EXACT)
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 2]), CLOSE) is None
    assert compare(torch.tensor([1, 3]), torch.tensor([1, 2]), CLOSE) is not None


def test_close_allows_rounding_not_more():
    assert compare(t(1.00001, 2.0), t(1.0, 2.0), CLOSE) is None
    assert "beyond rtol" in compare(t(1.01, 2.0), t(1.0, 2.0), CLOSE)
    # relative to the tensor's largest magnitude: a sum rounds relative to its terms
    assert compare(t(1e-3 + 1e-2, 1e3), t(1e-3, 1e3), CLOSE) is None


def test_close_keeps_nan_inf_and_zero_signs():
    assert "NaN positions" in compare(t(0.0), t(nan), CLOSE)
    assert "inf positions" in compare(t(inf), t(1e34), CLOSE)
    assert "inf positions" in compare(t(-inf), t(inf), CLOSE)
    assert "zero signs" in compare(t(0.0), t(-0.0), CLOSE)
    big = torch.finfo(torch.float32).max
    assert compare(t(inf), t(big), CLOSE) is None  # overflow decided by rounding
    assert compare(t(-inf), t(big), CLOSE) is not None


def test_near_leaves_zero_signs_free():
    assert compare(t(0.0, 1.0), t(-0.0, 1.0), NEAR) is None
    assert compare(t(nan, 1.0), t(0.0, 1.0), NEAR) is not None


def test_the_float64_twin_marks_ill_conditioned_elements():
    # float32 overflowed inside a sum where float64 did not: either answer is rounding's
    got, expected = t(5.0, 1.0), t(nan, 1.0)
    assert compare(got, expected, CLOSE) is not None
    assert compare(got, expected, CLOSE, wide=t(5.0, 1.0, dtype=torch.float64)) is None
    # a well-conditioned NaN stays a NaN
    assert compare(got, expected, CLOSE, wide=t(nan, 1.0, dtype=torch.float64)) is not None
    # the reference's own error widens the tolerance
    assert compare(t(1.1), t(1.0), CLOSE, wide=t(1.2, dtype=torch.float64)) is None


def test_unchecked_checks_types_only():
    assert compare(t(1.0), t(2.0), Strength.UNCHECKED) is None
    assert compare(t(1.0), t(2.0, 3.0), Strength.UNCHECKED) is not None


def test_near_lets_a_sum_of_infinities_end_in_any_non_finite_value():
    assert compare(t(nan, 1.0), t(inf, 1.0), NEAR) is None
    assert compare(t(-inf, 1.0), t(inf, 1.0), NEAR) is None
    assert compare(t(nan, 1.0), t(inf, 1.0), CLOSE) is not None
    assert compare(t(5.0, 1.0), t(inf, 1.0), NEAR) is not None


def test_a_float64_output_computed_from_float32_values_gets_float32s_tolerance():
    from kiln.fuzz.compare import rtol_of
    from kiln.ir import parse_graph

    graph = parse_graph("""graph(%x: f32[5], %y: f64[5]) {
  %e = erf(%x) : f32[5]
  %m = minimum(%e, %y) : f64[5]
  %z = exp(%y) : f64[5]
  return %m, %z
}""")
    mixed, wide_only = graph.outputs
    assert rtol_of(graph, mixed) == 1e-4  # erf ran in float32: one ulp there is 6e-8
    assert rtol_of(graph, wide_only) == 1e-9
    one_f32_ulp = t(0.842700719833374, dtype=torch.float64)
    expected = t(0.8427007794380188, dtype=torch.float64)
    assert "beyond rtol" in compare(one_f32_ulp, expected, CLOSE)
    assert compare(one_f32_ulp, expected, CLOSE, rtol=rtol_of(graph, mixed)) is None
