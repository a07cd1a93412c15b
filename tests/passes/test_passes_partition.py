"""The partitioner: which nodes form one generated kernel, on small hand-built graphs."""

from __future__ import annotations

import pytest
import torch

import kiln_test_support as support
from kiln.ir import parse_graph, verify
from kiln.passes.partition import gather, partition, without_last


def _weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"w": torch.randn(16, 16), "g": torch.randn(16), "b": torch.randn(16),
            "mask": torch.rand(1, 1, 8, 8) > 0.5, "neg": torch.tensor(-1e9)}


def _groups(text: str) -> list[tuple[list[str], list[str], list[str]]]:
    """(node names, input names, output names) per group."""
    graph = parse_graph(text, _weights())
    verify(graph)
    return [([n.name for n in g.nodes], [repr(v) for v in g.inputs], [repr(v) for v in g.outputs])
            for g in partition(graph)]


def test_bias_gelu_after_a_gemm_is_one_group_and_the_gemm_stays_out() -> None:
    assert _groups("""\
graph(%x: f32[4, 16]) {
  %w = constant {name='w'} : f32[16, 16]
  %b = constant {name='b'} : f32[16]
  %m = mm(%x, %w) : f32[4, 16]
  %a = add(%m, %b) : f32[4, 16]
  %y = gelu(%a) {approximate='tanh'} : f32[4, 16]
  return %y
}""") == [(["a", "y"], ["%m", "%b"], ["%y"])]


def test_chains_that_meet_merge_into_one_group() -> None:
    """GELU written out: 0.5 * x and the tanh chain both read x and meet at the product; the
    lone mul used to stay a library call, one more trip through memory."""
    assert _groups("""\
graph(%x: f32[4, 16]) {
  %h = scalar {value=0.5} : f64[]
  %one = scalar {value=1.0} : f64[]
  %a = mul(%x, %h) : f32[4, 16]
  %t = tanh(%x) : f32[4, 16]
  %u = add(%t, %one) : f32[4, 16]
  %y = mul(%a, %u) : f32[4, 16]
  return %y
}""") == [(["a", "t", "u", "y"], ["%x"], ["%y"])]


def test_chains_do_not_merge_past_an_outside_reader_in_between() -> None:
    """%a is read by the softmax before the chains meet: the merged kernel would run after
    that reader, so only the longer chain takes %y."""
    groups = _groups("""\
graph(%x: f32[4, 16]) {
  %h = scalar {value=0.5} : f64[]
  %a = mul(%x, %h) : f32[4, 16]
  %b = add(%a, %h) : f32[4, 16]
  %s = softmax(%a) {dim=0} : f32[4, 16]
  %t = tanh(%x) : f32[4, 16]
  %u = exp(%t) : f32[4, 16]
  %y = mul(%b, %u) : f32[4, 16]
  return %y, %s
}""")
    assert groups == [(["a", "b"], ["%x"], ["%a", "%b"]), (["t", "u", "y"], ["%x", "%b"], ["%y"])]


def test_a_last_axis_mean_closes_its_group_and_runs_alone_after_a_residual_sum() -> None:
    """RMSNorm: the squares' mean closes [pow, mean]; where the residual sum before the
    squares is read later, the mean does not join it and is a group of its own (a row
    kernel), and a mean over another axis stays a library call."""
    assert _groups("""\
graph(%x: f32[4, 16]) {
  %two = scalar {value=2} : i64[]
  %p = pow(%x, %two) : f32[4, 16]
  %m = mean(%p) {dims=(-1,), keepdim=True} : f32[4, 1]
  return %m
}""") == [(["p", "m"], ["%x"], ["%m"])]
    assert _groups("""\
graph(%x: f32[4, 16], %h: f32[4, 16]) {
  %two = scalar {value=2} : i64[]
  %s = add(%x, %h) : f32[4, 16]
  %p = pow(%s, %two) : f32[4, 16]
  %m = mean(%p) {dims=(1,), keepdim=True} : f32[4, 1]
  %c = mean(%s) {dims=(0,), keepdim=True} : f32[1, 16]
  %y = mul(%s, %m) : f32[4, 16]
  return %y, %c
}""") == [(["s", "p"], ["%x", "%h"], ["%s", "%p"]), (["m"], ["%p"], ["%m"])]


