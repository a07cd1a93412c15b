"""Terms the fusion, epilogue and merge laws share: a convolution written out with its
attributes as variables, and each activation with its arguments."""

from __future__ import annotations

from kiln.ir.ops import Op
from kiln.rewrite.law import A, App, PVar, Term

X, W, B, R = PVar("x"), PVar("w"), PVar("b"), PVar("r")
CONV_ATTRS = {"stride": PVar("stride"), "padding": PVar("padding"),
              "dilation": PVar("dilation"), "groups": PVar("groups")}


def conv(*operands: Term) -> App:
    """A 2-d convolution, not transposed, with its geometry as variables."""
    return A(Op.CONVOLUTION, *operands, transposed=False, output_padding=(0, 0), **CONV_ATTRS)


# activation op -> (its attributes in a law, the act_args its fused form keeps)
ACTIVATION_FORMS: dict[Op, tuple[dict[str, Term], tuple[Term, ...]]] = {
    Op.RELU: ({}, ()),
    Op.HARDSWISH: ({}, ()),
    Op.SIGMOID: ({}, ()),
    Op.TANH: ({}, ()),
    Op.GELU: ({"approximate": PVar("approximate")}, (PVar("approximate"),)),
    Op.CLAMP: ({"min": PVar("min"), "max": PVar("max")}, (PVar("min"), PVar("max"))),
    Op.LEAKY_RELU: ({"negative_slope": PVar("slope")}, (PVar("slope"),)),
}


def activation(op: Op, operand: Term) -> App:
    return A(op, operand, **ACTIVATION_FORMS[op][0])


def act_args(op: Op) -> tuple[Term, ...]:
    return ACTIVATION_FORMS[op][1]
