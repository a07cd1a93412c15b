"""Where a rule must not fire: the guards and the engine's type check, case by case."""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln.ir import parse_graph
from kiln.options import Options
from kiln.rewrite import apply_rules
from kiln.rules import ALL_RULES, rule_named


def _fires(rule_name: str, text: str, constants=None, fast_math: bool = True) -> int:
    graph = parse_graph(text, constants or {})
    result = apply_rules(graph, [rule_named(rule_name)], Options(fast_math=fast_math))
    return result.stats.get(rule_name).fired if rule_name in result.stats else 0


def test_transpose_of_a_square_matrix_is_not_an_identity() -> None:
    text = """graph(%x: f32[3, 3]) {
  %t = permute(%x) {dims=(1, 0)} : f32[3, 3]
  return %t
}"""
    assert _fires("permute-identity", text) == 0
    assert _fires("view-identity", text) == 0


def test_multiplying_by_ones_that_broadcast_is_not_neutral() -> None:
    text = """graph(%x: f32[4]) {
  %ones = constant {name='ones'} : f32[3, 4]
  %y = mul(%x, %ones) : f32[3, 4]
  return %y
}"""
    assert _fires("mul-one", text, {"ones": torch.ones(3, 4)}) == 0


PERMUTED_OTHERWISE = """graph(%x: f32[2, 3, 4], %y: f32[4, 2, 3]) {
  %px = permute(%x) {dims=(0, 2, 1)} : f32[2, 4, 3]
  %py = permute(%y) {dims=(1, 0, 2)} : f32[2, 4, 3]
  %s = add(%px, %py) : f32[2, 4, 3]
  return %s
}"""
PERMUTED_BROADCAST = """graph(%x: f32[4, 3], %y: f32[1, 3]) {
  %px = permute(%x) {dims=(1, 0)} : f32[3, 4]
  %py = permute(%y) {dims=(1, 0)} : f32[3, 1]
  %s = mul(%px, %py) : f32[3, 4]
  return %s
}"""


@pytest.mark.parametrize("text", [PERMUTED_OTHERWISE, PERMUTED_BROADCAST])
def test_a_permute_stays_above_operands_permuted_otherwise_or_broadcast(text: str) -> None:
    """permute(x) + permute(y) becomes permute(x + y) only where both are permuted alike and
    have one type; the same graph with y permuted alike and of x's type does change."""
    assert _fires("permute-sink", text) == 0
    alike = PERMUTED_OTHERWISE.replace("f32[4, 2, 3]", "f32[2, 3, 4]").replace(
        "{dims=(1, 0, 2)}", "{dims=(0, 2, 1)}")
    assert _fires("permute-sink", alike) == 1


NHWC_RESIDUAL = """graph(%x: f32[1, 4, 3, 5], %z: f32[1, 3, 5, 4]) {{
  %y = {y} : f32[1, 3, 5, 4]
  %p = permute(%y) {{dims={dims}}} : f32[1, 4, 3, 5]
  %s = add(%x, %p) : f32[1, 4, 3, 5]
  return %s
}}"""


@pytest.mark.parametrize(("y", "dims", "fires"), [
    ("clone(%z)", "(0, 3, 1, 2)", 1),  # a dense [N, H, W, C] value: the add runs on it
    ("relu(%z)", "(0, 3, 1, 2)", 0),  # y may be strided (the caller's z may be)
    ("clone(%z)", "(0, 3, 2, 1)", 0),  # not NHWC -> NCHW
])
def test_a_residual_add_runs_on_nhwc_values_only_where_they_are_dense(
        y: str, dims: str, fires: int) -> None:
    text = NHWC_RESIDUAL.format(y=y, dims=dims)
    if dims == "(0, 3, 2, 1)":
        text = text.replace("%x: f32[1, 4, 3, 5]", "%x: f32[1, 4, 5, 3]").replace(
            ": f32[1, 4, 3, 5]", ": f32[1, 4, 5, 3]")
    assert _fires("permute-hoist", text) == fires


