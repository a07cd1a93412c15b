"""Movement canonicalization: identity moves vanish, chains of moves become one.

Every rule here only changes which view of the same elements an op reads. All are exact but
``permute-sink.unary``, tagged ieee: ATen's elementwise kernels can round the last bit
differently on a strided operand than on a dense one.
"""

from __future__ import annotations

from kiln.ir.attrs import ATTRS_OF, PermuteAttrs, ShapeAttrs
from kiln.ir.ops import Op, OpGroup
from kiln.rewrite.law import A, AttrFnKind, C, CondKind, F, L, PVar
from kiln.rewrite.pattern import On, Var
from kiln.rewrite.rule import EXACT, IEEE, Match, Rule
from kiln.rules.laws_common import ACTIVATION_FORMS, activation

RESHAPES = frozenset({Op.VIEW, Op.SQUEEZE, Op.UNSQUEEZE})


def _same_type_as_operand(m: Match) -> str | None:
    x = m["x"]
    return None if x.type == m.root.type else "it changes the shape"


def _private_source(m: Match) -> str | None:
    """The copy may go only where what it copies is the graph's own: a view of the caller's
    input (or of a weight) would let the result alias it, where the copy made it fresh."""
    v = m["x"]
    while v.node.op.is_a(OpGroup.VIEW):
        v = v.node.inputs[0]
    return "it copies the caller's tensor" if v.node.op in (Op.INPUT, Op.CONSTANT) else None


# ops whose ATen result is a fresh contiguous tensor whatever their operands' strides
_FRESH = frozenset({Op.MM, Op.BMM, Op.ADDMM, Op.ADDMM_ACT, Op.EMBEDDING, Op.LAYER_NORM,
                    Op.CLONE})


def dense_result(value, graph, depth: int = 6) -> bool:  # noqa: ANN001
    """Whether ATen gives ``value`` contiguous strides: a fresh result, a contiguous weight,
    a reshape of a dense value, or an elementwise result (or softmax) of dense operands."""
    node = value.node
    if node.op in _FRESH:
        return True
    if node.op is Op.CONSTANT:
        return graph.constant(node).is_contiguous()
    if depth == 0:
        return False
    if node.op in RESHAPES:
        return dense_result(node.inputs[0], graph, depth - 1)
    if node.op.is_a(OpGroup.ELEMENTWISE) or node.op is Op.SOFTMAX:
        return all(dense_result(v, graph, depth - 1) for v in node.inputs
                   if v.node.op is not Op.SCALAR)
    return False


def _redundant_copy(m: Match) -> str | None:
    """A copy of a value that is already the graph's own and dense changes nothing a reader
    can see: not its elements, not its strides, and no caller's tensor is aliased."""
    private = _private_source(m)
    if private:
        return private
    if m.root.out() in m.ctx.graph.outputs:
        return "it is a graph output (the caller gets a tensor of its own)"
    if not dense_result(m["x"], m.ctx.graph):
        return "its source may not be contiguous (the copy lays it out)"
    return None


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


def _permuted_alike(m: Match) -> str | None:
    if tuple(m["p"].attrs.dims) != tuple(m["q"].attrs.dims):
        return "the operands are permuted differently"
    if m["x"].type != m["y"].type:
        return "the operands differ in shape or dtype (a broadcast or a promotion)"
    return None


def _sink_permute(m: Match):
    inner = m.op(m.root.op, m["x"], m["y"])
    return m.op(Op.PERMUTE, inner, attrs=m["p"].attrs)


TO_NCHW, TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)


def _nhwc_residual(m: Match) -> str | None:
    """x op permute(y) {TO_NCHW} where y is a dense [N, H, W, C] value: the op can run on y
    as it lies, x read through the inverse permute (views both)."""
    if tuple(m["p"].attrs.dims) != TO_NCHW:
        return "the permute is not NHWC -> NCHW"
    if m["x"].node.op is Op.PERMUTE:
        return "x is a permute too (permute-sink's case)"
    if m["x"].type != m["p"].out().type:
        return "the operands differ in shape or dtype (a broadcast or a promotion)"
    if not dense_result(m["y"], m.ctx.graph):
        return "y may not be contiguous"
    return None


def _unary(op: Op, operand):  # noqa: ANN001, ANN202 - a law's term
    return activation(op, operand) if op in ACTIVATION_FORMS else A(op, operand)


def _hoist_permute(m: Match):
    nhwc = m.op(Op.PERMUTE, m["x"], attrs=PermuteAttrs(TO_NHWC))
    inner = m.op(m.root.op, nhwc, m["y"])
    return m.op(Op.PERMUTE, inner, attrs=PermuteAttrs(TO_NCHW))


