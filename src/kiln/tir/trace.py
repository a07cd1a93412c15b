"""A Trace: the schedule as data. Every verb applied through `Schedule` is recorded as one
`Instruction` (verb, arguments, names of the handles it returned); the trace prints as Python,
round-trips through JSON, and replays onto a fresh copy of the same program::

    b_C = sch.get_block("C")
    i0, i1, k0 = sch.get_loops(b_C)
    i0_0, i0_1 = sch.split(i0, factors=[None, 4])
    sch.parallel(i0_0)

Handles are names (loops by loop var, blocks by block name), and every primitive picks fresh
names deterministically, so replaying on the same lowered program gives the same names.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any


class Verb(enum.Enum):
    GET_BLOCK = "get_block"
    GET_LOOPS = "get_loops"
    SPLIT = "split"
    TILE = "tile"
    FUSE = "fuse"
    REORDER = "reorder"
    PARALLEL = "parallel"
    VECTORIZE = "vectorize"
    UNROLL = "unroll"
    COMPUTE_AT = "compute_at"
    REVERSE_COMPUTE_AT = "reverse_compute_at"
    COMPUTE_INLINE = "compute_inline"
    CACHE_READ = "cache_read"
    CACHE_WRITE = "cache_write"
    DECOMPOSE_REDUCTION = "decompose_reduction"
    FISSION = "fission"
    FUSION = "fusion"
    RFACTOR = "rfactor"
    CACHE_INPLACE = "cache_inplace"
    TRANSFORM_LAYOUT = "transform_layout"
    SAMPLE_CATEGORICAL = "sample_categorical"  # a decision: its value, among its candidates


# which arguments hold handles, and of what kind ("loop", "loops", "block")
HANDLE_ARGS: dict[str, str] = {"loop": "loop", "loops": "loops", "block": "block",
                               "first": "loop", "second": "loop"}


@dataclass(frozen=True)
class Instruction:
    verb: Verb
    args: tuple[tuple[str, Any], ...]  # JSON-able values; handles as names
    outputs: tuple[str, ...] = ()

    def arg(self, name: str) -> Any:
        return dict(self.args)[name]

    def to_dict(self) -> dict[str, Any]:
        return {"verb": self.verb.value, "args": dict(self.args), "outputs": list(self.outputs)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Instruction:
        args = tuple((k, _freeze(v)) for k, v in d["args"].items())
        return Instruction(Verb(d["verb"]), args, tuple(d.get("outputs", ())))


def _freeze(v: Any) -> Any:
    return tuple(_freeze(x) for x in v) if isinstance(v, list) else v


@dataclass
class Trace:
    instructions: list[Instruction] = field(default_factory=list)

    def append(self, inst: Instruction) -> None:
        self.instructions.append(inst)

    def to_json(self) -> str:
        return json.dumps([i.to_dict() for i in self.instructions], indent=1)

    @staticmethod
    def from_json(text: str) -> Trace:
        return Trace([Instruction.from_dict(d) for d in json.loads(text)])

    def as_python(self) -> str:
        lines = []
        for inst in self.instructions:
            args = []
            for k, v in inst.args:
                kind = HANDLE_ARGS.get(k)
                if kind == "block":
                    args.append(f"b_{v}")
                elif kind == "loops" and inst.verb is Verb.TILE:
                    args.append("[" + ", ".join(v) + "]")
                elif kind == "loops":
                    args.append(", ".join(v))
                elif kind == "loop":
                    args.append(v)
                elif k == "name":
                    args.append(repr(v))
                else:
                    args.append(f"{k}={_py(v)}")
            call = f"sch.{inst.verb.value}({', '.join(args)})"
            if inst.verb in (Verb.GET_BLOCK, Verb.CACHE_READ, Verb.CACHE_WRITE,
                             Verb.DECOMPOSE_REDUCTION, Verb.RFACTOR):
                lines.append(f"b_{inst.outputs[0]} = {call}")
            elif inst.verb is Verb.SAMPLE_CATEGORICAL:
                name, options = inst.arg("name"), _py(inst.arg("candidates"))
                lines.append(f"{name} = sch.sample_categorical({name!r}, {options}, "
                             f"decision={_py(inst.arg('decision'))})")
            elif inst.verb is Verb.CACHE_INPLACE:
                lines.append(f"{', '.join('b_' + o for o in inst.outputs)} = {call}")
            elif inst.outputs:
                comma = "," if len(inst.outputs) == 1 and inst.verb is Verb.GET_LOOPS else ""
                lines.append(f"{', '.join(inst.outputs)}{comma} = {call}")
            else:
                lines.append(call)
        return "\n".join(lines) + "\n"

    def apply(self, func: Any) -> Any:
        """Replay onto ``func`` (a fresh PrimFunc); returns the Schedule."""
        from kiln.tir.schedule import Schedule

        sch = Schedule(func)
        for inst in self.instructions:
            sch.replay(inst)
        return sch

    def __len__(self) -> int:
        return len(self.instructions)

    def decisions(self) -> dict[str, Any]:
        """The sampled decisions, by name, in the order they were made."""
        return {i.arg("name"): i.arg("decision") for i in self.instructions
                if i.verb is Verb.SAMPLE_CATEGORICAL}


def _py(v: Any) -> str:
    if isinstance(v, tuple):
        return "[" + ", ".join(_py(x) for x in v) + "]"
    if isinstance(v, str):
        return repr(v)
    return repr(v)