def test_residual_add_and_layernorm_keep_the_sum_when_it_is_read_later() -> None:
    assert _groups("""\
graph(%x: f32[2, 4, 16], %h: f32[2, 4, 16]) {
  %g = constant {name='g'} : f32[16]
  %b = constant {name='b'} : f32[16]
  %s = add(%x, %h) : f32[2, 4, 16]
  %ln = layer_norm(%s, %g, %b) {normalized_shape=(16,), eps=1e-05} : (f32[2, 4, 16], f32[2, 4, 1], f32[2, 4, 1])
  %t = mul(%s, %ln#0) : f32[2, 4, 16]
  return %t
}""") == [(["s", "ln"], ["%x", "%h", "%g", "%b"], ["%s", "%ln#0"])]  # noqa: E501


def test_scale_mask_softmax_is_one_group_with_no_intermediate_output() -> None:
    assert _groups("""\
graph(%x: f32[1, 2, 8, 8]) {
  %mask = constant {name='mask'} : bool[1, 1, 8, 8]
  %neg = constant {name='neg'} : f32[]
  %c = scalar {value=0.125} : f64[]
  %s = mul(%x, %c) : f32[1, 2, 8, 8]
  %m = where(%mask, %neg, %s) : f32[1, 2, 8, 8]
  %p = softmax(%m) {dim=3} : f32[1, 2, 8, 8]
  return %p
}""") == [(["s", "m", "p"], ["%x", "%mask", "%neg"], ["%p"])]


def test_normalization_closes_a_group_and_lone_elementwise_ops_stay_library_calls() -> None:
    groups = _groups("""\
graph(%x: f32[4, 16]) {
  %p = softmax(%x) {dim=1} : f32[4, 16]
  %e = exp(%p) : f32[4, 16]
  %q = softmax(%e) {dim=0} : f32[4, 16]
  %g = constant {name='g'} : f32[16]
  %b = constant {name='b'} : f32[16]
  %ln = layer_norm(%q, %g, %b) {normalized_shape=(16,), eps=1e-05} : (f32[4, 16], f32[4, 1], f32[4, 1])
  return %ln#0
}""")  # noqa: E501
    # a lone softmax over the last dim is a row kernel (competing with the library's); exp
    # cannot join it (no epilogues) and alone stays a library call; softmax over dim 0 is
    # not a row kernel; a lone layer norm is kept (its row kernel is faster)
    assert groups == [(["p"], ["%x"], ["%p"]), (["ln"], ["%q", "%g", "%b"], ["%ln#0"])]


def test_a_group_never_runs_after_an_outside_reader_of_its_values() -> None:
    # %t reads %a between %a and %c: %c cannot join %a's group (the kernel would run at %c)
    groups = _groups("""\
graph(%x: f32[4, 16]) {
  %w = constant {name='w'} : f32[16, 16]
  %a = exp(%x) : f32[4, 16]
  %b = tanh(%a) : f32[4, 16]
  %t = mm(%a, %w) : f32[4, 16]
  %c = add(%b, %t) : f32[4, 16]
  %d = relu(%c) : f32[4, 16]
  return %d
}""")
    assert groups == [(["a", "b"], ["%x"], ["%a", "%b"]), (["c", "d"], ["%b", "%t"], ["%d"])]


@pytest.mark.parametrize("text", [
    """\
graph(%x: f64[4, 16]) {
  %a = exp(%x) : f64[4, 16]
  %b = tanh(%a) : f64[4, 16]
  return %b
}""",
    """\
graph(%x: f32[4, 16]) {
  %t = call(%x) {target=aten.t.default, args=(arg(0),), kwargs=()} : f32[16, 4]
  %a = exp(%t) : f32[16, 4]
  return %a
}""",
    """\
graph(%x: f32[4, 16], %y: f32[4, 16]) {
  %a = lt(%x, %y) : bool[4, 16]
  %b = logical_not(%a) : bool[4, 16]
  return %b
}""",
], ids=["float64", "opaque_then_one_op", "bool_results"])
def test_no_group_for_other_dtypes_or_single_ops(text: str) -> None:
    assert _groups(text) == []


