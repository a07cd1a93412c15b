"""A proof's outcome, and a law's variables on an instance's shapes as z3 terms: what every
method of `kiln.synth.prove` (and `kiln.synth.prove_axioms`) shares."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import z3

from kiln.rewrite.law import CondKind, Law, PVar
from kiln.synth.concrete import Domain, Env, Tensor, scalar, symbolic_tensor
from kiln.synth.instance import Instance, roles


class ProofStatus(enum.Enum):
    PROVEN = "proven"
    REFUTED = "refuted"
    UNKNOWN = "unknown"  # z3 gave up within the time limit, or no method applied
    UNSUPPORTED = "unsupported"  # an op or condition outside the model (detail says which)


@dataclass(frozen=True)
class Proof:
    status: ProofStatus
    method: str  # "axioms", "reals on shapes x:(2, 3) w:(3, 2)", "float32 scalars", ...
    detail: str = ""  # why unknown/unsupported; for REFUTED, the counterexample
    seconds: float = 0.0


NumberMaker = Callable[[Law, str], tuple[Any, list[z3.BoolRef]]]


def real_numbers(law: Law, name: str) -> tuple[Any, list[z3.BoolRef]]:
    value = z3.Real(name)
    return value, real_conditions(law, {name: value})


def real_conditions(law: Law, numbers: dict[str, Any]) -> list[z3.BoolRef]:
    out = []
    for cond in law.when:
        arg = cond.args[0] if cond.args else None
        if not isinstance(arg, PVar) or arg.name not in numbers:
            continue
        value = numbers[arg.name]
        if cond.kind in (CondKind.FINITE_NONZERO, CondKind.POW2, CondKind.NORMAL_RECIPROCAL):
            out.append(value != 0)
        elif cond.kind is CondKind.POW2_AT_LEAST_ONE:
            out.append(value >= 1)
    return out


def real_env(law: Law, instance: Instance, domain: Domain,
              make_number: NumberMaker = real_numbers) -> Env:
    numbers: dict[str, Tensor] = {}
    constraints: list[z3.BoolRef] = []
    for name in sorted(set(roles(law).numbers) | set(instance.numbers)):
        value, more = make_number(law, name)
        numbers[name] = scalar(value)
        constraints += more
    tensors = {n: symbolic_tensor(domain, n, t.shape) for n, t in instance.tensors.items()}
    domain.assumptions += constraints
    return Env(domain, tensors, numbers, dict(instance.attrs))


def describe_shapes(instance: Instance) -> str:
    parts = [f"{n}:{t.shape}" for n, t in instance.tensors.items()]
    parts += [f"{n}={v!r}" for n, v in instance.attrs.items()]
    return " ".join(parts)


__all__ = ["NumberMaker", "Proof", "ProofStatus", "describe_shapes", "real_conditions",
           "real_env", "real_numbers"]
