"""Whether a built kernel agrees with its group's library calls, asked once per kernel.

`agrees_with_library` runs the kernel and the library calls on seeded random operands and
the real weights. What the check tests is the kernel's code: its source, compiler and flags
(or the library call it makes), on the group's nodes, the operands' types and strides, the
thread count, torch and the machine. Ordinary weights (finite, at most `ORDINARY_BOUND` in
magnitude) take the same code path whatever their values, so the answer for one layer's
weights is the answer for every layer with the same kernel: Swin2SR's cold compile ran 252
checks of GEMMs that 72 layers share, 13 s of its 76 (under cProfile). A weight with an
infinity, a NaN or a huge value is another matter (0 * inf, overflow in one summation order
and not the other): its kernel is checked on those very values, keyed by their digest
(`weight_digest`). `Checks` keeps each answer under a key of all of that: in memory for one
compile, and in the decisions database (`kiln.kernels.decide.Decisions`) for the next one. A
changed kernel, torch, weight layout, or a weight turning non-finite is a new key: the check
runs again."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from kiln.ir.graph import Graph, Node
from kiln.ir.memory import in_memory_order
from kiln.ir.ops import Op
from kiln.kernels.decide import Decisions, decision_key, digest
from kiln.kernels.outcome import Built
from kiln.kernels.validate import agrees_with_library, operand_strides

__all__ = ["ORDINARY_BOUND", "Checks", "weight_digest"]

# a weight at most this large in magnitude, and finite, is ordinary: its kernel's check is the
# check of every layer with the same kernel (the module docstring). 2^64: a product with an
# activation is far from float32's overflow (2^128) for any activation the check's normal
# samples stand for
ORDINARY_BOUND = 2.0 ** 64


class Checks:
    """The answers of `agrees_with_library`, kept (module docstring). ``decisions=None``:
    in memory only."""

    def __init__(self, decisions: Decisions | None = None) -> None:
        self.decisions = decisions
        self._answers: dict[str, bool] = {}
        self._weights: dict[Node, str] = {}  # a constant's part of the key, once a compile

    def agrees(self, graph: Graph, built: Built) -> bool:
        key = self.key(graph, built)
        if key not in self._answers:
            kept = self.decisions.agreed(key) if self.decisions is not None else None
            if kept is None:
                kept = agrees_with_library(graph, built)
                if self.decisions is not None:
                    self.decisions.put_agreed(key, kept)
            self._answers[key] = kept
        return self._answers[key]

    def key(self, graph: Graph, built: Built) -> str:
        """The kernel's decision key (identity, operand types and strides, threads, torch,
        machine), with the group's nodes, the kernel's operand types and its weights' part
        (`weight_key`)."""
        nodes = [(n.op.text, repr(n.attrs), repr(n.types)) for n in built.group.nodes]
        weights = [self._weight_key(graph, v.node) for v in built.inputs
                   if v.node.op is Op.CONSTANT]
        return digest(decision_key(built, operand_strides(built)), repr(nodes),
                      repr([v.type for v in built.inputs]), repr(weights))

    def _weight_key(self, graph: Graph, node: Node) -> str:
        if node not in self._weights:
            self._weights[node] = weight_key(graph.constant(node).detach())
        return self._weights[node]


def weight_key(tensor: torch.Tensor) -> str:
    """A weight's part of a check's key: its strides where it is ordinary floats (finite and
    at most `ORDINARY_BOUND` in magnitude; the values then do not matter), else the digest of
    its values as well (integers too: an index table's values decide what a kernel reads)."""
    layout = repr(tensor.stride())
    if tensor.numel() == 0:
        return layout
    if tensor.dtype.is_floating_point:
        # (one pass in memory order, no temporary; a NaN makes both NaN, so the comparison
        # fails for NaN and inf alike; 13 ms for GPT-2's 154 MB embedding, its digest 118)
        low, high = torch.aminmax(in_memory_order(tensor))
        if -ORDINARY_BOUND <= float(low) and float(high) <= ORDINARY_BOUND:
            return layout
    return f"{layout} {weight_digest(tensor)}"


def weight_digest(tensor: torch.Tensor) -> str:
    """SHA-1 of a weight's values. A contiguous tensor: of its bytes. A view no smaller than
    its storage (a transposed Linear weight): of the storage's bytes in place, with the
    view's shape, strides and offset, which fix its values; copying it contiguous first took
    0.37 s of HF GPT-2's 3 s warm compile. Otherwise (a slice of a larger storage): of a
    contiguous copy."""
    if tensor.numel() == 0:
        return hashlib.sha1(b"", usedforsecurity=False).hexdigest()
    if tensor.is_contiguous():
        return _bytes_digest(tensor.reshape(-1).view(torch.uint8).numpy())
    storage = tensor.untyped_storage()
    if storage.nbytes() > tensor.numel() * tensor.element_size():
        return weight_digest(tensor.contiguous())
    placement = repr((tuple(tensor.shape), tensor.stride(), tensor.storage_offset(),
                      str(tensor.dtype)))
    data = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
    return hashlib.sha1((_bytes_digest(data) + placement).encode(),
                        usedforsecurity=False).hexdigest()


# bytes hashed a piece at a time, the pieces on torch's threads at once (hashlib lets go of
# the GIL while it hashes): one thread hashed HF GPT-2's 495 MB of weights in 0.45 s
_PIECE = 4 << 20


def _bytes_digest(data: np.ndarray) -> str:
    """SHA-1 of ``data`` where it fits one piece, else of its pieces' SHA-1s (a fixed split,
    so the digest does not depend on the thread count)."""
    if data.nbytes <= _PIECE:
        return hashlib.sha1(data, usedforsecurity=False).hexdigest()
    pieces = [data[i:i + _PIECE] for i in range(0, data.nbytes, _PIECE)]
    # a pool per call, not one kept: a kept pool's threads are gone in a forked child
    with ThreadPoolExecutor(max_workers=min(torch.get_num_threads(), len(pieces))) as pool:
        hashed = pool.map(lambda piece: hashlib.sha1(piece, usedforsecurity=False).digest(),
                          pieces)
        return hashlib.sha1(b"".join(hashed), usedforsecurity=False).hexdigest()
