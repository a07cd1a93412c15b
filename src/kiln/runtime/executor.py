"""The executor: turns an optimized graph and its memory plan into one Python function.

Each node becomes one line that calls its ATen kernel directly (no interpretation loop, no
dictionary lookups), planned values are written through ``out=`` into views of a per-thread
arena, and other intermediates are released right after their last use, as eager mode does:

    def kiln_graph(args):
        x, = args[0],
        buf = buffers()
        mm = K2(x, C1, out=buf[0])
        relu = K3(mm)
        del mm
        return [relu]
"""

from __future__ import annotations

import dataclasses
import math
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from kiln.codegen.kernel import layout_check
from kiln.ir.calls import is_pure, results_alias_operands
from kiln.ir.graph import Graph, Node, Value
from kiln.ir.ops import Op, OpGroup
from kiln.ir.semantics import DEVICE, AtenCall, lower_node
from kiln.ir.types import TensorType
from kiln.kernels.outcome import Built
from kiln.passes.layout import channels_last_values
from kiln.runtime.layouts import known_strides, laid_out_as, views_read_in_place
from kiln.runtime.memory import OUT_VARIANTS, MemoryPlan, escaping, lifetimes
from kiln.runtime.scatters import INTO
from kiln.runtime.slot_layouts import SlotLayouts
from kiln.runtime.views import FixedViews
from kiln.tir.nodes import Buffer as TirBuffer
from kiln.tir.nodes import channels_last_strides, contiguous_strides

_SOURCES = (Op.SCALAR, Op.CONSTANT, Op.INPUT)


class Arena:
    """Per-thread planned buffers: concurrent calls from two threads never share memory."""

    def __init__(self, graph: Graph, plan: MemoryPlan, order: Sequence[Value],
                 strides: Mapping[int, tuple[int, ...]] | None = None,
                 views: FixedViews | None = None) -> None:
        self._layout = [(plan.offsets[v], v.type) for v in order]
        # buffers written with other strides (channels-last), as views made once, not on
        # each call (19 as_strided calls a call cost mobilenet_v2 30 us of its 5 ms)
        self._strides = dict(strides or {})
        self._bytes = plan.arena_bytes
        self._device = graph.device
        self._local = threading.local()
        self._views = views  # views of the slots, made once a thread (`kiln.runtime.views`)

    def buffers(self) -> tuple[torch.Tensor, ...]:
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            storage = torch.empty(self._bytes, dtype=torch.uint8, device=self._device)
            bufs = tuple(self._view(storage[off:off + t.nbytes].view(t.dtype.torch), i, t)
                         for i, (off, t) in enumerate(self._layout))
            if self._views is not None and self._views.recipes:
                bufs = self._views.made(bufs)
            self._local.bufs = bufs
        return bufs

    def _view(self, flat: torch.Tensor, index: int, t: TensorType) -> torch.Tensor:
        """Buffer ``index`` of type ``t`` over its bytes ``flat``, with its strides."""
        strides = self._strides.get(index)
        return flat.view(t.shape) if strides is None else flat.as_strided(t.shape, strides)


class StepTimer(Protocol):
    def start(self) -> None: ...

    def stop(self, step: int) -> None: ...


class KernelFallbackWarning(UserWarning):
    """A generated kernel's operand came laid out otherwise than the kernel reads it, so its
    group's library ops ran instead: the right result, more slowly."""


