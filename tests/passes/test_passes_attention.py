"""The decomposed attention chain becomes one fused library call only where that is safe,
and computes the same values (NaN and infinities included)."""

from __future__ import annotations

import pytest
import torch

from kiln.ir.attrs import PermuteAttrs, ShapeAttrs, SoftmaxAttrs
from kiln.ir.builder import GraphBuilder
from kiln.ir.interp import interpret
from kiln.ir.ops import Op
from kiln.ir.types import DType, TensorType
from kiln.ir.verify import verify
from kiln.options import Options
from kiln.passes.attention import fuse_attention

B, H, L, S, E = 2, 3, 5, 7, 4
OPTIONS = Options(measure_kernels=False)


def _attention(mask: torch.Tensor | None = None, mask_dims: tuple[int, ...] | None = None,
               scale: float = 0.5, softmax_is_output: bool = False, v_depth: int = E,
               fill: tuple | None = None, scale_as: str = "number"):
    """softmax(Q Kᵀ · scale + mask) V, as capture leaves it: views, a permute, two bmms;
    V's rows ``v_depth`` long; the mask a constant, or an input of ``mask_dims``. With
    ``fill`` = (condition, value, the fill first) a ``masked_fill`` takes the add's place:
    ``where(C, value, scores)``, or ``where(C, scores, value)``; C a bool constant, or an
    input of the dims given, and the value a constant. ``scale_as`` "constant": the scale a
    one-element constant, on the left of the product (as the ONNX importer leaves it)."""
    b = GraphBuilder()
    q = b.input("q", TensorType((B, H, L, E), DType.F32))
    k = b.input("k", TensorType((B, H, S, E), DType.F32))
    v = b.input("v", TensorType((B, H, S, v_depth), DType.F32))
    kt = b.op(Op.PERMUTE, k, attrs=PermuteAttrs((0, 1, 3, 2)))
    scores = b.op(Op.BMM, b.op(Op.VIEW, q, attrs=ShapeAttrs((B * H, L, E))),
                  b.op(Op.VIEW, kt, attrs=ShapeAttrs((B * H, E, S))))
    x = b.op(Op.VIEW, scores, attrs=ShapeAttrs((B, H, L, S)))
    x = b.op(Op.MUL, x, b.scalar(scale)) if scale_as == "number" \
        else b.op(Op.MUL, b.constant("scale", torch.tensor(scale)), x)
    if fill is not None:
        cond, value, fill_first = fill
        c = b.constant("cond", cond) if isinstance(cond, torch.Tensor) \
            else b.input("c", TensorType(cond, DType.BOOL))
        value = b.constant("fill", torch.tensor(value))
        x = b.op(Op.WHERE, c, value, x) if fill_first else b.op(Op.WHERE, c, x, value)
    elif mask_dims is not None:
        x = b.op(Op.ADD, b.input("m", TensorType(mask_dims, DType.F32)), x)  # (either side)
    elif mask is not None:
        x = b.op(Op.ADD, x, b.constant("mask", mask))
    p = b.op(Op.SOFTMAX, x, attrs=SoftmaxAttrs(3))
    out = b.op(Op.BMM, b.op(Op.VIEW, b.op(Op.CLONE, p), attrs=ShapeAttrs((B * H, L, S))),
               b.op(Op.VIEW, v, attrs=ShapeAttrs((B * H, S, v_depth))))
    out = b.op(Op.VIEW, out, attrs=ShapeAttrs((B, H, L, v_depth)))
    return b.build(out, p) if softmax_is_output else b.build(out)


def _causal() -> torch.Tensor:
    return torch.full((L, S), -float("inf")).triu(1)[None, None]


def _inputs(graph, specials: bool = False):
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(n.type.shape, generator=gen) for n in graph.inputs]
    if specials:
        xs[0][0, 1, 2, 3] = float("nan")
        xs[1][1, 0, 4, 0] = float("inf")
        xs[2][0, 2, 1, 1] = -float("inf")
    return xs


@pytest.mark.parametrize("mask", [None, "causal", "finite"])
def test_the_chain_becomes_one_call_with_the_same_values(mask):
    tensor = {None: None, "causal": _causal(),
              "finite": torch.randn(1, H, L, S, generator=torch.Generator().manual_seed(1))}
    graph = _attention(tensor[mask])
    fused = fuse_attention(graph, OPTIONS)
    calls = [n for n in fused.nodes if n.op is Op.CALL]
    assert len(calls) == 1 and not any(n.op is Op.SOFTMAX for n in fused.nodes)
    assert calls[0].attrs.args[4] == 0.5  # the scale
    for specials in (False, True):
        xs = _inputs(graph, specials)
        want, got = interpret(graph, xs)[0], interpret(fused, xs)[0]
        assert torch.equal(want.isnan(), got.isnan())
        finite = want.isfinite()
        torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fill", [False, True], ids=["added mask", "masked_fill"])