def test_integer_times_float_one_changes_dtype() -> None:
    text = """graph(%x: i64[4]) {
  %c = scalar {value=1.0} : f64[]
  %y = mul(%x, %c) : f32[4]
  return %y
}"""
    assert _fires("mul-one", text) == 0


def test_positive_zero_is_neutral_only_with_fast_math() -> None:
    text = """graph(%x: f32[4]) {
  %c = scalar {value=0.0} : f64[]
  %y = add(%x, %c) : f32[4]
  return %y
}"""
    assert _fires("add-zero", text, fast_math=False) == 0
    assert _fires("add-zero", text, fast_math=True) == 1
    assert _fires("add-neg-zero", text) == 0


def test_a_zero_mask_under_softmax_goes_without_fast_math_unless_it_broadcasts_x() -> None:
    """HF ViT's attention adds an all-zero mask (a padding mask with nothing padded, folded)
    to its scores before the softmax: exact to drop there, and only there."""
    masked = """graph(%x: f32[2, 3, 5, 5]) {
  %mask = constant {name='mask'} : f32[1, 1, 5, 5]
  %s = add(%x, %mask) : f32[2, 3, 5, 5]
  %p = softmax(%s) {dim=3} : f32[2, 3, 5, 5]
  return %p
}"""
    zeros = {"mask": torch.zeros(1, 1, 5, 5)}
    assert _fires("softmax-add-zero", masked, zeros, fast_math=False) == 1
    assert _fires("softmax-add-zero", masked, {"mask": torch.full((1, 1, 5, 5), -0.0)}) == 0
    mask = torch.zeros(1, 1, 5, 5)
    mask[0, 0, 4, 4] = -1e9  # a padded position: the mask is no neutral element
    assert _fires("softmax-add-zero", masked, {"mask": mask}) == 0
    widened = masked.replace("f32[2, 3, 5, 5]) {", "f32[1, 1, 5, 5]) {").replace(
        "constant {name='mask'} : f32[1, 1, 5, 5]", "constant {name='mask'} : f32[2, 3, 5, 5]")
    assert _fires("softmax-add-zero", widened, {"mask": torch.zeros(2, 3, 5, 5)}) == 0


def test_floor_division_by_one_is_not_the_identity() -> None:
    text = """graph(%x: f32[4]) {
  %c = scalar {value=1} : i64[]
  %y = div(%x, %c) {rounding_mode='floor'} : f32[4]
  return %y
}"""
    assert _fires("div-one", text) == 0


def test_division_by_a_non_power_of_two_is_not_exact() -> None:
    text = """graph(%x: f32[4]) {
  %c = scalar {value=3.0} : f64[]
  %y = div(%x, %c) : f32[4]
  return %y
}"""
    assert _fires("div-const-pow2", text) == 0
    assert _fires("div-const", text) == 1


def test_interior_node_with_another_user_is_not_consumed() -> None:
    text = """graph(%x: f32[4]) {
  %a = neg(%x) : f32[4]
  %b = neg(%a) : f32[4]
  %c = add(%a, %b) : f32[4]
  return %c
}"""
    assert _fires("neg-neg", text) == 0


def test_merge_refused_when_a_view_cannot_take_the_strided_piece() -> None:
    # q's piece of the merged (4, 6) GEMM has strides (6, 1); flattening it needs a copy
    text = """graph(%x: f32[4, 5]) {
  %wq = constant {name='wq'} : f32[5, 3]
  %bq = constant {name='bq'} : f32[3]
  %wk = constant {name='wk'} : f32[5, 3]
  %bk = constant {name='bk'} : f32[3]
  %q = addmm(%bq, %x, %wq) {beta=1, alpha=1} : f32[4, 3]
  %k = addmm(%bk, %x, %wk) {beta=1, alpha=1} : f32[4, 3]
  %flat = view(%q) {shape=(12,)} : f32[12]
  return %flat, %k
}"""
    weights = {n: torch.randn(5, 3) if n.startswith("w") else torch.randn(3)
               for n in ("wq", "bq", "wk", "bk")}
    assert _fires("merge-parallel-addmm", text, weights) == 0
    assert _fires("merge-parallel-addmm", text.replace("%flat = view(%q) {shape=(12,)} : "
                                                       "f32[12]", "%flat = relu(%q) : f32[4, 3]")
                  .replace("return %flat, %k", "return %flat, %k"), weights) == 1


