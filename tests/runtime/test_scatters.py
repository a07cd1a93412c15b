"""Scatters write into their base's memory only where nothing reads that memory after."""

import torch

import kiln
from kiln.engine import IN_PLACE


def _compiled(fn, *args):
    with torch.no_grad():
        compiled = kiln.compile(fn, args)
        expected = fn(*(a.clone() for a in args))
        got = compiled(*args)
        again = compiled(*args)  # a second call: planned memory reused
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, expected, rtol=1e-5, atol=1e-5)
    (graph,) = compiled.report.graphs
    return [k for k in graph.kernels if k.ops == ("call",)]


def relative_positions(q, k, rel):
    """MViT's ``attn[:, :, 1:, 1:] += rel`` on a fresh attention matrix."""
    attn = q @ k.transpose(-1, -2)
    attn[:, :, 1:, 1:] += rel
    return attn.softmax(-1)


def test_nested_box_write_on_an_intermediate_is_in_place():
    q, k, rel = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4), torch.randn(1, 2, 8, 8)
    scatters = _compiled(relative_positions, q, k, rel)
    assert scatters and all(s.decision == IN_PLACE for s in scatters)


def rows(xs):
    """A recurrence's ``out[:, i] = ...``: a chain of select_scatters on one buffer."""
    out = torch.zeros(1, 6, 8)
    for i in range(6):
        out[:, i] = xs[:, i] * 2 + i
    return out.relu()


def test_a_chain_of_row_writes_is_in_place_after_the_first():
    """The first writes into the zeros, a weight once folded: a copy; the rest into it."""
    scatters = _compiled(rows, torch.randn(1, 6, 8))
    assert [s.decision == IN_PLACE for s in scatters] == [False] + [True] * 5


def read_after(q, k, rel):
    """The base itself is read after the scatter (a functional slice_scatter)."""
    attn = q @ k.transpose(-1, -2)
    written = torch.slice_scatter(attn, rel, dim=2, start=1)
    return written.softmax(-1) * attn


def test_a_base_read_after_the_write_keeps_the_copy():
    q, k, rel = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4), torch.randn(1, 2, 8, 9)
    (scatter,) = _compiled(read_after, q, k, rel)
    assert scatter.decision != IN_PLACE


def into_input(x, y):
    return torch.slice_scatter(x, y * 2, dim=1, start=1) + 1


def test_the_caller_s_tensor_is_never_written():
    x, y = torch.randn(3, 5), torch.randn(3, 4)
    before = x.clone()
    (scatter,) = _compiled(into_input, x, y)
    assert scatter.decision != IN_PLACE
    torch.testing.assert_close(x, before, rtol=0, atol=0)


def returned_base(q, k, rel):
    """The written base is the graph's output: it must not be arena memory."""
    attn = q @ k.transpose(-1, -2)
    attn[:, :, 1:, 1:] += rel
    return attn


def test_a_returned_base_survives_the_next_call():
    q, k, rel = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4), torch.randn(1, 2, 8, 8)
    with torch.no_grad():
        compiled = kiln.compile(returned_base, (q, k, rel))
        first = compiled(q, k, rel)
        kept = first.clone()
        compiled(torch.randn_like(q), k, rel)
    torch.testing.assert_close(first, kept, rtol=0, atol=0)
    torch.testing.assert_close(first, returned_base(q, k, rel), rtol=1e-5, atol=1e-5)