def test_gather_moves_members_together_and_keeps_the_meaning() -> None:
    text = """\
graph(%x: f32[4, 16]) {
  %w = constant {name='w'} : f32[16, 16]
  %a = exp(%x) : f32[4, 16]
  %t = mm(%x, %w) : f32[4, 16]
  %b = add(%a, %t) : f32[4, 16]
  return %b, %t
}"""
    graph = parse_graph(text, _weights())
    groups = partition(graph)
    assert [[n.name for n in g.nodes] for g in groups] == [["a", "b"]]
    moved = gather(graph, groups)
    verify(moved)
    assert [n.name for n in moved.nodes] == ["w", "t", "a", "b"]
    inputs = tuple(support.random_inputs(graph))
    for got, want in zip(support.run_interpreter(moved, inputs),
                         support.run_interpreter(graph, inputs)):
        support.assert_identical(got, want)
    assert gather(graph, []) is graph


_ROTARY = """\
graph(%q: f32[2, 8, 16], %cos: f32[8, 16], %sin: f32[8, 16]) {
  %a = mul(%q, %cos) : f32[2, 8, 16]
  %q1 = slice(%q) {dim=2, start=0, end=8, step=1} : f32[2, 8, 8]
  %q2 = slice(%q) {dim=2, start=8, end=16, step=1} : f32[2, 8, 8]
  %n = neg(%q2) : f32[2, 8, 8]
  %r = cat(%n, %q1) {dim=2} : f32[2, 8, 16]
  %b = mul(%r, %sin) : f32[2, 8, 16]
  %y = add(%a, %b) : f32[2, 8, 16]
  return %y EXTRA
}"""


def test_last_axis_slices_and_cats_feed_their_consumers_kernel() -> None:
    """A rotary embedding (q * cos + cat(-q2, q1) * sin): the slices and the cat are read
    through by the one kernel, which reads q itself, not the cat's copy (Llama's took a
    library neg and cat, 25 and 39 us, beside its 21 us kernel)."""
    assert _groups(_ROTARY.replace(" EXTRA", "")) == [(["a", "q1", "q2", "n", "r", "b", "y"],
                                      ["%q", "%cos", "%sin"], ["%y"])]


def test_a_slice_read_outside_stays_a_view_and_the_kernel_reads_it() -> None:
    """%q1 is also returned: it stays a library view (free), the kernel's input; the cat of
    the kernel's own values, returned too, is written by the kernel."""
    assert _groups(_ROTARY.replace(" EXTRA", ", %q1, %r")) == [(["a", "q2", "n", "r", "b", "y"],
                                               ["%q", "%cos", "%q1", "%sin"], ["%r", "%y"])]


@pytest.mark.parametrize("text", [
    # slices and a cat alone: no arithmetic, nothing for a kernel to do
    """graph(%x: f32[4, 16]) {
  %a = slice(%x) {dim=1, start=0, end=8, step=1} : f32[4, 8]
  %b = slice(%x) {dim=1, start=8, end=16, step=1} : f32[4, 8]
  %y = cat(%b, %a) {dim=1} : f32[4, 16]
  return %y
}""",
    # a channel cat (not the last axis) keeps its library copy
    """graph(%x: f32[1, 4, 3, 3], %z: f32[1, 4, 3, 3]) {
  %c = cat(%x, %z) {dim=1} : f32[1, 8, 3, 3]
  %y = relu(%c) : f32[1, 8, 3, 3]
  return %y
}""",
    # a row kernel's prologue stays elementwise: the softmax runs alone
    """graph(%x: f32[4, 16]) {
  %a = slice(%x) {dim=1, start=0, end=8, step=1} : f32[4, 8]
  %b = slice(%x) {dim=1, start=8, end=16, step=1} : f32[4, 8]
  %c = cat(%b, %a) {dim=1} : f32[4, 16]
  %s = softmax(%c) {dim=1} : f32[4, 16]
  return %s
}""",
    # a cat of inputs that a library op reads: peeled back to the library, no group left
    """graph(%x: f32[4, 8], %z: f32[4, 8], %w: f32[16, 16]) {
  %c = cat(%x, %z) {dim=1} : f32[4, 16]
  %y = mm(%c, %w) : f32[4, 16]
  return %y
}"""], ids=["gathers-only", "channel-cat", "row-prologue", "peeled-to-nothing"])
def test_gathers_make_no_kernel_of_their_own(text: str) -> None:
    groups = _groups(text)
    assert all(not any(n in ("a", "b", "c") for n in names) for names, _, _ in groups), groups


