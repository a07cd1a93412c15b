"""RMSNorm written out in arithmetic, recognized on hand-built graphs (and refused where the
pattern differs in any way that would change the arithmetic or need an extra output)."""

from __future__ import annotations

import pytest
import torch

from kiln.ir import parse_graph, verify
from kiln.passes.rms_norm import rms_norm_at

LLAMA = """\
graph(%x: f32[2, 5, 16]) {
  %w = constant {name='w'} : f32[16]
  %two = scalar {value=2} : i64[]
  %eps = scalar {value=1e-06} : f64[]
  %p = pow(%x, %two) : f32[2, 5, 16]
  %m = mean(%p) {dims=(2,), keepdim=True} : f32[2, 5, 1]
  %e = add(%m, %eps) : f32[2, 5, 1]
  %r = rsqrt(%e) : f32[2, 5, 1]
  %n = mul(%x, %r) : f32[2, 5, 16]
  %y = mul(%w, %n) : f32[2, 5, 16]
  return %y
}"""


def _match(text: str):  # noqa: ANN202
    graph = parse_graph(text, {"w": torch.randn(16), "v": torch.randn(5, 16)})
    verify(graph)
    means = [n for n in graph.nodes if n.op.text == "mean"]
    return rms_norm_at(means[0], graph.users(), set(graph.outputs))


def test_llamas_norm_is_matched_with_its_weight_and_eps() -> None:
    norm = _match(LLAMA)
    assert norm is not None
    assert [n.name for n in norm.nodes] == ["p", "m", "e", "r", "n", "y"]
    assert repr(norm.x) == "%x" and repr(norm.weight) == "%w" and norm.eps == 1e-06
    assert norm.last.name == "y"


@pytest.mark.parametrize(("old", "new"), [
    ("%p = pow(%x, %two)", "%p = mul(%x, %x)"),                     # x * x for x ** 2
    ("%n = mul(%x, %r)", "%n = mul(%r, %x)"),                       # operands swapped
    ("%y = mul(%w, %n)", "%y = mul(%n, %w)"),
    ("%e = add(%m, %eps)", "%e = add(%eps, %m)"),
    ("{dims=(2,), keepdim=True}", "{dims=(-1,), keepdim=True}"),
])
def test_the_forms_models_write_are_matched(old: str, new: str) -> None:
    assert old in LLAMA
    norm = _match(LLAMA.replace(old, new))
    assert norm is not None and norm.weight is not None and len(norm.nodes) == 6


def test_without_a_weight_the_norm_ends_at_the_scaling() -> None:
    text = LLAMA.replace("  %y = mul(%w, %n) : f32[2, 5, 16]\n  return %y", "  return %n")
    norm = _match(text)
    assert norm is not None and norm.weight is None and norm.last.name == "n"
    # a product with something other than a weight over the rows is not the norm's
    text = LLAMA.replace("%w = constant {name='w'} : f32[16]",
                         "%w = constant {name='v'} : f32[5, 16]")
    norm = _match(text)
    assert norm is not None and norm.weight is None and norm.last.name == "n"


@pytest.mark.parametrize(("old", "new"), [
    ("{dims=(2,), keepdim=True}", "{dims=(1,), keepdim=True}"),      # another axis
    ("%p = pow(%x, %two)", "%p = pow(%x, %eps)"),                    # not a square
    ("%r = rsqrt(%e)", "%r = sqrt(%e)"),
    ("%n = mul(%x, %r)", "%n = add(%x, %r)"),                        # does not scale x
    ("  return %y", "  return %y, %r"),                              # an intermediate is read
    ("  return %y", "  return %y, %p"),
])
def test_other_arithmetic_or_an_intermediate_read_outside_is_refused(old: str, new: str) -> None:
    assert old in LLAMA
    text = LLAMA.replace(old, new)
    if "dims=(1,)" in new:
        text = text.replace("f32[2, 5, 1]", "f32[2, 1, 16]")
    assert _match(text) is None


def test_a_mean_without_keepdim_is_refused() -> None:
    text = LLAMA.replace("keepdim=True} : f32[2, 5, 1]", "keepdim=False} : f32[2, 5]") \
        .replace("%e = add(%m, %eps) : f32[2, 5, 1]", "%e = add(%m, %eps) : f32[2, 5]") \
        .replace("%r = rsqrt(%e) : f32[2, 5, 1]", "%r = rsqrt(%e) : f32[2, 5]")
    text = text.replace("%n = mul(%x, %r) : f32[2, 5, 16]", "%n = mul(%x, %x) : f32[2, 5, 16]")
    assert _match(text) is None