def test_merge_of_bias_free_gemms_refused_only_where_the_piece_alone_would_not_copy() -> None:
    """mm siblings merge (LLaMA's q/k/v, gate/up); a reshape that copies the merged piece
    refuses it, but not one that copies the unmerged value too (grouped-query attention's
    expanded keys and values)."""
    text = """graph(%x: f32[4, 5]) {
  %wq = constant {name='wq'} : f32[5, 6]
  %wk = constant {name='wk'} : f32[5, 6]
  %q = mm(%x, %wq) : f32[4, 6]
  %k = mm(%x, %wk) : f32[4, 6]
  %flat = view(%q) {shape=(24,)} : f32[24]
  return %flat, %k
}"""
    weights = {"wq": torch.randn(5, 6), "wk": torch.randn(5, 6)}
    assert _fires("merge-parallel-mm", text, weights) == 0
    grouped = text.replace(
        "%flat = view(%q) {shape=(24,)} : f32[24]",
        "%u = unsqueeze(%q) {dim=1} : f32[4, 1, 6]\n"
        "  %e = expand(%u) {shape=(4, 2, 6)} : f32[4, 2, 6]\n"
        "  %flat = view(%e) {shape=(48,)} : f32[48]").replace("f32[24]", "f32[48]")
    assert _fires("merge-parallel-mm", grouped, weights) == 1


def test_transposed_convolution_keeps_its_batch_norm() -> None:
    text = """graph(%x: f32[1, 2, 4, 4]) {
  %w = constant {name='w'} : f32[2, 3, 3, 3]
  %g = constant {name='g'} : f32[3]
  %y = convolution(%x, %w) {stride=(1, 1), padding=(0, 0), dilation=(1, 1), transposed=True, output_padding=(0, 0), groups=1} : f32[1, 3, 6, 6]
  %n = batch_norm(%y, %g, %g, %g, %g) {eps=1e-05} : f32[1, 3, 6, 6]
  return %n
}"""  # noqa: E501
    weights = {"w": torch.randn(2, 3, 3, 3), "g": torch.rand(3) + 0.5}
    assert _fires("conv-bn", text, weights) == 0


def test_every_rule_has_a_comment_with_its_algebra() -> None:
    import importlib
    import inspect
    import pkgutil

    import kiln.rules as rules_package

    modules = [importlib.import_module(f"kiln.rules.{info.name}")
               for info in pkgutil.iter_modules(rules_package.__path__)]
    sources = "".join(inspect.getsource(m) for m in modules if hasattr(m, "RULES"))
    for rule in ALL_RULES:
        row = sources[sources.index(f'Rule("{rule.name}"'):]
        row = row[:row.index("\n    Rule(") if "\n    Rule(" in row else len(row)]
        assert "->" in row.split("#", 1)[-1], f"{rule.name} has no '# before -> after' comment"


def test_an_integer_times_a_float_zero_is_a_float_with_signed_zeros() -> None:
    # mul-zero-int gave +0.0 where -3 * 0.0 is -0.0 (a bf16 fill of 1e-300 is 0.0; fuzz
    # seed 5, graph 35625); with an integer zero the product is an integer and it fires
    floats = """graph(%x: i16[2, 3]) {
  %z = full {shape=(1, 3), value=0.0, dtype=bf16} : bf16[1, 3]
  %y = mul(%z, %x) : bf16[2, 3]
  return %y
}"""
    assert _fires("mul-zero-int", floats, fast_math=False) == 0
    ints = floats.replace("value=0.0, dtype=bf16} : bf16[1, 3]", "value=0, dtype=i16} : i16[1, 3]")
    assert _fires("mul-zero-int", ints.replace("bf16[2, 3]", "i16[2, 3]"), fast_math=False) == 1