class _Rotary(torch.nn.Module):
    """Llama's rotary embedding on a projection's permuted heads (a strided view)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 4 * 16, bias=False)
        angles = torch.arange(8.0)[:, None] * torch.linspace(0.1, 1.0, 8)[None]
        self.register_buffer("cos", torch.cat([angles, angles], -1).cos())
        self.register_buffer("sin", torch.cat([angles, angles], -1).sin())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x).view(1, 8, 4, 16).transpose(1, 2)
        half = torch.cat((-q[..., 8:], q[..., :8]), dim=-1)
        return q * self.cos + half * self.sin


def test_a_rotary_embedding_compiles_to_one_kernel_with_eagers_values() -> None:
    import kiln

    torch.manual_seed(0)
    model, x = _Rotary().eval(), torch.randn(1, 8, 32)
    compiled = kiln.compile(model, (x,), kiln.Options(measure_kernels=False))
    kernels = compiled.report.graphs[0].kernels
    fused = [k for k in kernels if k.kind == "generated" and "cat" in k.ops]
    assert len(fused) == 1 and {"slice", "neg", "mul", "add"} <= set(fused[0].ops)
    assert not any(k.kind == "library" and k.ops in (("cat",), ("neg",)) for k in kernels)
    x[0, 1, 3], x[0, 5, 7], x[0, 6, 0] = float("nan"), float("inf"), -float("inf")
    with torch.no_grad():
        want, got = model(x), compiled(x)
    assert not bool(want.isfinite().all())
    torch.testing.assert_close(got, want, equal_nan=True)


RMS_NORM = """\
graph(%x: f32[4, 16], %h: f32[4, 16]) {
  %g = constant {name='g'} : f32[16]
  %two = scalar {value=2} : i64[]
  %eps = scalar {value=1e-06} : f64[]
  %s = add(%x, %h) : f32[4, 16]
  %p = pow(%s, %two) : f32[4, 16]
  %m = mean(%p) {dims=(-1,), keepdim=True} : f32[4, 1]
  %e = add(%m, %eps) : f32[4, 1]
  %r = rsqrt(%e) : f32[4, 1]
  %n = mul(%s, %r) : f32[4, 16]
  %y = mul(%g, %n) : f32[4, 16]
  %z = add(%y, %s) : f32[4, 16]
  return %z
}"""


def test_an_rms_norm_and_its_residual_sum_are_one_group_that_writes_the_sum() -> None:
    """Llama's and T5's hand-written RMSNorm: one row kernel, not three; the residual sum it
    normalizes is its prologue and is written once, for the later residual add."""
    # (the lone add after it is left to the library)
    assert _groups(RMS_NORM) == [
        (["s", "p", "m", "e", "r", "n", "y"], ["%x", "%h", "%g"], ["%s", "%y"])]


def test_an_rms_norm_closes_its_group_and_takes_no_prologue_read_before_it_ends() -> None:
    # %q reads the residual sum before the norm ends: the sum cannot run in the norm's kernel
    text = RMS_NORM.replace("  %z = add(%y, %s) : f32[4, 16]\n  return %z",
                            "  %z = add(%y, %s) : f32[4, 16]\n  return %z, %q").replace(
        "  %p = pow(%s, %two)", "  %q = softmax(%s) {dim=-1} : f32[4, 16]\n  %p = pow(%s, %two)")
    assert _groups(text) == [(["s", "q"], ["%x", "%h"], ["%s", "%q"]),
                             (["p", "m", "e", "r", "n", "y"], ["%s", "%g"], ["%y"])]
    # and nothing joins it after its last node: a later elementwise chain is its own group
    text = RMS_NORM.replace("  %z = add(%y, %s) : f32[4, 16]\n  return %z",
                            "  %z = add(%y, %s) : f32[4, 16]\n  %t = tanh(%z) : f32[4, 16]\n"
                            "  return %t")
    assert _groups(text) == [
        (["s", "p", "m", "e", "r", "n", "y"], ["%x", "%h", "%g"], ["%s", "%y"]),
        (["z", "t"], ["%y", "%s"], ["%t"])]


def test_without_its_norm_a_group_keeps_the_prologue_and_writes_what_the_norm_reads() -> None:
    """The fallback where the rows recipe refuses: the prologue alone, writing the values the
    library's ops then read (a layer norm's input; an RMSNorm's rows, read by its squares and
    its scaling), or nothing where there is no prologue."""
    graph = parse_graph(RMS_NORM, _weights())
    (group,) = partition(graph)
    prologue = without_last(group)
    assert prologue is not None
    assert [n.name for n in prologue.nodes] == ["s"]
    assert [repr(v) for v in prologue.inputs] == ["%x", "%h"]
    assert [repr(v) for v in prologue.outputs] == ["%s"]
    text = RMS_NORM.replace("  %z = add(%y, %s) : f32[4, 16]\n  return %z", "  return %y, %s")
    text = text.replace("%s = add(%x, %h) : f32[4, 16]", "%s = exp(%x) : f32[4, 16]")
    graph = parse_graph(text, _weights())
    (group,) = partition(graph)
    assert [n.name for n in group.nodes] == ["s", "p", "m", "e", "r", "n", "y"]
    assert [repr(v) for v in without_last(group).outputs] == ["%s"]
    layer_norm = """\