class Fallbacks:
    """Counts, per generated kernel (named by its group's last node), the calls whose operand
    layout check failed, so that the group's library ops ran; warns on a kernel's first."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, node: str, ops: str) -> None:
        self.counts[node] += 1
        if self.counts[node] == 1:
            warnings.warn(
                f"kiln: the generated kernel for node {node!r} ({ops}) got an operand laid "
                f"out otherwise than compiled for (strided or not contiguous); its library "
                f"ops ran instead, which is slower. Pass contiguous inputs, or compile with "
                f"inputs laid out as they will come.", KernelFallbackWarning, stacklevel=2)


class ThreadSync:
    """Keeps the generated kernels' thread count equal to torch.get_num_threads(), checked
    once per graph call (a changed count is passed on to every kernel)."""

    def __init__(self, kernels: Sequence[Any]) -> None:
        self._kernels = list(dict.fromkeys(kernels))
        self._threads: int | None = None  # set on the first call

    def __call__(self) -> None:
        threads = torch.get_num_threads()
        if threads != self._threads:
            for kernel in self._kernels:
                kernel.set_num_threads(threads)
            self._threads = threads


def build_executor(graph: Graph, plan: MemoryPlan | None, input_positions: Sequence[int],
                   kernels: Sequence[Built] = (), step_timer: StepTimer | None = None,
                   fallbacks: Fallbacks | None = None, writes: frozenset[Node] = frozenset()
                   ) -> tuple[Callable[[list[Any]], list[Any]], str]:
    """A function of the boxed call arguments returning the graph outputs, and its source.

    Each of ``kernels`` replaces its group's nodes (gathered together by
    `kiln.passes.partition.gather`) with one call at the group's last node. With a
    ``step_timer``, each step (a library call or a kernel call, numbered in run order) runs
    between ``step_timer.start()`` and ``step_timer.stop(step)``: the report's profile.
    A kernel whose operand layout check fails runs its group's library ops instead and
    tells ``fallbacks`` (a new `Fallbacks` where None). The scatters in ``writes`` write
    into their base (`kiln.runtime.scatters`).
    """
    # v<position>_<label>: the position keeps names distinct whatever the labels are
    names = {node: f"v{i}_{''.join(c if c.isalnum() else '_' for c in node.name)}"
             for i, node in enumerate(graph.all_nodes())}
    env: dict[str, Any] = {"FELL_BACK": fallbacks if fallbacks is not None else Fallbacks()}
    planned = list(plan.offsets) if plan else []
    slot = {v: i for i, v in enumerate(planned)}
    slot_strides: dict[int, tuple[int, ...]] = {}  # planned values written strided
    lines = ["def kiln_graph(args):"]
    if graph.inputs:
        unpack = ", ".join(names[n] for n in graph.inputs)
        fetch = ", ".join(f"args[{p}]" for p in input_positions)
        lines.append(f"    {unpack}, = {fetch},")
    lines.append("    args.clear()")  # the caller's references go; ours die at last use
    nhwc_values = channels_last_values(graph)
    entry_dense = _inputs_made_dense(graph, kernels, writes, nhwc_values)
    for node in entry_dense:
        name = names[node]
        lines.append(f"    {name} = {name} if {name}.is_contiguous() else {name}.contiguous()")
    compiled = [gk.kernel for gk in kernels if gk.generated]
    if compiled:
        env["sync_threads"] = ThreadSync(compiled)  # type: ignore[arg-type]
        lines.append("    sync_threads()")
    if plan and planned:  # (the arena is made once its strides are known: at the end)
        lines.append("    buf = buffers()")
    fixed = FixedViews(first_index=len(planned))  # the slots and views bound every call alike

    def ref(value: Value) -> str:
        node = value.node
        if node.op is Op.SCALAR:
            return _literal(env, node.attrs.value)  # type: ignore[attr-defined]
        if len(node.types) > 1:
            return f"{names[node]}__{value.index}"
        return names[node]

    spans = lifetimes(graph, writes)
    outputs = set(graph.outputs) | escaping(graph, writes)
    member_of = {n: gk for gk in kernels for n in gk.group.nodes}
    internal = {v for gk in kernels for n in gk.group.nodes for v in n.outputs
                if v not in gk.outputs}  # never materialized by the kernel

    # a library op's result the IR expects NHWC (an add or a cat in a channels-last chain)
    # gets its slot with NHWC strides: its out= variant writes what it would have allocated
    # (into a contiguous slot, ATen's cat.out ran 4x slower and every later convolution and
    # pooling read NCHW: inception's average pools took 5 ms instead of 0.1 ms each)
    nhwc_slots = {v for v in nhwc_values & set(slot)
                  if v.node not in member_of and len(v.type.shape) == 4}
    # a library op's result that a generated kernel reads (through views) is taken to be
    # contiguous there (`kiln.kernels.strides`); ATen may keep an operand's layout, so it is
    # made so
    made_dense = _library_results_read_by_kernels(graph, kernels, nhwc_values, writes)
    # an elementwise library op's slot laid out as ATen would lay out its result
    slot_layouts = SlotLayouts(graph, [v for gk in kernels if gk.generated for v in gk.inputs])
    # strides fixed by the IR, and the views between generated kernels that need not run
    known = {**known_strides(graph, kernels, slot, nhwc_slots),
             **{n.out(): contiguous_strides(n.out().type.shape) for n in entry_dense}}
    in_place = views_read_in_place(graph, kernels, known, outputs)

    dies_at: dict[int, list[str]] = {}
    dense: dict[str, str] = {}  # views copied dense for the kernels: name -> the copy's
    for value, span in spans.items():
        if (value not in outputs and value not in slot and value.node.op not in _SOURCES
                and value not in internal and value not in in_place):
            dies_at.setdefault(span.last, []).append(ref(value))

    def library_line(node: Node, use_slot: bool = True) -> str:
        call = lower_node(node)
        if node in writes:  # (its result is its base: no slot, no list)
            call = dataclasses.replace(call, target=INTO[call.target], returns_list=False)
            use_slot = False
        if not node.types:  # run for its effect only
            return _call_text(env, node, call, ref, None, graph.device)
        targets = ", ".join(ref(v) for v in node.outputs)
        if node.op in _METHOD_VIEWS:  # the Tensor method: ~1 us a call below the op's kernel
            return f"{targets} = {ref(node.inputs[0])}.{_METHOD_VIEWS[node.op](node.attrs)}"
        out = f"buf[{slot[node.out()]}]" if use_slot and node.out() in slot else None
        operand = ref
        if node.op is Op.CALL and is_pure(node):  # (see `dense_operand`)
            dense_name = _bind(env, "DENSE", dense_operand)
            operand = lambda v: ref(v) if v.node.op is Op.SCALAR else f"{dense_name}({ref(v)})"  # noqa: E731
        if out is not None and node.out() in nhwc_slots:
            slot_strides[slot[node.out()]] = channels_last_strides(tuple(node.out().type.shape))
        elif out is not None and (strides := slot_layouts.strides(
                node, lambda v: slot_strides.get(slot[v]) if v in slot else None)) is not None:
            slot_strides[slot[node.out()]] = strides
        if out is not None:
            fixed.fix_slot(node.out(), slot[node.out()], slot_strides.get(slot[node.out()]))
        unpack = len(node.types) > 1 or (call.returns_list and call.select is None)
        return (f"{targets}{',' if unpack else ''} = "
                f"{_call_text(env, node, call, operand, out, graph.device)}")

    if step_timer is not None:
        env["TIMER_start"], env["TIMER_stop"] = step_timer.start, step_timer.stop
    step = 0

    def timed(step_lines: list[str]) -> list[str]:
        nonlocal step
        if step_timer is None:
            return step_lines
        step += 1
        return ["    TIMER_start()", *step_lines, f"    TIMER_stop({step - 1})"]

    pending: list[str] = []  # deaths inside a group wait for its kernel call
    for i, node in enumerate(graph.nodes):
        if node.op is Op.SCALAR:
            continue
        if node.op is Op.CONSTANT:
            env[names[node]] = graph.constant(node)
            continue
        gk = member_of.get(node)
        if gk is None and node.outputs and node.out() in in_place:
            lines += timed([])  # (a step still, so the profile's steps stay the report's)
        elif gk is None:  # (a view of a slot: made once, `kiln.runtime.views`)
            made = fixed.derive(node, outputs)
            targets = ", ".join(ref(v) for v in node.outputs)
            line = library_line(node) if made is None else \
                f"{targets} = {', '.join(f'buf[{k}]' for k in made)}"
            step_lines = [f"    {line}"]
            if made is None and node.outputs and node.out() in made_dense:
                step_lines.append(f"    {targets} = {targets}.contiguous()")
            lines += timed(step_lines)
        else:
            pending += dies_at.pop(i, [])
            if node is not gk.group.last:
                continue
            lines += timed(_kernel_lines(env, gk, graph, ref, slot, library_line, known,
                                         in_place, dense, slot_strides, fixed))
            dies_at[i] = pending + dies_at.get(i, [])
            pending = []
        if dies_at.get(i):  # (with the dense copies of views that die)
            gone = dies_at[i] + [dense.pop(name) for name in dies_at[i] if name in dense]
            lines.append(f"    del {', '.join(gone)}")
    constants_out = [v for v in graph.outputs if v.node.op is Op.CONSTANT]
    for v in constants_out:  # a constant output is still the caller's own tensor
        env[names[v.node]] = graph.constant(v.node)
    results = ", ".join(ref(v) if v.node.op is not Op.CONSTANT else f"{ref(v)}.clone()"
                        for v in graph.outputs)
    lines.append(f"    return [{results}]")
    if plan and planned:
        env["buffers"] = Arena(graph, plan, planned, slot_strides, fixed).buffers
    source = "\n".join(lines) + "\n"
    code = compile(source, "<kiln graph>", "exec")
    exec(code, env)  # noqa: S102 - source generated above from the IR, nothing user-given
    return env["kiln_graph"], source


def _inputs_made_dense(graph: Graph, kernels: Sequence[Built], writes: frozenset[Node],
                       nhwc: set[Value]) -> list[Node]:
    """The graph inputs that generated kernels read, directly or through views: each is
    compiled for the input's contiguous layout (`kiln.kernels.strides` takes a view's
    source to be contiguous), so a strided input (a graph torch.compile split off passes
    its neighbour's permuted or expanded tensor) is copied dense once at entry, where every
    such kernel would run its library ops instead. Not an input the graph writes into, nor
    one the caller gets back (a copy would break the aliasing), nor an NHWC one, nor one a
    library op reads too (directly or through views): that op gets the input as eager mode
    does, since some of ATen's ops give other values in another layout (the erf form of
    GELU is inf at inf in its scalar loop, over a strided input, and NaN vectorized)."""
    keep = escaping(graph, writes) | nhwc
    library_reads = _read_by_library(graph, kernels)

    for node in writes:  # (the base a scatter writes into)
        value = node.inputs[0]
        while value.node.op.is_a(OpGroup.VIEW):
            value = value.node.inputs[0]
        keep.add(value)
    found: dict[Node, None] = {}
    for gk in kernels:
        if not gk.generated:
            continue
        for value in gk.inputs:
            while value.node.op.is_a(OpGroup.VIEW):
                value = value.node.inputs[0]
            if value.node.op is Op.INPUT and value not in keep and \
                    isinstance(value.type, TensorType):
                found[value.node] = None
    return [node for node in found if not library_reads(node.out())]


def _read_by_library(graph: Graph, kernels: Sequence[Built]) -> Callable[[Value], bool]:
    """Whether a library op (not a generated kernel) reads a value, directly or through
    views."""
    generated = {n for gk in kernels if gk.generated for n in gk.group.nodes}
    users = graph.users()

    def reads(value: Value) -> bool:
        todo = [u for u in users.get(value.node, []) if value in u.inputs]
        while todo:
            user = todo.pop()
            if user.op.is_a(OpGroup.VIEW):
                todo.extend(users.get(user, []))
            elif user not in generated:
                return True
        return False

    return reads


def _library_results_read_by_kernels(graph: Graph, kernels: Sequence[Built], nhwc: set[Value],
                                     writes: frozenset[Node]) -> set[Value]:
    """The single results of library ops (opaque calls, ATen ops no generated kernel took)
    that generated kernels read, directly or through views, other than NHWC ones: each such
    kernel is compiled for the value's contiguous layout (`kiln.kernels.strides`), where ATen
    may keep an operand's (slice_scatter clones its input: Funnel's relative attention; an
    average pool or a product of a transposed view keeps its strides: SEW-D's and Encodec's
    front ends failed their kernels' layout checks on every call). Not, besides an opaque
    call's, a result a library op reads too: that op gets it as eager mode does (see
    `_inputs_made_dense`)."""
    generated = {n for gk in kernels if gk.generated for n in gk.group.nodes}
    library_reads = _read_by_library(graph, kernels)
    found: set[Value] = set()
    laid_out: set[Value] = set()  # read in place with other strides (an NHWC operand)
    for gk in kernels:
        if not gk.generated:
            continue
        buffers = gk.kernel.func.inputs  # type: ignore[union-attr]
        for value, buffer in zip(gk.inputs, buffers):
            if _strides(buffer) is not None:
                laid_out.add(value)
            while value.node.op.is_a(OpGroup.VIEW):
                value = value.node.inputs[0]
            node = value.node
            if node.op.is_a(OpGroup.SOURCE) or node in generated or node in writes \
                    or len(node.types) != 1 or value in nhwc:
                continue
            if node.op is Op.CALL and results_alias_operands(node):
                continue  # (a copy would break the alias)
            if node.op is not Op.CALL and library_reads(value):
                continue
            found.add(value)
    return found - laid_out


def _kernel_lines(env: dict[str, Any], gk: Built, graph: Graph,
                  ref: Callable[[Value], str], slot: dict[Value, int],
                  library_line: Callable[[Node, bool], str],
                  known: Mapping[Value, tuple[int, ...]],
                  in_place: Mapping[Value, Value], dense: dict[str, str],
                  slot_strides: dict[int, tuple[int, ...]], fixed: FixedViews) -> list[str]:
    """The kernel call. An operand the kernel reads dense whose strides are not ``known``
    to be so (`kiln.runtime.layouts`: a strided view by the IR, a graph input or a library
    result that may come strided) is read from ``.contiguous()``, a copy only where it is
    not dense, made before the first such call (``dense``: a value's name -> its copy's,
    dropped where the value dies). One read with other strides (a view where it lies, NHWC)
    is checked: if the check fails, the group's library calls run instead. One of the
    views ``in_place`` is read through its source's pointer. A library kernel (a library entry
    point on prepared weights) takes tensors and returns its output: no check, no slot."""
    if not gk.generated:
        fn = _bind(env, "LIB", gk.kernel.fn)  # type: ignore[union-attr]
        (out,) = gk.outputs
        return [f"    {ref(out)} = {fn}({', '.join(ref(v) for v in gk.inputs)})"]
    params = gk.kernel.func  # type: ignore[union-attr]
    pointers = []
    for v in gk.inputs:
        if v.node.op is Op.CONSTANT:
            tensor = gk.weight(graph, v)  # kept alive by env
            _bind(env, "W", tensor)
            pointers.append(_bind(env, "P", tensor.data_ptr()))
        else:
            pointers.append(f"{ref(in_place.get(v, v))}.data_ptr()")
    allocs = []
    for v, buffer in zip(gk.outputs, params.outputs):
        strides = _strides(buffer)
        if v in slot:  # (a strided one's view made by the arena: ``slot_strides``)
            if strides is not None:
                slot_strides[slot[v]] = strides
            allocs.append(f"{ref(v)} = buf[{slot[v]}]")
        else:
            dtype = _bind(env, "DT", v.type.dtype.torch)
            empty = _bind(env, "EMPTY", torch.empty) if strides is None else \
                _bind(env, "EMPTY_STRIDED", torch.empty_strided)
            size = repr(tuple(v.type.shape)) + ("" if strides is None else f", {strides!r}")
            allocs.append(f"{ref(v)} = {empty}({size}, dtype={dtype})")
        pointers.append(f"{ref(v)}.data_ptr()")
    checks, copies, temps = [], [], []
    for v, buffer in dict(zip(gk.inputs, params.inputs)).items():
        if v.node.op is Op.CONSTANT or laid_out_as(v, buffer, known):
            continue
        strides = _strides(buffer)
        if strides is None and v not in in_place:
            # read dense by the kernel, not known to be: one copy where it is not (none
            # where it is), shared by the kernels after it. By its IR a strided view (T5's
            # position bias, a permute of an embedding, in each layer's softmax prologue),
            # or strided at run time only (BigBird's key and value, transposed graph inputs
            # after a torch.compile graph break, which a library op reads too): the check
            # failed on every call and the library ops ran instead (T5: 200 us against a 74
            # us kernel; BigBird-Pegasus through torch.compile 1.04x eager, 1.96x without)
            pointer = f"{ref(v)}.data_ptr()"
            if ref(v) not in dense:
                dense[ref(v)] = f"{ref(v)}_dense"
                copies.append(f"    {dense[ref(v)]} = {ref(v)}.contiguous()")
            pointers = [f"{dense[ref(v)]}.data_ptr()" if p == pointer else p for p in pointers]
            continue
        channels_last = strides is not None and len(strides) == 4 and \
            strides == channels_last_strides(buffer.shape)
        if strides is not None and not channels_last and v not in in_place and \
                disjoint(buffer.shape, strides):
            # read with strides of the kernel's own (a view where it lies): where it
            # comes otherwise (a view of an input that came transposed: BigBird's bmm
            # operands after a torch.compile graph break), a copy laid out so; the check
            # failed there on every call and the library ops ran instead
            relay = _bind(env, "RELAID", relaid(buffer, layout_check(buffer)))
            temp = f"{ref(v)}_relaid{len(temps)}"
            copies.append(f"    {temp} = {relay}({ref(v)})")
            temps.append(temp)
            pointer = f"{ref(v)}.data_ptr()"
            pointers = [f"{temp}.data_ptr()" if p == pointer else p for p in pointers]
            continue
        if channels_last:  # (NCHW where the IR could not foresee it: ATen's ops, as eager)
            fmt = _bind(env, "CHANNELS_LAST", torch.channels_last)
            checks.append(f"{ref(v)}.is_contiguous(memory_format={fmt})")
        elif strides is not None:  # any other strides: the kernel's own test of them
            checks.append(f"{_bind(env, 'LAYOUT_OK', layout_check(buffer))}({ref(v)})")
    call = f"{_bind(env, 'KERNEL', gk.kernel.run_unchecked)}({', '.join(pointers)})"
    # the library calls allocate (a kernel output's slot may have no out= kernel to fill it)
    library = [library_line(n, False) for n in gk.group.nodes]
    library += [f"{ref(v)} = {ref(v)}.contiguous()" for v in gk.outputs
                if v not in strided_outputs(gk)]  # (those may have any layout after it)
    named = [ref(v) for n in gk.group.nodes for v in n.outputs if v not in gk.outputs]
    library += [f"del {', '.join(named)}"] if named else []
    calls = [call]
    if gk.library_where_not_finite:  # (the library's own answers for non-finite operands)
        # a sum is NaN or infinite wherever an element is (or, rarely, where it overflows:
        # the library then runs, as right): 32 us for Whisper's 768 K floats where
        # isfinite().all() took 1.1 ms, 10 against 156 us for BERT's 98 K
        isfinite = _bind(env, "ISFINITE", math.isfinite)
        finite = " and ".join(f"{isfinite}(float({ref(v)}.sum()))" for v in gk.outputs)
        calls += [f"if not ({finite}):"] + [f"    {line}" for line in library]
    if gk.run_if is not None:  # the kernel where its test passes, else the library (no
        test, positions = gk.run_if  # warning: `Built.run_if` is part of the design)
        ran = f"{_bind(env, 'RUN_IF', test)}({', '.join(ref(gk.inputs[i]) for i in positions)})"
        calls = [f"if {ran}:", *(f"    {c}" for c in calls), "else:",
                 *(f"    {line}" for line in library)]
    gone = [f"    del {', '.join(temps)}"] if temps else []
    if not checks:
        if not gk.may_run_library:  # (its outputs' slots hold them on every call)
            for v, buffer in zip(gk.outputs, params.outputs):
                if v in slot:
                    fixed.fix_slot(v, slot[v], slot_strides.get(slot[v], _strides(buffer)))
        return copies + [f"    {a}" for a in allocs] + [f"    {c}" for c in calls] + gone
    ops = "+".join(n.op.text for n in gk.group.nodes)
    fallback = [f"FELL_BACK({gk.group.last.name!r}, {ops!r})", *library]
    return (copies + [f"    if {' and '.join(checks)}:"] + [f"        {a}" for a in allocs]
            + [f"        {c}" for c in calls] + ["    else:"]
            + [f"        {line}" for line in fallback] + gone)


def disjoint(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether no two elements of a tensor with these strides share memory (an expanded
    view's 0 strides do): only then can a copy be laid out so."""
    extent = 1
    for stride, size in sorted((s, n) for n, s in zip(shape, strides) if n > 1):
        if stride < extent:
            return False
        extent = stride * size
    return True


