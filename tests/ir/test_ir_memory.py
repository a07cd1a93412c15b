"""kiln.ir.memory: a view laid out in the order of its memory, where it is a permutation."""

from __future__ import annotations

import torch

from kiln.ir.memory import in_memory_order


def test_a_permuted_tensor_is_laid_out_contiguous_over_the_same_memory() -> None:
    x = torch.randn(2, 5, 3, 4)
    for view in (x.transpose(1, 2), x.permute(3, 0, 2, 1), x.mT):
        laid = in_memory_order(view)
        assert laid.is_contiguous() and laid.data_ptr() == view.data_ptr()
        assert torch.equal(laid.reshape(-1).sort().values, view.reshape(-1).sort().values)


def test_a_view_that_no_permutation_makes_contiguous_is_itself() -> None:
    x = torch.randn(6, 8)
    for view in (x[:, ::2], x[1:4, 2:], x.t()[::3]):
        assert in_memory_order(view) is view
    assert in_memory_order(x).is_contiguous()
