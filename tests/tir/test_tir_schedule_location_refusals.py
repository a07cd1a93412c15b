"""Every refusal of compute_at, reverse_compute_at and compute_inline, each on the smallest
program that triggers it (most are lowered chains; a few are lowered programs edited by
hand into shapes no lowering produces)."""

from __future__ import annotations

import dataclasses

import pytest
import tir_cases as C

from kiln.ir import attrs as A
from kiln.ir.builder import GraphBuilder
from kiln.ir.ops import Op
from kiln.ir.types import TensorType
from kiln.tir.lower import lower_chain
from kiln.tir.nodes import Allocate, Binary, BinOp, Block, BufferStore, Load, PrimFunc, SeqStmt, seq
from kiln.tir.primitives.common import find_block
from kiln.tir.schedule import Schedule, ScheduleError
from kiln.tir.visit import replace_node


def _edit_block(func: PrimFunc, block_name: str, **changes: object) -> PrimFunc:
    block = find_block(func, block_name).stmt
    assert isinstance(block, Block)
    return func.with_body(replace_node(func.body, block, dataclasses.replace(block, **changes)))


def _swapped_nests(func: PrimFunc) -> PrimFunc:
    """add_relu with the relu nest first: the consumer runs before its producer."""
    assert isinstance(func.body, Allocate) and isinstance(func.body.body, SeqStmt)
    first, second = func.body.body.stmts
    return func.with_body(dataclasses.replace(func.body, body=SeqStmt((second, first))))


def _chain(*ops: tuple[Op, object]):
    """x: f32[4, 4] through ``ops`` (each applied to the previous value), all lowered."""
    b = GraphBuilder()
    v = b.input("x", TensorType((4, 4), C.F32))
    nodes = []
    for op, attrs in ops:
        v = b.op(op, v, attrs=attrs) if attrs is not None else b.op(op, v)
        nodes.append(v.node)
    return lower_chain(nodes, [v]).func


# -- compute_at ----------------------------------------------------------------------------


def test_compute_at_refuses_a_block_writing_two_buffers() -> None:
    func = C.add_relu()[1].func
    add = find_block(func, "add").stmt
    assert isinstance(add, Block) and isinstance(add.body, BufferStore)
    relu_buf = find_block(func, "relu").stmt.body.buffer  # type: ignore[union-attr]
    second = BufferStore(relu_buf, add.body.indices, add.body.value)
    func = _edit_block(func, "add", body=seq(add.body, second))
    with pytest.raises(ScheduleError, match="writes 2 buffers, not one"):
        Schedule(func).compute_at("add", "i0_1")


def test_compute_at_refuses_a_permuted_store() -> None:
    func = C.add_relu(4, 4)[1].func
    add = find_block(func, "add").stmt
    assert isinstance(add, Block) and isinstance(add.body, BufferStore)
    transposed = dataclasses.replace(add.body, indices=add.body.indices[::-1])
    func = _edit_block(func, "add", body=transposed)
    with pytest.raises(ScheduleError, match="not indexed by its spatial iter vars in order"):
        Schedule(func).compute_at("add", "i0_1")


def test_compute_at_refuses_when_a_reader_is_outside_the_loop() -> None:
    b = GraphBuilder()
    x = b.input("x", TensorType((3, 4), C.F32))
    s = b.op(Op.ADD, x, x)
    r = b.op(Op.RELU, s)
    n = b.op(Op.NEG, s)
    func = lower_chain([s.node, r.node, n.node], [r, n]).func
    sch = Schedule(func)
    relu_loop = sch.get_loops("relu")[0]
    with pytest.raises(ScheduleError, match="reads add outside the loop"):
        sch.compute_at("add", relu_loop)


def test_compute_at_refuses_a_loop_that_runs_before_the_producer() -> None:
    func = _swapped_nests(C.add_relu()[1].func)
    with pytest.raises(ScheduleError, match="runs after the loop"):
        Schedule(func).compute_at("add", "i0_1")


# -- reverse_compute_at --------------------------------------------------------------------


def test_reverse_compute_at_refuses_a_reduction_consumer() -> None:
    func = _chain((Op.RELU, None), (Op.SUM, A.ReduceAttrs((1,))))
    sch = Schedule(func)
    names = sch.blocks()
    with pytest.raises(ScheduleError, match="is a reduction"):
        sch.reverse_compute_at(names[1], sch.get_loops(names[0])[0])


def test_reverse_compute_at_refuses_a_consumer_reading_other_positions() -> None:
    func = _chain((Op.RELU, None), (Op.PERMUTE, A.PermuteAttrs((1, 0))))
    sch = Schedule(func)
    relu, perm = sch.blocks()
    with pytest.raises(ScheduleError, match="at other positions than its own"):
        sch.reverse_compute_at(perm, sch.get_loops(relu)[0])


