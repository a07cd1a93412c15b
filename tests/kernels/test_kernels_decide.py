"""When the compile-time measurement of a kernel against its library call may stop early:
only where no further round could change which contender is chosen."""

from __future__ import annotations

from kiln.cost.measure import Timing
from kiln.kernels.decide import _settled


def _t(*ms: float) -> Timing:
    return Timing([m * 1e-3 for m in ms])


def test_a_clear_win_and_a_clear_loss_are_settled() -> None:
    library = _t(1.00, 1.02, 1.05)
    assert _settled(library, [_t(0.80, 0.82, 0.85)], [0.95])  # all below 0.95 x 1.00
    assert _settled(library, [_t(1.20, 1.30, 1.25)], [0.95])  # all above 0.95 x 1.05


def test_samples_on_both_sides_of_the_margin_are_not() -> None:
    library = _t(1.00, 1.02, 1.05)
    assert not _settled(library, [_t(0.90, 0.96, 0.97)], [0.95])  # 0.96 > 0.95, < 0.9975
    assert not _settled(library, [_t(0.93, 0.94, 0.96)], [0.95])


def test_two_winners_must_be_ranked_by_every_sample() -> None:
    library = _t(2.0, 2.1, 2.2)
    apart, close = _t(1.0, 1.1, 1.2), _t(1.15, 1.3, 1.4)
    assert _settled(library, [apart, _t(1.3, 1.4, 1.5)], [0.95, 0.95])
    assert not _settled(library, [apart, close], [0.95, 0.95])


def test_errors_and_a_failed_library_call() -> None:
    failed = Timing(error=RuntimeError("boom"))
    assert _settled(_t(1.0, 1.1), [failed, _t(0.5, 0.6)], [0.95, 0.95])
    assert not _settled(failed, [_t(0.5, 0.6)], [0.95])


def test_a_matrix_vector_product_over_large_weights_is_timed_cold(
        kernel_options, monkeypatch) -> None:  # noqa: ANN001
    """A classifier's 1-row GEMM over 1.3 MB of weights streams them: the caches are evicted
    before every sample; a many-row GEMM, small weights, and a two-output node are timed as
    before (and none of them raises)."""
    import dataclasses

    import torch

    from kiln.ir import parse_graph
    from kiln.kernels import decide, streaming
    from kiln.kernels.contractions import build_contraction_kernels
    from kiln.kernels.decide import Decisions
    from kiln.kernels.streaming import streams_weights
    from kiln.passes.partition import KernelGroup, gemms

    def graph(m: int, k: int, n: int):  # noqa: ANN202
        text = (f"graph(%x: f32[{m}, {k}]) {{\n  %w = constant {{name='w'}} : f32[{k}, {n}]\n"
                f"  %b = constant {{name='b'}} : f32[{n}]\n"
                f"  %y = addmm(%b, %x, %w) {{beta=1, alpha=1}} : f32[{m}, {n}]\n"
                f"  return %y\n}}")
        return parse_graph(text, {"w": torch.randn(k, n), "b": torch.randn(n)})

    classifier, rows, small = graph(1, 640, 512), graph(64, 640, 512), graph(1, 64, 64)
    assert [streams_weights(g, gemms(g)[0]) for g in (classifier, rows, small)] == \
        [True, False, False]
    pool = parse_graph("graph(%x: f32[1, 4, 6, 6]) {\n"
                       "  %xl = to_layout(%x) {channels_last=True} : f32[1, 4, 6, 6]\n"
                       "  %p = max_pool2d(%xl) {kernel=(2, 2), stride=(2, 2), padding=(0, 0), "
                       "dilation=(1, 1), ceil_mode=False} : (f32[1, 4, 3, 3], i64[1, 4, 3, 3])"
                       "\n  return %p#0\n}", {})
    node = next(n for n in pool.nodes if n.name == "p")
    assert not streams_weights(pool, KernelGroup((node,), tuple(node.inputs), node.outputs))

    # the same many-row GEMM in a model whose weights overflow the last-level cache: every
    # call reads them from DRAM
    monkeypatch.setattr(streaming, "last_level_cache_bytes", lambda: 1 << 20)
    assert [streams_weights(g, gemms(g)[0]) for g in (classifier, rows, small)] == \
        [True, True, False]
    monkeypatch.undo()

    evictions = []
    monkeypatch.setattr(decide, "evict_caches", lambda: evictions.append(1))
    measured = dataclasses.replace(kernel_options, measure_kernels=True,
                                   prepacked_library=False)
    build_contraction_kernels(rows, gemms(rows), measured, Decisions(None))
    assert not evictions
    build_contraction_kernels(classifier, gemms(classifier), measured, Decisions(None))
    assert len(evictions) >= 2 * 3  # the library call and the GEMM, 3 rounds at least


def test_a_kernel_over_several_nodes_keeps_a_tie() -> None:
    """One node: its recipe's margin (a GEMM must win by 5%); several (the GEMM with its
    residual's sum): a tie keeps the kernel, which saves their values' round trip."""
    from types import SimpleNamespace

    from kiln.kernels.decide import MARGIN, margin
    from kiln.kernels.plan import Recipe

    def built(recipe: Recipe, nodes: int) -> SimpleNamespace:
        return SimpleNamespace(recipe=recipe, group=SimpleNamespace(nodes=[object()] * nodes))

    assert margin(built(Recipe.GEMM, 1)) == MARGIN[Recipe.GEMM] < 1.0  # type: ignore[arg-type]
    assert margin(built(Recipe.GEMM, 2)) == 1.0  # type: ignore[arg-type]
    assert margin(built(Recipe.DEPTHWISE, 2)) == 1.0  # type: ignore[arg-type]
    assert margin(built(Recipe.LIBRARY, 1)) == MARGIN[Recipe.LIBRARY]  # type: ignore[arg-type]
