"""PET's worked examples, each corrected and compared with the original on float inputs with
NaN/inf, at boundary sizes: 1, odd, smaller than the kernel."""

from __future__ import annotations

import pytest
from pet_cases import (
    assert_fixed_equals_original,
    conv_graph,
    fixed_graph,
    linear_graph,
    mutant_named,
    only_subprogram,
)

from kiln.pet.regions import differing_regions


@pytest.mark.parametrize(("n", "h", "w", "kernel", "pad"), [
    (2, 6, 5, 3, 1), (3, 5, 7, 3, 1), (2, 1, 3, 3, 1), (4, 2, 2, 5, 2), (2, 7, 1, 1, 0)])
@pytest.mark.parametrize("axis", ["h", "w"])
def test_batch_merged_into_a_spatial_axis_is_corrected_on_the_image_seams(n, h, w, kernel,
                                                                            pad, axis):
    sub = only_subprogram(conv_graph(n, 3, h, w, k=4, kernel=kernel, pad=pad))
    mutant = mutant_named(sub, f"merge_batch({axis})")
    regions = differing_regions(sub.graph, mutant.graph)
    assert regions is not None
    size, other = (h, w) if axis == "h" else (w, h)
    # rows within `pad` of a seam read the neighbouring image through the kernel
    seam_rows = sum(len({r for r in range(size) if (i > 0 and r < pad)
                         or (i < n - 1 and r >= size - pad)}) for i in range(n))
    assert regions.differing == seam_rows * 4 * other
    assert regions.equivalent == (pad == 0)
    assert_fixed_equals_original(sub, fixed_graph(sub, mutant))


def test_batch_merge_boxes_are_the_two_seam_bands():
    sub = only_subprogram(conv_graph(4, 2, 6, 5))
    regions = differing_regions(sub.graph, mutant_named(sub, "merge_batch(h)").graph)
    assert regions.boxes == ((((0, 3), (0, 3), (5, 6), (0, 5)),
                              ((1, 4), (0, 3), (0, 1), (0, 5))),)
    assert regions.miss_bound() < 1e-6


@pytest.mark.parametrize(("h", "stride", "residual"), [
    (8, 1, False), (7, 1, False), (2, 1, False), (12, 2, False), (4, 2, False), (8, 1, True),
    (3, 1, True)])
def test_spatial_split_without_halo_is_corrected_at_the_cut(h, stride, residual):
    sub = only_subprogram(conv_graph(1, 3, h, 5, k=3 if residual else 4, stride=stride,
                                     relu_residual=residual))
    mutant = mutant_named(sub, "split(2, 2, naive)")
    regions = differing_regions(sub.graph, mutant.graph)
    assert not regions.equivalent  # the rows next to the cut saw zero padding
    (box,) = regions.boxes[0]
    cut = sub.graph.outputs[0].type.shape[2] // 2
    assert box[2][0] <= cut <= box[2][1] and box[2][1] - box[2][0] <= 2
    assert_fixed_equals_original(sub, fixed_graph(sub, mutant))


@pytest.mark.parametrize("name", ["split(1, 2, exact)", "split(2, 2, exact)",
                                  "split(3, 2, exact)"])
def test_exact_splits_need_no_correction(name):
    sub = only_subprogram(conv_graph(1, 3, 5, 3, k=6, kernel=3, relu_residual=False))
    mutant = mutant_named(sub, name)
    assert differing_regions(sub.graph, mutant.graph).equivalent
    assert_fixed_equals_original(sub, mutant.graph)


@pytest.mark.parametrize(("m", "k", "n", "name"), [
    (13, 7, 5, "pad(0, 8)"), (1, 4, 9, "split(1, 2, exact)"), (61, 3, 30, "pad(1, 8)"),
    (9, 5, 29, "pad(1, 8)"), (197, 16, 8, "pad(0, 8)")])
def test_gemm_padded_or_split_then_sliced_back(m, k, n, name):
    sub = only_subprogram(linear_graph(m, k, n))
    mutant = mutant_named(sub, name)
    assert differing_regions(sub.graph, mutant.graph).equivalent
    assert_fixed_equals_original(sub, mutant.graph)


def test_a_wrong_mutant_is_caught():
    """A mutant that reads the wrong input rows differs almost everywhere: the tests say so."""
    sub = only_subprogram(conv_graph(2, 3, 4, 4))
    mutant = mutant_named(sub, "merge_batch(h)")
    bad = differing_regions(sub.graph, mutant_named(sub, "merge_batch(w)").graph)
    good = differing_regions(sub.graph, mutant.graph)
    assert bad.boxes != good.boxes