def test_a_scale_held_by_a_constant_is_read_as_the_scale(fill):
    """The ONNX importer leaves the scale a one-element constant (on either side of the
    product): the chain fuses as with a Python number, the call's scale that constant."""
    graph = _attention(_causal(), fill=(~_tril(), -float("inf"), True) if fill else None,
                       scale_as="constant")
    fused = fuse_attention(graph, OPTIONS)
    calls = [n for n in fused.nodes if n.op is Op.CALL]
    assert len(calls) == 1 and calls[0].attrs.args[4] == 0.5
    xs = _inputs(graph)
    torch.testing.assert_close(interpret(fused, xs)[0], interpret(graph, xs)[0], rtol=1e-5,
                               atol=1e-6)


def test_values_longer_than_the_keys_keep_their_length():
    """LeViT's values are twice as long as its queries and keys (attention ratio 2): the
    fused call's V and output take V's length (they once took Q's, and the compiled model
    failed at its first call on a view of the wrong size)."""
    graph = _attention(_causal(), v_depth=2 * E)
    fused = fuse_attention(graph, OPTIONS)
    verify(fused)
    assert any(n.op is Op.CALL for n in fused.nodes)
    xs = _inputs(graph)
    assert interpret(fused, xs)[0].shape == (B, H, L, 2 * E)
    torch.testing.assert_close(interpret(fused, xs)[0], interpret(graph, xs)[0], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("case", ["fully masked row", "softmax read", "+inf in the mask"])
def test_unsafe_chains_stay_as_they_are(case):
    if case == "fully masked row":
        mask = _causal().clone()
        mask[..., 2, :] = -float("inf")  # the fused kernel gives 0 there, the chain NaN
        graph = _attention(mask)
    elif case == "+inf in the mask":
        mask = _causal().clone()
        mask[..., 1, 0] = float("inf")
        graph = _attention(mask)
    else:
        graph = _attention(softmax_is_output=True)
    assert fuse_attention(graph, OPTIONS) is graph


@pytest.mark.parametrize("dims", [(1, 1, L, S), (B, 1, 1, S), (L, S)],
                         ids=["1x1xLxS", "Bx1x1xS", "LxS"])
def test_a_mask_computed_at_run_time_is_checked_each_call(dims):
    """A mask from the graph's inputs (a padding mask, a per-query one) is fused too: the call
    checks it each time, and where it has a NaN, a +inf or a row of -inf only (the fused
    kernel gives 0 there, the chain NaN) computes the decomposition. Every case gives the
    chain's values, NaN where the chain has them."""
    graph = _attention(mask_dims=dims)
    fused = fuse_attention(graph, OPTIONS)
    calls = [n for n in fused.nodes if n.op is Op.CALL]
    assert len(calls) == 1 and not any(n.op is Op.SOFTMAX for n in fused.nodes)
    for case in ("finite", "padding", "every key masked", "+inf", "nan"):
        xs = _inputs(graph)
        mask = xs[3]
        if case == "padding":
            mask[..., S - 2:] = -float("inf")
        elif case == "every key masked":  # (one query's row, or a batch's every row)
            mask[..., 1 if dims[-2] > 1 else 0, :] = -float("inf")
        elif case == "+inf":
            mask[..., 0, 1] = float("inf")
        elif case == "nan":
            mask[..., 0, 2] = float("nan")
        want, got = interpret(graph, xs)[0], interpret(fused, xs)[0]
        assert bool(want.isnan().any()) == (case in ("every key masked", "+inf", "nan"))
        assert torch.equal(want.isnan(), got.isnan())
        finite = want.isfinite()
        torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-6)


def _tril() -> torch.Tensor:  # True where a query attends (nanoGPT's buffer, as bool)
    return torch.ones(L, S, dtype=torch.bool).tril()[None, None]


@pytest.mark.parametrize("form", ["masked_fill(~tril)", "where(tril, scores, -inf)",
                                  "run-time condition"])
def test_a_fill_with_minus_inf_becomes_a_bool_mask_that_selects(form):
    """nanoGPT's ``att.masked_fill(bias == 0, -inf)`` and ``torch.where(tril, att, -inf)``
    fuse, the call reading a bool mask that is True where a query attends (a constant inverted
    at compile time; a condition computed at run time through a logical_not). It selects as
    the fill does: a +inf or a NaN in a masked score changes nothing (an added -inf would give
    NaN there), and a row that attends no key is NaN as in the chain."""
    fill = {"masked_fill(~tril)": (~_tril(), -float("inf"), True),
            "where(tril, scores, -inf)": (_tril(), -float("inf"), False),
            "run-time condition": ((B, 1, L, S), -float("inf"), True)}[form]
    graph = _attention(fill=fill)
    fused = fuse_attention(graph, OPTIONS)
    verify(fused)
    calls = [n for n in fused.nodes if n.op is Op.CALL]
    assert len(calls) == 1 and not any(n.op in (Op.SOFTMAX, Op.WHERE) for n in fused.nodes)
    mask = calls[0].inputs[3]
    assert mask.type.dtype is DType.BOOL
    if form == "run-time condition":
        assert mask.node.op is Op.LOGICAL_NOT
    else:
        assert torch.equal(fused.constant(mask.node), _tril())
    for case in ("finite", "+inf key behind the mask", "nan key behind the mask",
                 "a row that attends no key"):
        xs = _inputs(graph)
        if form == "run-time condition":
            xs[3] = ~_tril().expand(B, 1, L, S).clone()
        if case == "+inf key behind the mask":
            xs[1][0, 1, S - 1, 0] = float("inf")  # (the last key: no query attends it)
        elif case == "nan key behind the mask":
            xs[1][1, 2, S - 1, 3] = float("nan")
        elif case == "a row that attends no key":
            if form != "run-time condition":
                continue
            xs[3][1, 0, 2] = True
        want, got = interpret(graph, xs)[0], interpret(fused, xs)[0]
        nan_rows = want.isnan().any(-1)
        assert bool(nan_rows.any()) == (case == "a row that attends no key")
        assert torch.equal(want.isnan(), got.isnan())
        torch.testing.assert_close(got[~nan_rows], want[~nan_rows], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["a finite fill", "a row that attends no key",
                                  "a fill of +inf"])