graph(%x: f32[2, 16], %h: f32[2, 16]) {
  %g = constant {name='g'} : f32[16]
  %b = constant {name='b'} : f32[16]
  %s = add(%x, %h) : f32[2, 16]
  %ln = layer_norm(%s, %g, %b) {normalized_shape=(16,), eps=1e-05} : (f32[2, 16], f32[2, 1], f32[2, 1])
  return %ln#0
}"""  # noqa: E501
    (group,) = partition(parse_graph(layer_norm, _weights()))
    prologue = without_last(group)
    assert [n.name for n in prologue.nodes] == ["s"]
    assert [repr(v) for v in prologue.outputs] == ["%s"]


def test_an_rms_norms_weight_computed_by_its_prologue_keeps_the_prologue_apart() -> None:
    """Found by the fuzzer: the weight was a value of the group that would be the norm's
    prologue, so the kernel read a value it never wrote (NameError at run time). The row
    kernel reads its weight from memory: the prologue stays a group of its own."""
    text = """\
graph(%x: f32[4, 16], %h: f32[16]) {
  %two = scalar {value=2} : i64[]
  %eps = scalar {value=0.0} : f64[]
  %t = tanh(%h) : f32[16]
  %s = sub(%t, %x) : f32[4, 16]
  %p = pow(%s, %two) : f32[4, 16]
  %m = mean(%p) {dims=(1,), keepdim=True} : f32[4, 1]
  %e = add(%m, %eps) : f32[4, 1]
  %r = rsqrt(%e) : f32[4, 1]
  %n = mul(%r, %s) : f32[4, 16]
  %y = mul(%t, %n) : f32[4, 16]
  return %y
}"""
    assert _groups(text) == [(["t", "s"], ["%h", "%x"], ["%t", "%s"]),
                             (["p", "m", "e", "r", "n", "y"], ["%s", "%t"], ["%y"])]


def test_two_rms_norms_that_would_share_a_node_do_not() -> None:
    """Each norm's product with the other's result looks like its weight's product: the first
    norm takes it (its weight the second's result), the second ends at its scaling. The sum
    both normalize is read by the second before the first ends, so it is neither's
    prologue (a lone add: the library's)."""
    text = """\
graph(%x: f32[16], %h: f32[16]) {
  %two = scalar {value=2} : i64[]
  %eps = scalar {value=1e-06} : f64[]
  %s = add(%x, %h) : f32[16]
  %p = pow(%s, %two) : f32[16]
  %m = mean(%p) {dims=(-1,), keepdim=True} : f32[1]
  %e = add(%m, %eps) : f32[1]
  %r = rsqrt(%e) : f32[1]
  %y = mul(%s, %r) : f32[16]
  %p2 = mul(%s, %s) : f32[16]
  %m2 = mean(%p2) {dims=(0,), keepdim=True} : f32[1]
  %e2 = add(%m2, %eps) : f32[1]
  %r2 = rsqrt(%e2) : f32[1]
  %n2 = mul(%s, %r2) : f32[16]
  %z = mul(%y, %n2) : f32[16]
  return %z
}"""
    assert _groups(text) == [(["p2", "m2", "e2", "r2", "n2"], ["%s"], ["%n2"]),
                             (["p", "m", "e", "r", "y", "z"], ["%s", "%n2"], ["%z"])]


def test_a_second_rms_norm_of_a_sum_never_takes_the_first_norms_group_as_prologue() -> None:
    """Two norms of one residual sum: the first takes the sum as its prologue (and writes
    it); the second reads it from memory."""
    second = """\
  %p2 = mul(%s, %s) : f32[4, 16]
  %m2 = mean(%p2) {dims=(-1,), keepdim=True} : f32[4, 1]
  %e2 = add(%m2, %eps) : f32[4, 1]
  %r2 = rsqrt(%e2) : f32[4, 1]
  %n2 = mul(%s, %r2) : f32[4, 16]
  %z = add(%y, %n2) : f32[4, 16]
  return %z, %s"""
    text = RMS_NORM.replace("  %z = add(%y, %s) : f32[4, 16]\n  return %z", second)
    assert _groups(text) == [
        (["s", "p", "m", "e", "r", "n", "y"], ["%x", "%h", "%g"], ["%s", "%y"]),
        (["p2", "m2", "e2", "r2", "n2"], ["%s"], ["%n2"])]


LONE_CAT = """graph(%past: f32[1, 4, 7, 16], %new: f32[1, 4, 1, 16]) {{
  %c = cat(%past, %new) {{dim={dim}}} : {out}
  return %c
}}"""


@pytest.mark.parametrize("dim,out,alone", [
    (2, "f32[1, 4, 8, 16]", True),  # a KV cache along its keys
    (-2, "f32[1, 4, 8, 16]", True),
    (1, "f32[1, 5, 7, 16]", False),  # a 4-D value's channels (a CNN's, maybe NHWC)
    (0, "f32[2, 4, 7, 16]", False),  # whole pieces
], ids=["keys", "keys-negative", "channels", "first"])
def test_a_cat_along_an_inner_axis_is_a_copy_kernel_of_its_own(dim: int, out: str,
                                                               alone: bool) -> None:
    """One group of the cat alone, its pieces in, the result out; not along the first axis
    nor a 4-D value's channels (the last axis: `test_gathers_make_no_kernel_of_their_own`)."""
    text = LONE_CAT.format(dim=dim, out=out)
    if dim in (1, 0):  # (pieces that fit the axis)
        text = text.replace("%new: f32[1, 4, 1, 16]", "%new: f32[1, 1, 7, 16]" if dim == 1
                            else "%new: f32[1, 4, 7, 16]")
    groups = _groups(text)
    assert groups == ([(["c"], ["%past", "%new"], ["%c"])] if alone else [])


def test_a_three_dimensional_cat_of_tokens_is_a_copy_kernel() -> None:
    """ViT's class token joined to its patches, [1, 1, 8] + [1, 6, 8] along the tokens."""
    text = """graph(%cls: f32[1, 1, 8], %patches: f32[1, 6, 8]) {
  %c = cat(%cls, %patches) {dim=1} : f32[1, 7, 8]
  return %c
}"""
    assert [names for names, _, _ in _groups(text)] == [["c"]]


def test_a_decode_steps_cache_cats_run_as_generated_kernels_with_eagers_values() -> None:
    """Through kiln.compile with generated kernels: each cat a kernel, the values eager's."""
    import kiln
    from kiln.options import Options

    class Step(torch.nn.Module):
        def forward(self, k_past: torch.Tensor, k_new: torch.Tensor) -> tuple:
            return torch.cat([k_past, k_new], 2) * 2.0 + 1.0, torch.cat([k_past, k_new], 2)

    gen = torch.Generator().manual_seed(0)
    inputs = (torch.randn(1, 4, 9, 16, generator=gen), torch.randn(1, 4, 1, 16, generator=gen))
    inputs[0][0, 1, 3, 2] = float("nan")
    inputs[1][0, 2, 0, 5] = -0.0
    compiled = kiln.compile(Step(), inputs, Options(measure_kernels=False))
    with torch.no_grad():
        for got, want in zip(compiled(*inputs), Step()(*inputs), strict=True):
            support.assert_identical(got, want)
    assert any(k.kind == "generated" and k.ops == ("cat",) for k in compiled.report.kernels)
