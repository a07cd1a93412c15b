"""Compile one ATen-level fx graph: import it, run the engine, or fall back to running it as is.

Shapes: a graph captured with symbolic shapes is specialized per concrete input signature
(retraced at the shapes of the call, compiled once, cached: the `MAX_SHAPES` most recently
called); static graphs compile at once.
First calls: each compiled graph's first call also runs the graph as given (torch runs it)
and compares (`kiln.frontend.agreement`); where kiln's results differ, that graph runs as
given from then on, with a warning: a kiln bug costs speed, never an answer. Graphs that draw
random numbers, write into their inputs or have effects are not run twice. (kiln.compile at
fixed shapes compares with the model instead: ``compare=False``.)
Weights: inputs listed in ``frozen`` become constants; if the caller changes one in place
(an optimizer step, ``load_state_dict``) its version counter moves and the graph recompiles
with the new values, so results never go stale. A call that passes other tensors in those
places gets a graph compiled for them: Dynamo hands the same graph over for every instance
of a module whose code it captured once (parameters are graph inputs, not guarded by
identity), so a graph break inside a repeated layer (JetMoE's router, one graph for all its
layers) reaches kiln with each layer's weights in turn; frozen at the first layer's, every
layer computed with them.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from kiln.engine import CompiledGraph, compile_graph
from kiln.frontend.agreement import Disagreement, disagreement, draws_random
from kiln.frontend.importer import UnsupportedGraph, fill_outputs, import_fx
from kiln.options import Options
from kiln.report import CompileReport

log = logging.getLogger("kiln")

Frozen = Mapping[int, tuple[str, torch.Tensor]]
_Compiled = tuple[CompiledGraph, tuple[Any, ...]]  # the graph and its output template
# a graph with symbolic shapes keeps this many of its compiles, one per input shape, the
# most recently called: each holds its kernels, arena and the weights oneDNN reordered for
# its sizes (HF BERT: 2-170 MB a sequence length, the weights kiln packs being shared,
# `kiln.ir.shared`), so a server that sees every length would otherwise grow without end
MAX_SHAPES = 32
# graphs compiled for other weights in the frozen places (module instances sharing a
# captured graph), at most this many; past it, the weights are plain inputs
MAX_WEIGHT_SETS = 256


def is_static(gm: torch.fx.GraphModule) -> bool:
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        for v in vals:
            if isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and any(
                    not isinstance(d, int) for d in v.shape)):
                return False
    return True


def data_dependent_size(gm: torch.fx.GraphModule) -> tuple[torch.fx.Node, str] | None:
    """The first node whose result has a size (or is a number) known only when it runs, as
    ``nonzero``'s or ``.item()``'s, with the names of those sizes: specializing the graph
    to its input shapes does not make it static."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        unbacked = free_unbacked_symbols(val) if val is not None else ()
        if unbacked:
            return node, ", ".join(sorted(str(s) for s in unbacked))
    return None