def test_other_fills_stay_as_they_are(case):
    """A fill with a finite number (a masked key then still counts: HF's finfo.min, whose
    empty rows are a uniform average), a constant condition that leaves a query no key, and
    a fill of +inf keep their chain."""
    if case == "a finite fill":
        graph = _attention(fill=(~_tril(), -1e9, True))
    elif case == "a row that attends no key":
        cond = ~_tril()
        cond[..., 3, :] = True
        graph = _attention(fill=(cond, -float("inf"), True))
    else:
        graph = _attention(fill=(~_tril(), float("inf"), True))
    assert fuse_attention(graph, OPTIONS) is graph


def test_the_guard_takes_the_decomposition_where_scores_could_overflow():
    from kiln.ir.fused import attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=gen) for _ in range(3))
    q[0, 0, 0] = 3e38  # finite, but q·k overflows float32
    want = torch.softmax(q @ k.transpose(-1, -2) * 0.5, -1) @ v
    got = attention(q, k, v, None, 0.5)
    assert torch.equal(want.isnan(), got.isnan()) and bool(got.isnan().any())
    torch.testing.assert_close(got[~got.isnan()], want[~want.isnan()])


@pytest.mark.parametrize("operand", [0, 1, 2], ids=["q", "k", "v"])
@pytest.mark.parametrize("special", [float("nan"), float("inf"), -float("inf")],
                         ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "causal"])
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "heads transposed"])
def test_one_special_value_in_any_operand_takes_the_decomposition(operand, special, masked,
                                                                  transposed):
    """A single NaN or infinity in q, k or v alone gives the decomposition's values. (The
    fused kernel gives 0 for a row a NaN in q makes NaN, so the guard must see each operand;
    with this torch, SDPA matches the decomposition on specials in v, which the guard still
    checks: a kernel that skips masked blocks would not.)"""
    from kiln.ir.fused import attention

    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(1, 3, 2, 4, generator=gen).transpose(1, 2) if transposed  # (the guard
          else torch.randn(1, 2, 3, 4, generator=gen) for _ in range(3)]  # reads it in order)
    xs[operand][0, 1, 2, 1] = special  # (in v: a key the causal mask hides from rows 0, 1)
    q, k, v = xs
    mask = torch.full((3, 3), -float("inf")).triu(1)[None, None] if masked else None
    scores = q @ k.transpose(-1, -2) * 0.5
    want = torch.softmax(scores + mask if masked else scores, -1) @ v
    got = attention(q, k, v, mask, 0.5)
    assert not bool(want.isfinite().all())
    assert torch.equal(want.isnan(), got.isnan())
    finite = want.isfinite()
    assert torch.equal(got[~finite & ~want.isnan()], want[~finite & ~want.isnan()])
    torch.testing.assert_close(got[finite], want[finite])


def test_empty_operands_give_an_empty_result():
    from kiln.ir.fused import attention

    q, k, v = torch.randn(1, 2, 0, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    assert attention(q, k, v, None, 0.5).shape == (1, 2, 0, 4)


@pytest.mark.parametrize("v_depth", [16, 12])
def test_timing_decides_only_where_no_generated_kernel_may_run_the_call(v_depth, monkeypatch):
    """With the op timings saying the chain is faster, a call kiln's generated attention may
    run (whole vectors of V; a constant mask) is still made: the kernel stage times that
    kernel against ATen's; one with a partial vector of V, or with generated kernels off,
    keeps the chain."""
    monkeypatch.setattr("kiln.passes.attention.MARGIN", 0.0)  # (the call never measures faster)
    graph = _attention(_causal(), v_depth=v_depth)
    measured = Options(measure_kernels=True)
    for options, fused in ((measured, v_depth == 16),
                           (Options(measure_kernels=True, generated_kernels=False), False)):
        calls = [n for n in fuse_attention(graph, options).nodes if n.op is Op.CALL]
        assert len(calls) == (1 if fused else 0)