def test_an_activation_stays_off_a_gemm_whose_input_feeds_another() -> None:
    """Llama's gate and up projections read one input: they merge into one wide GEMM, which
    an activation fused into one of them would stop; alone, the mm takes a zero bias."""
    siblings = """graph(%x: f32[4, 8], %a: f32[8, 6], %b: f32[8, 6]) {
  %g = mm(%x, %a) : f32[4, 6]
  %u = mm(%x, %b) : f32[4, 6]
  %s = relu(%g) : f32[4, 6]
  %y = mul(%s, %u) : f32[4, 6]
  return %y
}"""
    assert _fires("mm-act", siblings) == 0
    alone = """graph(%x: f32[4, 8], %a: f32[8, 6]) {
  %g = mm(%x, %a) : f32[4, 6]
  %s = relu(%g) : f32[4, 6]
  return %s
}"""
    assert _fires("mm-act", alone, fast_math=False) == 1


def test_an_activation_that_feeds_only_a_gemm_fuses_next_to_a_sibling() -> None:
    """Falcon's parallel attention and MLP read one layer norm: gelu(x @ W_fc) feeds only the
    down projection (through a view), so nothing joins it with x @ W_qkv, and it rides on
    its own GEMM. A second use that is not a GEMM's left operand keeps it off."""
    parallel = """graph(%x: f32[4, 8], %a: f32[8, 6], %b: f32[8, 6], %d: f32[6, 8]) {
  %q = mm(%x, %a) : f32[4, 6]
  %f = mm(%x, %b) : f32[4, 6]
  %s = gelu(%f) {approximate='none'} : f32[4, 6]
  %v = view(%s) {shape=(4, 6)} : f32[4, 6]
  %o = mm(%v, %d) : f32[4, 8]
  return %q, %o
}"""
    assert _fires("mm-act", parallel) == 1
    assert _fires("mm-act", parallel.replace("return %q, %o", "return %q, %o, %s")) == 0
    weight_side = parallel.replace("%d: f32[6, 8]", "%d: f32[4, 4]").replace(
        "%o = mm(%v, %d) : f32[4, 8]", "%o = mm(%d, %v) : f32[4, 6]")
    assert _fires("mm-act", weight_side) == 0  # (the activation as a GEMM's right operand)


def test_a_copy_of_the_callers_tensor_stays_under_a_permute() -> None:
    """permute(clone(x)) may read x in place only where x is the graph's own: of an input,
    the permuted result would alias the caller's tensor, where the copy made it fresh."""
    text = """graph(%x: f32[2, 3, 4]) {{
  %s = {source} : f32[2, 3, 4]
  %c = clone(%s) : f32[2, 3, 4]
  %p = permute(%c) {{dims=(0, 2, 1)}} : f32[2, 4, 3]
  return %p
}}"""
    assert _fires("permute-skip-copy", text.format(source="relu(%x)")) == 1
    assert _fires("permute-skip-copy", text.format(source="permute(%x) {dims=(0, 1, 2)}")) == 0


def test_an_activation_stays_off_a_product_of_one_term() -> None:
    """mm with K = 1 is the term itself, -0.0 included, where the zero bias's sum gives
    0.0 (fuzz seed 57, graph 6851); from two terms the fused GEMM's zero signs are mm's."""
    text = """graph(%x: f32[16, {k}], %w: f32[{k}, 2]) {{
  %mm = mm(%x, %w) : f32[16, 2]
  %t = tanh(%mm) : f32[16, 2]
  return %t
}}"""
    assert _fires("mm-act", text.format(k=1)) == 0
    assert _fires("mm-act", text.format(k=2)) == 1
    x, w = torch.randn(16, 1), torch.rand(1, 2) + 0.5
    x[2] = -0.0
    out = kiln.compile(torch.nn.Sequential(_Mm(w), torch.nn.Tanh()), (x,))(x)
    assert torch.equal(out.signbit(), torch.tanh(x @ w).signbit())
    assert bool(out[2].signbit().all())