x = Var("x")
X, P, Q, S1, S2 = PVar("x"), PVar("p"), PVar("q"), PVar("s1"), PVar("s2")
Y = PVar("y")
D = PVar("d")
SINKS_PERMUTE = (Op.ADD, Op.MUL)  # (the ops with a permute axiom in kiln.synth)
# elementwise ops of one operand (no attributes, or an activation's): each element maps to
# itself, so they commute with any permute. In the reals; ATen's result can differ in the
# last bit with the operand's layout (its vectorized and scalar GELU: -0.16978782 against
# -0.16978779), so the tag is ieee
UNARY_SINKS_PERMUTE = tuple(op for op in Op if op.is_a(OpGroup.ELEMENTWISE)
                            and op.is_a(OpGroup.UNARY)
                            and (ATTRS_OF.get(op) is None or op in ACTIVATION_FORMS))
SHAPE_OF_X = F(AttrFnKind.SHAPE_OF, X)
IDENTITY_PERMUTES = tuple(L(f"permute-identity.{rank}", A(Op.PERMUTE, X, dims=tuple(range(rank))),
                            X, EXACT) for rank in range(1, 5))

RULES = (
    Rule("permute-identity", On(Op.PERMUTE, x, where=_identity_dims, describe="identity"),
         lambda m: m["x"], EXACT, laws=IDENTITY_PERMUTES),  # permute(x, (0, 1, ..)) -> x
    Rule("view-identity", On(RESHAPES | {Op.EXPAND}, x), lambda m: m["x"], EXACT,
         guard=_same_type_as_operand,
         laws=(L("view-identity.view", A(Op.VIEW, X, shape=SHAPE_OF_X), X, EXACT),
               L("view-identity.expand", A(Op.EXPAND, X, shape=SHAPE_OF_X), X, EXACT))),
    # view(x, x.shape) -> x
    Rule("permute-permute", On(Op.PERMUTE, On(Op.PERMUTE, x, name="inner", shared=True)),
         _composed_permute, EXACT,
         laws=(L("permute-permute", A(Op.PERMUTE, A(Op.PERMUTE, X, dims=P), dims=Q),
                 A(Op.PERMUTE, X, dims=F(AttrFnKind.COMPOSE, P, Q)), EXACT),)),
    # permute(permute(x, p), q) -> permute(x, p[q])
    Rule("reshape-chain", On(RESHAPES, On(RESHAPES, x, shared=True)),
         _one_view, EXACT,
         laws=(L("reshape-chain", A(Op.VIEW, A(Op.VIEW, X, shape=S1), shape=S2),
                 A(Op.VIEW, X, shape=S2), EXACT),)),  # view(view(x, s1), s2) -> view(x, s2)
    Rule("expand-expand", On(Op.EXPAND, On(Op.EXPAND, x, shared=True)),
         _one_expand, EXACT,
         laws=(L("expand-expand", A(Op.EXPAND, A(Op.EXPAND, X, shape=S1), shape=S2),
                 A(Op.EXPAND, X, shape=S2), EXACT),)),  # expand(expand(x, s1), s2) -> expand(x, s2)
    Rule("view-skip-copy", On(Op.VIEW, On(Op.CLONE, x, shared=True)), _one_view, EXACT,
         guard=_private_source,
         laws=(L("view-skip-copy", A(Op.VIEW, A(Op.CLONE, A(Op.RELU, X)), shape=S1),
                 A(Op.VIEW, A(Op.RELU, X), shape=S1), EXACT,
                 C(CondKind.GUARD, "private-source")),)),  # (relu: any value the graph
    # computes; the guard refuses the caller's own tensors)
    # view(clone(x), s) -> view(x, s): the IR's view copies where the strides need it (a
    # reshape), so the copy before it only doubles the traffic (HF attention's softmax
    # probabilities and dropout-free residuals: 36 copies in GPT-2)
    Rule("permute-skip-copy", On(Op.PERMUTE, On(Op.CLONE, x, shared=True)),
         lambda m: m.op(Op.PERMUTE, m["x"], attrs=m.root.attrs), EXACT,
         guard=_private_source,
         laws=(L("permute-skip-copy", A(Op.PERMUTE, A(Op.CLONE, A(Op.RELU, X)), dims=P),
                 A(Op.PERMUTE, A(Op.RELU, X), dims=P), EXACT,
                 C(CondKind.GUARD, "private-source")),)),
    # permute(clone(x), p) -> permute(x, p): a permute is a view, so the copy only lays out
    # what the permute then reads in another order (EfficientNet's residual branch: an NCHW
    # copy of a pointwise GEMM's NHWC result, permuted back to NHWC for its add: 0.3 ms a
    # block at 112x112)
    Rule("clone-dense", On(Op.CLONE, x), lambda m: m["x"], EXACT, guard=_redundant_copy,
         laws=(L("clone-dense", A(Op.RELU, A(Op.CLONE, A(Op.MM, X, P))),
                 A(Op.RELU, A(Op.MM, X, P)), EXACT, C(CondKind.GUARD, "redundant-copy")),)),
    # clone(x) -> x for a dense x the graph computed (HF's dropout in eval mode: 25 copies
    # of GPT-2's hidden states)
    Rule("cat-skip-copy", On(Op.CAT, On(Op.CLONE, x, shared=True), Var("y")),
         lambda m: m.op(Op.CAT, m["x"], m["y"], attrs=m.root.attrs), EXACT,
         laws=(L("cat-skip-copy", A(Op.CAT, A(Op.CLONE, X), Y, dim=D),
                 A(Op.CAT, X, Y, dim=D), EXACT),)),
    # cat(clone(x), y) -> cat(x, y)
    Rule("cat-skip-copy.second", On(Op.CAT, Var("y"), On(Op.CLONE, x, shared=True)),
         lambda m: m.op(Op.CAT, m["y"], m["x"], attrs=m.root.attrs), EXACT,
         laws=(L("cat-skip-copy.second", A(Op.CAT, Y, A(Op.CLONE, X), dim=D),
                 A(Op.CAT, Y, X, dim=D), EXACT),)),
    # cat(y, clone(x)) -> cat(y, x): the cat copies its operands into a tensor of its own,
    # so a copy before it only doubles the traffic, even of the caller's tensor (a decode
    # step's KV cache: HF's DynamicCache concatenates each layer's cache onto an empty one
    # first, which the frontend makes a copy, then the new token's keys onto that)
    Rule("clone-clone", On(Op.CLONE, On(Op.CLONE, x, name="inner", shared=True)),
         lambda m: m["inner"].out(), EXACT,
         laws=(L("clone-clone", A(Op.CLONE, A(Op.CLONE, X)), A(Op.CLONE, X), EXACT),)),
    # clone(clone(x)) -> clone(x)
    Rule("permute-sink", On(frozenset(SINKS_PERMUTE), On(Op.PERMUTE, x, name="p", shared=True),
                            On(Op.PERMUTE, Var("y"), name="q", shared=True)),
         _sink_permute, EXACT, guard=_permuted_alike,
         laws=tuple(L(f"permute-sink.{op.text}",
                      A(op, A(Op.PERMUTE, X, dims=P), A(Op.PERMUTE, Y, dims=P)),
                      A(Op.PERMUTE, A(op, X, Y), dims=P), EXACT, C(CondKind.SAME_TYPE, X, Y))
                    for op in SINKS_PERMUTE)),
    # permute(x, p) + permute(y, p) -> permute(x + y, p): one op on the values as they lie
    # (ConvNeXt's residual adds of NCHW views of NHWC blocks: the add then runs on dense
    # operands and can join the layer scale's multiply in one kernel)
    Rule("permute-hoist", On(frozenset(SINKS_PERMUTE), x,
                             On(Op.PERMUTE, Var("y"), name="p", shared=True)),
         _hoist_permute, EXACT, guard=_nhwc_residual,
         laws=tuple(L(f"permute-hoist.{op.text}",
                      A(op, X, A(Op.PERMUTE, A(Op.CLONE, Y), dims=TO_NCHW)),
                      A(Op.PERMUTE, A(op, A(Op.PERMUTE, X, dims=TO_NHWC), A(Op.CLONE, Y)),
                        dims=TO_NCHW),
                      EXACT, C(CondKind.GUARD, "nhwc-residual"))  # (a clone: a dense y)
                    for op in SINKS_PERMUTE)),
    # x + permute(y) {NHWC -> NCHW} -> permute(permute(x) {NCHW -> NHWC} + y) {NHWC -> NCHW}
    # for a dense y: the first residual add of each ConvNeXt stage, whose x is the
    # downsampling convolution's output (NHWC in memory); the blocks after it then add
    # their permuted values alike (permute-sink)
    Rule("permute-sink.unary", On(frozenset(UNARY_SINKS_PERMUTE),
                                  On(Op.PERMUTE, x, name="p", shared=True)),
         lambda m: m.op(Op.PERMUTE, m.op(m.root.op, m["x"], attrs=m.root.attrs),
                        attrs=m["p"].attrs), IEEE,
         laws=tuple(L(f"permute-sink.{op.text}", _unary(op, A(Op.PERMUTE, X, dims=P)),
                      A(Op.PERMUTE, _unary(op, X), dims=P), IEEE)
                    for op in UNARY_SINKS_PERMUTE)),
    # f(permute(x, p)) -> permute(f(x), p) for an elementwise f of one operand: f runs on
    # the values as they lie (EfficientNet's SiLU after a pointwise GEMM took sigmoid over an
    # NCHW view of the GEMM's NHWC result, 0.37 ms a layer in ATen, apart from its multiply;
    # SegFormer's GELU, its tokens read through a transpose, 0.07-0.14 ms)
)
