"""Attention against key/value heads shared by groups of query heads (grouped-query and
multi-query): the matmuls run per shared head with the group's query rows stacked, not
against the heads repeated by a copy, and give eager's values."""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln.ir import verify
from kiln.ir.fused import attention as fused_attention
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.options import Options
from kiln.passes.grouped_heads import (
    QUERIES_STACKED_BELOW,
    attention_reads_shared_heads,
    bmm_per_shared_head,
    few_queries_per_shared_head,
)
from kiln.passes.pipeline import PIPELINE, run_pipeline


class Attention(torch.nn.Module):
    """Eager attention as HF writes it: ``repeat`` is ``repeat_kv`` (unsqueeze, expand,
    reshape: head g*R + r reads key head g), ``broadcast`` a single key head expanded to all
    (multi-query), ``tile`` key head h % G (not what the pass matches: heads interleave
    otherwise)."""

    def __init__(self, heads: int, kv_heads: int, how: str, fused: bool = False) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.how, self.fused = heads, kv_heads, how, fused

    def _repeat(self, t: torch.Tensor) -> torch.Tensor:
        b, g, s, d = t.shape
        r = self.heads // g
        if self.how == "repeat":
            return t[:, :, None].expand(b, g, r, s, d).reshape(b, g * r, s, d)
        if self.how == "broadcast":
            return t.expand(b, self.heads, s, d)
        return t.repeat(1, r, 1, 1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        # (the mask added before the scale: no chain the attention pass fuses, so the
        # matmuls stay for this pass; ``fused``: after it, as HF writes it, one fused call)
        if self.fused:
            scores = q @ self._repeat(k).transpose(2, 3) * q.shape[-1] ** -0.5 + mask
        else:
            scores = (q @ self._repeat(k).transpose(2, 3) + mask) * q.shape[-1] ** -0.5
        return torch.softmax(scores, -1) @ self._repeat(v)


def _inputs(batch: int, heads: int, kv_heads: int, length: int, keys: int, dim: int):
    gen = torch.Generator().manual_seed(heads * 10 + kv_heads)
    q = torch.randn(batch, heads, length, dim, generator=gen)
    k = torch.randn(batch, kv_heads, keys, dim, generator=gen)
    v = torch.randn(batch, kv_heads, keys, dim, generator=gen)
    mask = torch.zeros(1, 1, length, keys)
    mask[..., -1] = -1e9
    return q, k, v, mask


CASES = [  # batch, heads, kv heads, query rows, keys, head dim, how
    (1, 8, 4, 5, 7, 16, "repeat"), (2, 6, 2, 3, 9, 8, "repeat"), (1, 4, 1, 6, 6, 8, "broadcast"),
    (2, 4, 1, 1, 11, 8, "broadcast"), (1, 1, 1, 4, 4, 8, "repeat")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[6]}-{c[0]}x{c[1]}on{c[2]}")
def test_grouped_heads_run_one_matmul_per_shared_head(case) -> None:
    *sizes, how = case
    batch, heads, kv_heads, length, keys, dim = sizes
    model = Attention(heads, kv_heads, how)
    inputs = _inputs(*sizes)
    compiled = kiln.compile(model, inputs, Options(strict=True))
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
    graph = compiled.report.graphs[0].details.optimized
    contractions = [n for n in graph.nodes if n.op in (Op.BMM, Op.MM)]
    assert len(contractions) == 2
    repeats = heads // kv_heads
    if repeats == 1:
        assert [n.type.shape[0] for n in contractions] == [batch * heads] * 2
        return
    shared = batch * kv_heads
    for n in contractions:  # R query heads' rows stacked against each shared head
        assert n.type.shape[-2] == repeats * length
        assert n.op is (Op.BMM if shared > 1 else Op.MM)
        assert shared == 1 or n.type.shape[0] == shared
    assert not any(n.op is Op.EXPAND for n in graph.nodes)


def test_heads_repeated_in_another_order_are_left_as_they_are() -> None:
    """``repeat`` tiles the key heads (query head h reads key head h % G): no group of
    consecutive query heads shares one, so the matmuls stay per query head."""
    model = Attention(8, 4, "tile")
    inputs = _inputs(1, 8, 4, 5, 7, 16)
    compiled = kiln.compile(model, inputs, Options(strict=True))
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
    graph = compiled.report.graphs[0].details.optimized
    assert [n.type.shape for n in graph.nodes if n.op is Op.BMM] == [(8, 5, 7), (8, 5, 16)]


def test_the_pass_computes_what_the_graph_did_with_nan_and_infinities() -> None:
    """On the captured graph itself (the pass's own input), special values included."""
    model = Attention(8, 2, "repeat")
    inputs = list(_inputs(1, 8, 2, 3, 5, 8))
    captured = kiln.compile(model, tuple(inputs)).report.graphs[0].details.captured
    graph, _, _ = run_pipeline(captured, Options(), PIPELINE[:4])  # (up to simplify)
    rewritten = bmm_per_shared_head(graph)
    verify(rewritten)
    assert rewritten is not graph
    inputs[0][0, 3, 1, 2], inputs[1][0, 1, 4, 0], inputs[2][0, 0, 2, 5] = \
        float("nan"), float("inf"), float("-inf")
    assert [n.type.shape for n in rewritten.nodes if n.op is Op.BMM] == [(2, 12, 5), (2, 12, 8)]
    for want, got in zip(interpret(graph, inputs), interpret(rewritten, inputs)):
        torch.testing.assert_close(got, want, equal_nan=True)


def _attention_calls(graph) -> list:  # noqa: ANN001
    return [n for n in graph.nodes if n.op is Op.CALL
            and n.attrs.target is fused_attention._opoverload]


@pytest.mark.parametrize("case", [CASES[0], (1, 4, 1, 6, 6, 16, "broadcast")],
                         ids=lambda c: f"{c[6]}-{c[0]}x{c[1]}on{c[2]}")
def test_a_fused_attention_reads_the_shared_heads(case) -> None:
    """The attention pass's fused call takes the G key and value heads before ``repeat_kv``
    (or the one broadcast head); its generated kernel has each query head read its group's,
    as eager's copies did. (Values of whole vectors: the pass then fuses, for the kernel.)"""
    *sizes, how = case
    batch, heads, kv_heads, length, keys, dim = sizes
    model = Attention(heads, kv_heads, how, fused=True)
    inputs = _inputs(*sizes)
    # (every checked kernel used, not only where it measures faster: the kernel is tested)
    compiled = kiln.compile(model, inputs, Options(strict=True, measure_kernels=False))
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
    report = compiled.report.graphs[0]
    assert any(k.kind == "generated" and "call" in k.ops for k in report.kernels)
    graph = report.details.optimized
    (call,) = _attention_calls(graph)
    assert [v.type.shape[1] for v in call.inputs[:3]] == [heads, kv_heads, kv_heads]
    assert not any(n.op is Op.EXPAND for n in graph.nodes)


def test_a_fused_attention_keeps_heads_repeated_in_another_order() -> None:
    model = Attention(8, 4, "tile", fused=True)
    inputs = _inputs(1, 8, 4, 5, 7, 16)
    compiled = kiln.compile(model, inputs, Options(strict=True))
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
    (call,) = _attention_calls(compiled.report.graphs[0].details.optimized)
    assert [v.type.shape[1] for v in call.inputs[:3]] == [8, 8, 8]


def _after_the_attention_pass(model: torch.nn.Module, inputs) -> object:  # noqa: ANN001
    """The model's graph as the pipeline leaves it after the attention pass."""
    captured = kiln.compile(model, tuple(inputs)).report.graphs[0].details.captured
    names = [p.name for p in PIPELINE]
    graph, _, _ = run_pipeline(captured, Options(), PIPELINE[:names.index("attention") + 1])
    return graph


def test_the_shared_heads_of_a_fused_attention_compute_what_the_graph_did() -> None:
    """On the graph as the attention pass leaves it (its views not yet simplified), special
    values included: the call on the shared heads, against the call on the repeated ones."""
    model = Attention(8, 2, "repeat", fused=True)
    inputs = list(_inputs(1, 8, 2, 3, 5, 16))
    graph = _after_the_attention_pass(model, inputs)
    rewritten = attention_reads_shared_heads(graph)
    verify(rewritten)
    (call,) = _attention_calls(rewritten)
    assert [v.type.shape[1] for v in call.inputs[:3]] == [8, 2, 2]
    inputs[0][0, 3, 1, 2], inputs[1][0, 1, 4, 0], inputs[2][0, 0, 2, 5] = \
        float("nan"), float("inf"), float("-inf")
    for want, got in zip(interpret(graph, inputs), interpret(rewritten, inputs)):
        torch.testing.assert_close(got, want, equal_nan=True)
    finite = list(_inputs(1, 8, 2, 3, 5, 16))
    for want, got in zip(interpret(graph, finite), interpret(rewritten, finite)):
        torch.testing.assert_close(got, want)


class SdpaAttention(Attention):
    """HF's sdpa path with a padding mask: ``repeat_kv``, then the library's fused call."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            q, self._repeat(k), self._repeat(v), attn_mask=mask)


@pytest.mark.parametrize("how", ["repeat", "broadcast"])
def test_the_librarys_fused_attention_reads_the_shared_heads(how: str) -> None:
    heads, kv_heads = 8, 1 if how == "broadcast" else 2
    model = SdpaAttention(heads, kv_heads, how)
    inputs = _inputs(2, heads, kv_heads, 5, 7, 16)
    compiled = kiln.compile(model, inputs, Options(strict=True))
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
    graph = compiled.report.graphs[0].details.optimized
    calls = [n for n in graph.nodes if n.op is Op.CALL]
    assert [[v.type.shape[1] for v in n.inputs[:3]] for n in calls] == [[heads, kv_heads,
                                                                         kv_heads]]
    assert not any(n.op is Op.EXPAND for n in graph.nodes)


@pytest.mark.parametrize("case", [(1, 8, 4, 1, 9, 16, "repeat"), (2, 8, 1, 1, 7, 16, "broadcast"),
                                  (1, 6, 2, 3, 9, 16, "repeat")],
                         ids=["decode-8on4", "decode-mq-batch2", "3-tokens-6on2"])
def test_a_few_queries_stack_the_heads_of_a_group(case) -> None:
    """A decode step (one query a head, or a few) attends as the G shared heads with their
    R query heads as queries: the generated kernel's lanes run over queries, and one query
    a head filled 1 of 32. The mask, one row for every head and query, stays as it is."""
    *sizes, how = case
    batch, heads, kv_heads, length, keys, dim = sizes
    model = Attention(heads, kv_heads, how, fused=True)
    *inputs, mask = _inputs(*sizes)
    inputs = (*inputs, mask[:, :, :1])  # (one row for every query: padding)
    compiled = kiln.compile(model, inputs, Options(strict=True, measure_kernels=False))
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
    report = compiled.report.graphs[0]
    assert any(k.kind == "generated" and "call" in k.ops for k in report.kernels)
    (call,) = _attention_calls(report.details.optimized)
    stacked = heads // kv_heads * length
    assert [tuple(v.type.shape) for v in call.inputs[:3]] == [
        (batch, kv_heads, stacked, dim), (batch, kv_heads, keys, dim),
        (batch, kv_heads, keys, dim)]


def test_stacked_queries_compute_what_the_graph_did_and_per_query_masks_stay() -> None:
    model = Attention(8, 2, "repeat", fused=True)
    inputs = list(_inputs(1, 8, 2, 1, 5, 16))
    graph = attention_reads_shared_heads(_after_the_attention_pass(model, inputs))
    rewritten = few_queries_per_shared_head(graph)
    verify(rewritten)
    (call,) = _attention_calls(rewritten)
    assert call.inputs[0].type.shape == (1, 2, 4, 16)
    inputs[0][0, 3, 0, 2], inputs[1][0, 1, 4, 0], inputs[2][0, 0, 2, 5] = \
        float("nan"), float("inf"), float("-inf")
    inputs[3][..., 1] = float("-inf")
    for want, got in zip(interpret(graph, inputs), interpret(rewritten, inputs)):
        torch.testing.assert_close(got, want, equal_nan=True)
    # a mask per head, or as many queries as QUERIES_STACKED_BELOW: the call as it was
    per_head = list(_inputs(1, 8, 2, 1, 5, 16))
    per_head[3] = torch.zeros(1, 8, 1, 5)
    for case in (per_head, _inputs(1, 8, 2, QUERIES_STACKED_BELOW, 5, 16)):
        graph = attention_reads_shared_heads(_after_the_attention_pass(model, case))
        (call,) = _attention_calls(few_queries_per_shared_head(graph))
        assert call.inputs[0].type.shape[1] == 8