def relaid(buffer: TirBuffer, laid_out: Callable[[torch.Tensor], bool]
           ) -> Callable[[torch.Tensor], torch.Tensor]:
    """A tensor as ``buffer`` lays it out: itself where ``laid_out`` says so, else a copy
    with the buffer's (disjoint) strides."""
    shape, strides = tuple(buffer.shape), tuple(buffer.strides or ())

    def relay(t: torch.Tensor) -> torch.Tensor:
        return t if laid_out(t) else torch.empty_strided(shape, strides, dtype=t.dtype).copy_(t)
    return relay


# views run as Tensor methods, which dispatch faster than the op's kernel from Python (1.8 us
# for aten.permute's, 0.9 us for Tensor.permute; a 1x1 convolution as a GEMM adds four)
_METHOD_VIEWS: dict[Op, Callable[[Any], str]] = {
    Op.PERMUTE: lambda a: f"permute{tuple(a.dims)!r}" if a.dims else "permute(())",  # (0-d)
    Op.VIEW: lambda a: f"reshape({tuple(a.shape)!r})",  # (as the IR's view runs: a reshape)
}


def strided_outputs(gk: Built) -> set[Value]:
    """The outputs a generated kernel writes with other than contiguous strides."""
    if not gk.generated:
        return set()
    func = gk.kernel.func  # type: ignore[union-attr]
    return {v for v, b in zip(gk.outputs, func.outputs) if _strides(b) is not None}


