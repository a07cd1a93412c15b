"""Dropping rules that say nothing new: a law that is an instance of another listed law
(the other's variables renamed or identified, e.g. ``(mm (mm ?w1 ?w1) ?w1)`` as an instance of
``(mm (mm ?a ?b) ?c)``) under no weaker conditions is redundant for the engine, which matches
the general law wherever the instance would match. TASO prunes its generated rules the same
way (Jia et al., SOSP'19, section 4: common subgraphs and renamings)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from kiln.rewrite.law import App, AttrFn, Law, Lit, PVar

__all__ = ["drop_instances", "instance_of", "shape_key"]


def shape_key(law: Law) -> str:
    """The law's terms with every variable written ``?``: only laws with equal keys can be
    instances of each other."""
    return repr(tuple(_blank(t) for t in law.src + law.dst))


def _blank(term: Any) -> Any:
    if isinstance(term, PVar):
        return "?"
    if isinstance(term, App):
        return (term.op.text, tuple(_blank(a) for a in term.args),
                tuple((k, _blank(v)) for k, v in term.attrs), term.output)
    if isinstance(term, AttrFn):
        return (term.kind.value, tuple(_blank(a) for a in term.args))
    if isinstance(term, tuple):
        return tuple(_blank(v) for v in term)
    return repr(term)


def instance_of(special: Law, general: Law) -> bool:
    """Is ``special`` ``general`` with its variables renamed or identified, under the same
    safety tag and conditions that say no less?"""
    if special.safety is not general.safety or _every_shape(special) > _every_shape(general):
        return False
    subst: dict[str, str] = {}
    pairs = zip(general.src + general.dst, special.src + special.dst)
    if not all(_unify(g, s, subst) for g, s in pairs):
        return False
    renamed = {_rename_cond(c, subst) for c in general.when}
    return renamed <= set(special.when)


def _every_shape(law: Law) -> bool:
    proof = dict(law.provenance).get("proof")
    return proof is None or "every shape" in proof  # hand-written laws state no proof


def _unify(general: Any, special: Any, subst: dict[str, str]) -> bool:
    if isinstance(general, PVar):
        if not isinstance(special, PVar):
            return False
        return subst.setdefault(general.name, special.name) == special.name
    if isinstance(general, App):
        return (isinstance(special, App) and general.op is special.op
                and general.output == special.output and len(general.args) == len(special.args)
                and len(general.attrs) == len(special.attrs)
                and all(_unify(g, s, subst) for g, s in zip(general.args, special.args))
                and all(gk == sk and _unify(gv, sv, subst)
                        for (gk, gv), (sk, sv) in zip(general.attrs, special.attrs)))
    if isinstance(general, AttrFn):
        return (isinstance(special, AttrFn) and general.kind is special.kind
                and len(general.args) == len(special.args)
                and all(_unify(g, s, subst) for g, s in zip(general.args, special.args)))
    if isinstance(general, tuple):
        return (isinstance(special, tuple) and len(general) == len(special)
                and all(_unify(g, s, subst) for g, s in zip(general, special)))
    if isinstance(general, Lit):
        return general == special
    return type(general) is type(special) and general == special


def _rename_cond(cond: Any, subst: dict[str, str]) -> Any:
    args = tuple(PVar(subst.get(a.name, a.name)) if isinstance(a, PVar) else a
                 for a in cond.args)
    return type(cond)(cond.kind, args)


def drop_instances(laws: Sequence[Law]) -> list[Law]:
    """``laws`` without those that are instances of another kept law (first kept on ties,
    so renamings keep the first written)."""
    groups: dict[str, list[Law]] = defaultdict(list)
    for law in laws:
        groups[shape_key(law)].append(law)
    dropped: set[str] = set()
    for group in groups.values():
        # more distinct variables first: the most general laws of a group come first
        group = sorted(group, key=lambda law: -len(law.variables()))
        kept: list[Law] = []
        for law in group:
            if any(instance_of(law, k) for k in kept):
                dropped.add(law.name)
            else:
                kept.append(law)
    return [law for law in laws if law.name not in dropped]


