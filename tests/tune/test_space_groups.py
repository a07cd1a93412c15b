"""A fused group's space works on the group as a graph of its own."""

from __future__ import annotations

import torch

from kiln.ir import parse_graph
from kiln.passes.partition import partition
from kiln.tune.space_groups import GroupSpace

TWO_LAYERS = """\
graph(%x: f32[4, 64]) {
  %g1 = constant {name='layer0.gamma'} : f32[64]
  %g2 = constant {name='layer1.gamma'} : f32[64]
  %w = constant {name='between'} : f32[64, 64]
  %a = relu(%x) : f32[4, 64]
  %b = mul(%a, %g1) : f32[4, 64]
  %c = exp(%b) : f32[4, 64]
  %m = mm(%c, %w) : f32[4, 64]
  %d = relu(%m) : f32[4, 64]
  %e = mul(%d, %g2) : f32[4, 64]
  %f = exp(%e) : f32[4, 64]
  return %c, %f
}"""


def test_repeated_layers_give_one_program() -> None:
    """Values are named by position, not after the model's nodes and weights, so two layers
    of one structure plan equal programs (built once), each mapped back to its own values."""
    graph = parse_graph(TWO_LAYERS, {"layer0.gamma": torch.randn(64),
                                     "layer1.gamma": torch.randn(64),
                                     "between": torch.randn(64, 64)})
    first, second = [GroupSpace.of(graph, g) for g in partition(graph)]
    (plan1, ins1, outs1), (plan2, ins2, outs2) = [
        s.planned_in_source(s.default(), record=False) for s in (first, second)]
    assert plan1.program == plan2.program and plan1.build() is plan2.build()
    assert [v.node.name for v in ins1] == ["x", "g1"] and [v.node.name for v in outs1] == ["c"]
    assert [v.node.name for v in ins2] == ["m", "g2"] and [v.node.name for v in outs2] == ["f"]


NHWC_CHAIN = """\
graph(%x: f32[1, 3, 8, 8]) {
  %w1 = constant {name='w1'} : f32[16, 3, 3, 3]
  %w2 = constant {name='w2'} : f32[16, 16, 3, 3]
  %xl = to_layout(%x) {channels_last=True} : f32[1, 3, 8, 8]
  %wl1 = to_layout(%w1) {channels_last=True} : f32[16, 3, 3, 3]
  %wl2 = to_layout(%w2) {channels_last=True} : f32[16, 16, 3, 3]
  %c1 = convolution(%xl, %wl1) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1} : f32[1, 16, 8, 8]
  %s = sigmoid(%c1) : f32[1, 16, 8, 8]
  %a = mul(%c1, %s) : f32[1, 16, 8, 8]
  %c2 = convolution(%a, %wl2) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1} : f32[1, 16, 8, 8]
  return %c2
}"""  # noqa: E501


def test_an_elementwise_group_between_nhwc_convolutions_is_planned_and_measured_nhwc() -> None:
    """The SiLU's input and output take NHWC strides; the tuner's operands have them too, so
    a measured candidate reads what the compiled kernel reads (and its check can pass)."""
    from kiln.tir import interp
    from kiln.tir.nodes import channels_last_strides

    graph = parse_graph(NHWC_CHAIN, {"w1": torch.randn(16, 3, 3, 3),
                                     "w2": torch.randn(16, 16, 3, 3)})
    (group,) = [g for g in partition(graph) if g.last.op.text == "mul"]
    space = GroupSpace.of(graph, group)
    nhwc = channels_last_strides((1, 16, 8, 8))
    assert list(space.strides.values()) == [nhwc] and list(space.out_strides.values()) == [nhwc]
    plan = space.plan(space.default())
    assert "sch.reorder(" in plan.trace.as_python()
    operands, (expected,) = space.operands(space.default(), torch.Generator().manual_seed(0))
    assert operands[0].stride() == nhwc and operands[-1].stride() == nhwc
    (got,) = interp.run_torch(plan.build(), operands[:-1])
    torch.testing.assert_close(got, expected)


def test_a_pickled_space_keeps_its_layouts_inputs_and_workload() -> None:
    """The Ray runner receives spaces by pickle: the NHWC strides, the group's input order
    and with them the workload key and the measured kernel must survive the trip."""
    import pickle

    graph = parse_graph(NHWC_CHAIN, {"w1": torch.randn(16, 3, 3, 3),
                                     "w2": torch.randn(16, 16, 3, 3)})
    (group,) = [g for g in partition(graph) if g.last.op.text == "mul"]
    space = GroupSpace.of(graph, group)
    back = pickle.loads(pickle.dumps(space))
    assert list(back.strides.values()) == list(space.strides.values())
    assert list(back.out_strides.values()) == list(space.out_strides.values())
    assert [v.node.name for v in back.group.inputs] == [v.node.name for v in space.group.inputs]
    assert back.workload() == space.workload()
    assert back.plan(back.default()).program == space.plan(space.default()).program



def test_an_rms_norm_is_a_rows_space_whose_every_candidate_computes_it() -> None:
    """The norm's group ends in a mul, yet it is planned (and tuned) by the rows recipe: each
    lane count gives a program that computes the group's values."""
    from kiln.tir import interp

    text = """\
graph(%x: f32[3, 40], %h: f32[3, 40]) {
  %g = constant {name='g'} : f32[40]
  %two = scalar {value=2} : i64[]
  %eps = scalar {value=1e-06} : f64[]
  %s = add(%x, %h) : f32[3, 40]
  %p = pow(%s, %two) : f32[3, 40]
  %m = mean(%p) {dims=(1,), keepdim=True} : f32[3, 1]
  %e = add(%m, %eps) : f32[3, 1]
  %r = rsqrt(%e) : f32[3, 1]
  %n = mul(%s, %r) : f32[3, 40]
  %y = mul(%g, %n) : f32[3, 40]
  return %y
}"""
    graph = parse_graph(text, {"g": torch.randn(40, generator=torch.Generator().manual_seed(0))})
    (group,) = partition(graph)
    space = GroupSpace.of(graph, group)
    assert space.kind == "rows" and space.names() == ("lanes", "parallel")
    for lanes in space.candidates("lanes", {}):
        decisions = {**space.default(), "lanes": lanes}
        plan = space.plan(decisions)
        assert f"rmsnorm_rows(3, 40, lanes={lanes})" in plan.notes
        operands, (expected,) = space.operands(decisions, torch.Generator().manual_seed(lanes))
        (got,) = interp.run_torch(plan.build(), operands[:-1])
        torch.testing.assert_close(got, expected)