def _strides(buffer: TirBuffer) -> tuple[int, ...] | None:
    """The buffer's strides where they are not the contiguous ones."""
    if buffer.strides is None or buffer.strides == contiguous_strides(buffer.shape):
        return None
    return tuple(buffer.strides)


def dense_operand(t: Any) -> Any:
    """An opaque ATen call's tensor operand, copied where its strides are neither the
    standard ones nor, for 4 dims, the channels-last ones (those of dims of size 1
    included: ATen's kernels judge a layout by all strides). The capture saw the eager
    operand, and kiln's views may hand the call another: aten.native_group_norm raises on
    a tensor contiguous in no memory format (HF BiT: a channel slice of two merged 1x1
    convolutions' GEMM; MobileViT-v2: a reshaped unfold), which eager's group_norm had
    made contiguous before the capture."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return t
    shape, strides = tuple(t.shape), t.stride()
    if strides == contiguous_strides(shape) or (
            t.dim() == 4 and strides == channels_last_strides(shape)):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _call_text(env: dict[str, Any], node: Node, call: AtenCall, ref: Callable[[Value], str],
               out: str | None, device: torch.device) -> str:
    target = OUT_VARIANTS[node.op] if out is not None else call.target
    # an OpOverload's raw kernel skips a Python layer; fused ops are plain functions
    kernel = _bind(env, f"K_{node.op.text}", getattr(target, "_op", target))
    args = [_arg(env, a, node, ref, device) for a in call.args]
    kwargs = [f"{k}={_arg(env, v, node, ref, device)}" for k, v in call.kwargs.items()]
    if out is not None:
        kwargs.append(f"out={out}")
    text = f"{kernel}({', '.join(args + kwargs)})"
    return text if call.select is None or out is not None else f"{text}[{call.select}]"


def _arg(env: dict[str, Any], template: Any, node: Node, ref: Callable[[Value], str],
         device: torch.device) -> str:
    from kiln.ir.attrs import Operand

    if isinstance(template, Operand):
        return ref(node.inputs[template.index])
    if template is DEVICE:
        return _bind(env, "DEVICE", device)
    if isinstance(template, list) and any(isinstance(t, Operand) for t in template):
        return "[" + ", ".join(_arg(env, t, node, ref, device) for t in template) + "]"
    return _literal(env, template)


def _literal(env: dict[str, Any], value: Any) -> str:
    if value is None or isinstance(value, (bool, str)):
        return repr(value)
    if isinstance(value, int) or (isinstance(value, float) and value == value
                                  and value not in (float("inf"), float("-inf"))
                                  and str(value) != "-0.0"):
        return repr(value)
    return _bind(env, "L", value)


def _bind(env: dict[str, Any], prefix: str, value: Any) -> str:
    """Put a Python object into the generated function's globals; returns its name (the
    same for the same object: found by identity in a side table, not by a scan of the
    globals, which was quadratic in a graph's calls)."""
    bound = env.setdefault("_kiln_bound", {})
    name = bound.get((prefix, id(value)))
    if name is not None:
        return name
    name = f"{prefix}{len(env)}"
    env[name] = value
    bound[(prefix, id(value))] = name  # (env keeps ``value`` alive: its id stays its own)
    return name
