"""Ops kiln's IR cannot type (complex numbers) run as one opaque call each; the rest of the
graph is compiled."""

import logging

import pytest
import torch
import torch.nn as nn

import kiln


class FourierMixing(nn.Module):
    """FNet's token mixing: the real part of a 2-d FFT, between two linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        y = torch.fft.fftn(self.up(x), dim=(1, 2)).real
        return torch.relu(self.down(y))


class ComplexRotary(nn.Module):
    """Rotary embeddings as Meta's LLaMA code writes them: a complex ``freqs_cis`` buffer
    times the query viewed as complex pairs."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)
        angles = torch.outer(torch.arange(6.0), 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8))
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))

    def forward(self, x):
        q = self.q(x)
        qc = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        return torch.view_as_real(qc * self.freqs_cis).flatten(2).type_as(x) * 2


class LeavesAndReturns(nn.Module):
    """A typed op between two complex ones on one complex value: the region must hold it
    (the value too large to recompute per reader: `regions.split_shared`)."""

    def forward(self, x):
        c = torch.view_as_complex(x)
        back = torch.relu(torch.view_as_real(c)) + 1
        return torch.view_as_real(torch.view_as_complex(back.contiguous()) * c).sum(-1)


def _check(model, x, entry):
    torch.manual_seed(0)
    with torch.no_grad():
        expected = model(x)
        if entry == "compile":
            compiled = kiln.compile(model, (x,))
            got = compiled(x)
            assert compiled.report.fallbacks == []
            (graph,) = compiled.report.graphs
            return got, expected, graph
        torch._dynamo.reset()
        return torch.compile(model, backend="kiln")(x), expected, None


@pytest.mark.parametrize("entry", ["compile", "dynamo"])
@pytest.mark.parametrize("make", [FourierMixing, ComplexRotary, LeavesAndReturns])
def test_complex_ops_run_as_one_call_and_the_rest_compiles(make, entry):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(1, 6, 8) if make is not LeavesAndReturns else torch.randn(256, 257, 2)
    got, expected, graph = _check(model, x, entry)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    if graph is not None:
        regions = [op for op in graph.opaque_ops if op.startswith("kiln.region(")]
        assert len(regions) == 1, graph.opaque_ops


def test_the_region_is_the_only_opaque_call():
    """The linear layers, the ReLU and the selection of the real part stay kiln's ops."""
    torch.manual_seed(0)
    model, x = FourierMixing().eval(), torch.randn(1, 6, 8)
    with torch.no_grad():
        compiled = kiln.compile(model, (x,), options=kiln.Options(debug=True))
        compiled(x)
    (graph,) = compiled.report.graphs
    assert list(graph.opaque_ops) == ["kiln.region(aten._to_copy.default, "
                                      "aten._fft_c2c.default, aten.view_as_real.default)"]


def test_a_complex_result_of_the_graph_still_runs_eagerly_with_the_reason(caplog):
    def f(x):
        return torch.fft.fft(x)  # the caller gets complex numbers back

    x = torch.randn(8)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        out = torch.compile(f, backend="kiln")(x)
    assert torch.equal(out, f(x))
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("complex64 is not supported by kiln in a result of the graph" in m
               for m in messages), messages


def test_a_region_reads_its_inputs_at_every_call():
    """The region is a call, not a constant: new inputs give new results."""
    torch.manual_seed(0)
    model = ComplexRotary().eval()
    x1, x2 = torch.randn(1, 6, 8), torch.randn(1, 6, 8)
    with torch.no_grad():
        compiled = kiln.compile(model, (x1,))
        torch.testing.assert_close(compiled(x2), model(x2), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled(x1), model(x1), rtol=1e-5, atol=1e-5)


def test_a_region_prints_in_the_ir_and_holds_no_global_state():
    """The region is the CALL's target itself (its graph and weights), written by name."""
    from kiln.frontend.export import import_model
    from kiln.frontend.regions import RegionCall
    from kiln.ir import print_graph

    torch.manual_seed(0)
    graph = import_model(ComplexRotary().eval(), (torch.randn(1, 6, 8),)).graph
    (call,) = [n for n in graph.nodes if isinstance(getattr(n.attrs, "target", None),
                                                    RegionCall)]
    assert any(b.is_complex() for b in call.attrs.target.module.buffers())  # freqs_cis
    assert f"ops.kiln.region.{call.attrs.target._overloadname}" in print_graph(graph)


class SharedTable(nn.Module):
    """DeepSeek-V2's rotary embedding: a complex table made once, read by every layer."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.qs = nn.ModuleList(nn.Linear(8, 8) for _ in range(layers))

    def forward(self, x, angles):
        table = torch.polar(torch.ones_like(angles), angles)  # complex [6, 4]
        for q in self.qs:
            qc = torch.view_as_complex(q(x).reshape(*x.shape[:-1], -1, 2))
            x = torch.relu(torch.view_as_real(qc * table).flatten(2)) + x
        return x


@pytest.mark.parametrize("entry", ["compile", "dynamo"])
def test_a_small_complex_value_read_by_every_layer_is_made_per_layer(entry):
    """Each layer's region makes its own copy of the table (a polar of 24 elements), where
    one region held every layer between the table's first and last reader: their linear
    layers and ReLUs ran as the region's ATen calls."""
    torch.manual_seed(0)
    model = SharedTable(3).eval()
    x, angles = torch.randn(1, 6, 8), torch.randn(6, 4)
    with torch.no_grad():
        expected = model(x, angles)
        if entry == "compile":
            compiled = kiln.compile(model, (x, angles))
            (graph,) = compiled.report.graphs
            found = [op for op in graph.opaque_ops if op.startswith("kiln.region(")]
            assert len(found) == 3 and all("addmm" not in op for op in found), found
            assert all(op.count("polar") == 1 for op in found)
        else:
            torch._dynamo.reset()
            compiled = torch.compile(model, backend="kiln")
        torch.testing.assert_close(compiled(x, angles), expected, rtol=1e-5, atol=1e-5)