class _Mm(torch.nn.Module):
    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.w)


RESIDUAL_THROUGH_VIEW = """\
graph(%x: f32[6, 4], %w: f32[4, 5], %b: f32[5], %r: f32[{r}], %w2: f32[5, 3]) {{
  %m = addmm(%b, %x, %w) {{beta=1, alpha=1}} : f32[6, 5]
  %v = view(%m) {{shape=(1, 6, 5)}} : f32[1, 6, 5]
  %s = add(%v, %r) : f32[1, 6, 5]
  {reader}
}}"""
# the sum read by the next GEMM (through a view) and the next residual add, as in LeViT
_NEXT_BLOCK = """%f = view(%s) {shape=(6, 5)} : f32[6, 5]
  %n = mm(%f, %w2) : f32[6, 3]
  %t = add(%s, %s) : f32[1, 6, 5]
  return %n, %t"""
_LAYER_NORM = """%g = constant {name='g'} : f32[5]
  %ln = layer_norm(%s, %g, %g) {normalized_shape=(5,), eps=1e-05} : \
(f32[1, 6, 5], f32[1, 6, 1], f32[1, 6, 1])
  return %ln#0"""


# read through a permute by a contraction (ConvNeXt's next depthwise convolution), or by an
# activation, whose kernel would compute the sum
_PERMUTED_GEMM = """%f = view(%s) {shape=(6, 5)} : f32[6, 5]
  %p = permute(%f) {dims=(1, 0)} : f32[5, 6]
  %n = mm(%p, %x) : f32[5, 4]
  return %n"""
_ACTIVATION = """%a = relu(%s) : f32[1, 6, 5]
  return %a"""


@pytest.mark.parametrize(("r", "reader", "fires"), [
    ("1, 6, 5", _NEXT_BLOCK, 1),
    ("1, 6, 5", _PERMUTED_GEMM, 1),
    ("1, 6, 5", _ACTIVATION, 0),
    ("1, 6, 5", _LAYER_NORM, 0),  # the norm's kernel computes the sum (GPT-2's ln(x + attn))
    ("5", _NEXT_BLOCK, 0),  # a residual that broadcasts is no [M, N] matrix
])
def test_a_residual_joins_a_viewed_gemms_bias_where_only_gemms_and_adds_read_the_sum(
        r: str, reader: str, fires: int) -> None:
    text = RESIDUAL_THROUGH_VIEW.format(r=r, reader=reader)
    constants = {"g": torch.ones(5)} if "constant" in reader else None
    assert _fires("addmm-view-residual", text, constants) == fires


COLUMN_SCALE = """graph(%x: f32[6, 4]) {{
  %w = constant {{name='w'}} : f32[4, 5]
  %b = constant {{name='b'}} : f32[5]
  %g = constant {{name='g'}} : f32[{g}]
  %m = addmm(%b, %x, %w) {{beta=1, alpha=1}} : f32[6, 5]
  %v = view(%m) {{shape=(1, 6, 5)}} : f32[1, 6, 5]
  %s = mul(%v, %g) : f32[{out}]
  return %s
}}"""


@pytest.mark.parametrize(("g", "out", "fires"), [
    ("5", "1, 6, 5", 1), ("1, 1, 5", "1, 6, 5", 1),  # one weight per column (layer scale)
    ("1, 6, 1", "1, 6, 5", 0),  # one per row: no column of W takes it
    ("2, 1, 5", "2, 6, 5", 0),  # the product broadcast to a larger shape
])
def test_a_column_scale_goes_into_the_gemms_weights_only_one_per_column(
        g: str, out: str, fires: int) -> None:
    shape = tuple(int(d) for d in g.split(","))
    constants = {"w": torch.randn(4, 5), "b": torch.randn(5), "g": torch.rand(shape) + 0.5}
    text = COLUMN_SCALE.format(g=g, out=out)
    assert _fires("column-scale-into-addmm", text, constants) == fires
