"""Boxes from a mask of differing positions."""

from __future__ import annotations

import torch

from kiln.pet.regions import mask_boxes


def test_boxes_cover_exactly_the_marked_positions():
    mask = torch.zeros(5, 6, dtype=torch.bool)
    mask[1:3, 2:5] = True
    mask[4, :] = True
    boxes = mask_boxes(mask)
    assert boxes == [((1, 3), (2, 5)), ((4, 5), (0, 6))]
    rebuilt = torch.zeros_like(mask)
    for (r0, r1), (c0, c1) in boxes:
        rebuilt[r0:r1, c0:c1] = True
    assert torch.equal(rebuilt, mask)


def test_no_marks_no_boxes_and_a_scattered_mask_is_refused():
    assert mask_boxes(torch.zeros(3, 4, dtype=torch.bool)) == []
    checker = (torch.arange(200)[:, None] + torch.arange(200)) % 2 == 0
    assert mask_boxes(checker) is None  # 40,000 cells: too irregular to correct


def test_adjacent_cells_merge_only_when_they_line_up():
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[0:2, 0:2] = True
    mask[2:4, 0:3] = True
    boxes = mask_boxes(mask)
    covered = sum((r1 - r0) * (c1 - c0) for (r0, r1), (c0, c1) in boxes)
    assert covered == int(mask.sum()) and len(boxes) == 2
