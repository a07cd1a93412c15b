"""Movement canonicalization: identity moves vanish, chains of moves become one.

Every rule here is exact: it only changes which view of the same elements an op reads.
"""

from __future__ import annotations

from kiln.ir.attrs import PermuteAttrs, ShapeAttrs
from kiln.ir.ops import Op
from kiln.rewrite.pattern import On, Var
from kiln.rewrite.rule import EXACT, Match, Rule

RESHAPES = frozenset({Op.VIEW, Op.SQUEEZE, Op.UNSQUEEZE})


def _same_type_as_operand(m: Match) -> str | None:
    x = m["x"]
    return None if x.type == m.root.type else "it changes the shape"


def _identity_dims(attrs) -> bool:
    return tuple(attrs.dims) == tuple(range(len(attrs.dims)))


def _composed_permute(m: Match):
    inner = m["inner"].attrs.dims
    outer = m.root.attrs.dims
    dims = tuple(inner[d] for d in outer)
    if dims == tuple(range(len(dims))):
        return m["x"]
    return m.op(Op.PERMUTE, m["x"], attrs=PermuteAttrs(dims))


def _one_view(m: Match):
    return m.op(Op.VIEW, m["x"], attrs=ShapeAttrs(m.root.type.shape))


def _one_expand(m: Match):
    return m.op(Op.EXPAND, m["x"], attrs=ShapeAttrs(m.root.type.shape))


x = Var("x")

RULES = (
    Rule("permute-identity", On(Op.PERMUTE, x, where=_identity_dims, describe="identity"),
         lambda m: m["x"], EXACT),  # permute(x, (0, 1, ..)) -> x
    Rule("view-identity", On(RESHAPES | {Op.EXPAND}, x), lambda m: m["x"], EXACT,
         guard=_same_type_as_operand),  # view(x, x.shape) -> x
    Rule("permute-permute", On(Op.PERMUTE, On(Op.PERMUTE, x, name="inner", shared=True)),
         _composed_permute, EXACT),  # permute(permute(x, p), q) -> permute(x, p[q])
    Rule("reshape-chain", On(RESHAPES, On(RESHAPES, x, shared=True)),
         _one_view, EXACT),  # view(view(x, s1), s2) -> view(x, s2)
    Rule("expand-expand", On(Op.EXPAND, On(Op.EXPAND, x, shared=True)),
         _one_expand, EXACT),  # expand(expand(x, s1), s2) -> expand(x, s2)
    Rule("clone-clone", On(Op.CLONE, On(Op.CLONE, x, name="inner", shared=True)),
         lambda m: m["inner"].out(), EXACT),  # clone(clone(x)) -> clone(x)
)