def test_reverse_compute_at_refuses_a_buffer_also_written_outside_the_loop() -> None:
    b = GraphBuilder()
    x = b.input("A", TensorType((3, 5), C.F32))
    w = b.input("B", TensorType((5, 4), C.F32))
    mm = b.op(Op.MM, x, w)
    r = b.op(Op.RELU, mm)
    sch = Schedule(lower_chain([mm.node, r.node], [r]).func)
    i, j, k = sch.get_loops("mm")
    # mm_init also writes mm, inside i: not once before the k loop, so relu cannot follow k
    sch.decompose_reduction("mm", j)
    with pytest.raises(ScheduleError, match="mm is also written outside it, by block "
                                            "mm_init, not once before it"):
        sch.reverse_compute_at("relu", k)


def test_reverse_compute_at_refuses_a_consumer_that_runs_first() -> None:
    func = _swapped_nests(C.add_relu()[1].func)
    with pytest.raises(ScheduleError, match="runs before the loop"):
        Schedule(func).reverse_compute_at("relu", "i0")


# -- compute_inline ------------------------------------------------------------------------


def test_compute_inline_refuses_a_body_that_is_not_one_store() -> None:
    func = C.add_relu()[1].func
    add = find_block(func, "add").stmt
    assert isinstance(add, Block)
    func = _edit_block(func, "add", body=seq(add.body, add.body))
    with pytest.raises(ScheduleError, match="not a single store"):
        Schedule(func).compute_inline("add")


def test_compute_inline_refuses_a_permuted_store() -> None:
    func = C.add_relu(4, 4)[1].func
    add = find_block(func, "add").stmt
    assert isinstance(add, Block) and isinstance(add.body, BufferStore)
    func = _edit_block(func, "add", body=dataclasses.replace(
        add.body, indices=add.body.indices[::-1]))
    with pytest.raises(ScheduleError, match="not indexed by the iter vars in order"):
        Schedule(func).compute_inline("add")


def test_compute_inline_refuses_a_block_reading_its_own_output() -> None:
    func = C.add_relu()[1].func
    add = find_block(func, "add").stmt
    assert isinstance(add, Block) and isinstance(add.body, BufferStore)
    store = add.body
    accumulate = dataclasses.replace(store, value=Binary(BinOp.ADD, Load(store.buffer,
                                                                         store.indices),
                                                         store.value))
    func = _edit_block(func, "add", body=accumulate)
    with pytest.raises(ScheduleError, match="reads its own output"):
        Schedule(func).compute_inline("add")


def test_compute_inline_refuses_a_buffer_with_two_writers() -> None:
    func = C.add_relu()[1].func
    assert isinstance(func.body, Allocate) and isinstance(func.body.body, SeqStmt)
    add_nest, relu_nest = func.body.body.stmts
    # a renamed copy of the add nest: a second block that writes the same buffer
    copy = _edit_block(func.with_body(add_nest), "add", name="add_again").body
    twice = func.with_body(dataclasses.replace(func.body,
                                               body=SeqStmt((add_nest, copy, relu_nest))))
    with pytest.raises(ScheduleError, match="another block also writes add"):
        Schedule(twice).compute_inline("add")


def test_reverse_compute_at_refuses_when_the_loop_leaves_elements_to_an_earlier_writer() -> None:
    b = GraphBuilder()
    x = b.input("A", TensorType((3, 5), C.F32))
    w = b.input("B", TensorType((5, 4), C.F32))
    mm = b.op(Op.MM, x, w)
    r = b.op(Op.RELU, mm)
    lowered = lower_chain([mm.node, r.node], [r])
    sch = Schedule(lowered.func)
    i, _, k = sch.get_loops("mm")
    sch.decompose_reduction("mm", i)  # mm_init runs once, before the nest: allowed
    # ... unless the nest leaves some rows of mm to it: cut the i loop to 2 of 3 rows
    loop = find_block(sch.func, "mm").loops[0]
    short = sch.func.with_body(replace_node(sch.func.body, loop,
                                            dataclasses.replace(loop, extent=2)))
    with pytest.raises(ScheduleError, match="does not write all of it along dimension 0"):
        Schedule(short).reverse_compute_at("relu", k)
    accepted = Schedule(sch.func)
    accepted.reverse_compute_at("relu", k)  # the whole nest writes every element: accepted
    C.check_same(b.build(r), lowered, accepted.func)  # relu after every k step: last wins


def test_compute_at_refuses_to_rerun_an_init_at_every_reduction_step() -> None:
    graph, low = C.mm(3, 4, 5)
    sch = Schedule(low.func)
    i, j, k = sch.get_loops("mm")
    sch.decompose_reduction("mm", i)
    with pytest.raises(ScheduleError, match="block mm accumulates into mm over loop k0; "
                                            "mm_init would run again"):
        sch.compute_at("mm_init", k)
    outer_k = Schedule(low.func)
    i, j, k = outer_k.get_loops("mm")
    outer_k.reorder(k, i, j)
    outer_k.decompose_reduction("mm", k)
    with pytest.raises(ScheduleError, match="over loop k0"):  # k encloses j: same rerun
        outer_k.compute_at("mm_init", j)
    sch.compute_at("mm_init", j)  # once per (i, j), before its reduction: accepted
    C.check_same(graph, low, sch.func)