class FxGraphRunner:
    """The boxed callable handed back to AOTAutograd (or to kiln.compile's caller)."""

    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule, frozen: Frozen, options: Options,
                 report: CompileReport, device: torch.device, compare: bool = True) -> None:
        """``compare=False``: the caller compares the first call itself (kiln.compile, with
        the model, at fixed shapes)."""
        self.gm = gm
        self.frozen = dict(frozen)
        self.options = options
        self.report = report
        self.device = device
        self._versions = [(i, t, t._version) for i, (_, t) in self.frozen.items()]
        self._static = is_static(gm)
        self._by_signature: OrderedDict[tuple[Any, ...], _Compiled | None] = OrderedDict()
        self._single: _Compiled | None = None
        # compiled graphs not yet compared with the given graph on a first call (by id)
        self._unchecked: set[int] = set()
        self._comparable = compare and options.check_outputs and not draws_random(gm) \
            and not has_effects(gm)
        # the runners for other tensors in the frozen places, by those tensors
        self._others: list[tuple[tuple[torch.Tensor, ...], FxGraphRunner]] = []
        if self._static:
            self._single = self._compile(gm)

    def __call__(self, args: list[Any]) -> list[Any]:
        if any(args[i] is not t for i, (_, t) in self.frozen.items()):
            return self._for_weights(args)(args)
        for _, tensor, version in self._versions:
            if tensor._version != version:
                self._refreeze()
                break
        compiled = self._single if self._static else self._specialized(args)
        if compiled is None:  # kiln could not compile this graph: run the captured ATen
            return self._given(args)
        graph, template = compiled
        checking = id(compiled) in self._unchecked
        given = list(args) if checking else []  # (a boxed call empties ``args``)
        outputs = fill_outputs(template, graph(args))
        if checking:
            self._unchecked.discard(id(compiled))
            expected = self._given(given)
            why = disagreement(expected, outputs)
            if why is not None:
                self._distrust(compiled, why)
                return expected
        return outputs

    def _given(self, args: list[Any]) -> list[Any]:
        """The graph as given, run by torch (a graph of one output may return it bare)."""
        out = self.gm(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def _distrust(self, compiled: _Compiled, why: str) -> None:
        """Run the given graph instead of ``compiled``, which disagreed with it (strict:
        raise `Disagreement`)."""
        message = (f"kiln's compiled graph disagrees with the graph it was given on its first "
                   f"call ({why}; a kiln bug: please report it)")
        if self.options.strict:
            raise Disagreement(message)
        if self._single is compiled:
            self._single = None
        for key, value in self._by_signature.items():
            if value is compiled:
                self._by_signature[key] = None
        self._fell_back(message)

    def _for_weights(self, args: list[Any]) -> FxGraphRunner:
        """The runner whose frozen weights are the tensors ``args`` holds in their places."""
        places = sorted(self.frozen)
        given = tuple(args[i] for i in places)
        for tensors, runner in self._others:  # (() matches any: the one with no frozen weights)
            if all(a is b for a, b in zip(tensors, given)):
                return runner
        if len(self._others) < MAX_WEIGHT_SETS:
            frozen = {i: (self.frozen[i][0], args[i]) for i in places
                      if isinstance(args[i], torch.Tensor)}
        else:
            frozen, given = {}, ()
        runner = FxGraphRunner(self.gm, frozen, self.options, self.report, self.device)
        self._others.append((given, runner))
        return runner

    def _specialized(self, args: list[Any]) -> _Compiled | None:
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a
                    for a in args)
        if key in self._by_signature:
            self._by_signature.move_to_end(key)
            return self._by_signature[key]
        traced = make_fx(self.gm, tracing_mode="fake")(*args)
        compiled = self._by_signature[key] = self._compile(traced)
        if len(self._by_signature) > MAX_SHAPES:  # (the least recently called goes)
            self._by_signature.popitem(last=False)
        return compiled

    def _refreeze(self) -> None:
        log.info("kiln: a frozen weight changed in place; recompiling with the new values")
        self._versions = [(i, t, t._version) for i, t, _ in self._versions]
        self._by_signature.clear()
        if self._static:
            self._single = self._compile(self.gm)

    def _compile(self, gm: torch.fx.GraphModule) -> _Compiled | None:
        start = time.perf_counter()
        try:
            with unset_fake_temporarily():  # AOTAutograd may call us inside its fake mode
                imported = import_fx(gm, self.frozen, self.device)
                compiled = compile_graph(imported.graph, self.options,
                                         imported.tensor_positions, imported.opaque,
                                         started=start)
        except UnsupportedGraph as err:
            if self.options.strict:
                raise
            return self._fell_back(f"kiln cannot compile a graph ({err})")
        except Exception as err:  # noqa: BLE001 - a bug of kiln's must cost speed, not the call
            if self.options.strict:
                raise
            return self._fell_back(f"kiln failed on a graph ({first_line(err)}; a kiln bug: "
                                   f"please report it)")
        if imported.opaque:
            log.info("kiln: ATen ops run as they are: %s", ", ".join(sorted(set(imported.opaque))))
        self.report.graphs.append(compiled.report)
        result = (compiled, imported.output_template)
        if self._comparable:
            self._unchecked.add(id(result))
        return result

    def _fell_back(self, why: str) -> None:
        message = f"{why}; that graph runs eagerly"
        log.warning(message)
        self.report.fallbacks.append(message)


def has_effects(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph calls an op that writes into an argument (``copy_``, ``add_``,
    ``index_put_``) or has an effect (``with_effects``: a check that raises, a print): a
    second run would repeat it."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.higher_order.with_effects:
            return True
        if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
            return True
    return False


def first_line(err: Exception) -> str:
    """``Type: the message's first line``, for a one-line fallback note."""
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def frozen_from_sources(names: Sequence[str | None],
                        tensors: Sequence[Any]) -> dict[int, tuple[str, torch.Tensor]]:
    """Frozen inputs: positions whose source name says parameter or buffer."""
    frozen = {}
    for i, (name, tensor) in enumerate(zip(names, tensors)):
        if name is not None and isinstance(tensor, torch.Tensor):
            frozen[i] = (name, tensor)
    return frozen
