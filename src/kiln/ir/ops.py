"""The closed vocabulary of kiln ops and the groups they belong to.

An op's value is its name in IR text and in reports (``report.op_counts()``); names follow
ATen where an ATen op means the same thing, so a reader can map one to the other.
"""

from __future__ import annotations

import enum


class OpGroup(enum.Flag):
    SOURCE = enum.auto()  # graph input, weight, literal: no operands
    CREATION = enum.auto()  # builds a tensor from attributes alone (full, arange)
    ELEMENTWISE = enum.auto()  # out[i] depends on operand[i] only (after broadcasting)
    UNARY = enum.auto()
    BINARY = enum.auto()
    COMMUTATIVE = enum.auto()  # f(a, b) == f(b, a), bit for bit
    COMPARISON = enum.auto()  # result dtype is bool
    REDUCTION = enum.auto()
    NORMALIZATION = enum.auto()  # softmax, layer/batch norm: reduce then map
    MOVEMENT = enum.auto()  # moves or copies elements, no arithmetic
    VIEW = enum.auto()  # result may alias its first operand (never write into it)
    CONTRACTION = enum.auto()  # matmul, convolution: the FLOP-heavy ops
    POOLING = enum.auto()
    OPAQUE = enum.auto()  # a call of an ATen op that kiln does not model


G = OpGroup
_EW1 = G.ELEMENTWISE | G.UNARY
_EW2 = G.ELEMENTWISE | G.BINARY
_CMP = _EW2 | G.COMPARISON


class Op(enum.Enum):
    # sources
    INPUT = ("input", G.SOURCE)
    CONSTANT = ("constant", G.SOURCE)  # a frozen weight, held in Graph.constants
    SCALAR = ("scalar", G.SOURCE)  # a Python number operand, with ATen's scalar promotion
    # creation
    FULL = ("full", G.CREATION)
    ARANGE = ("arange", G.CREATION)
    # elementwise, one operand
    ABS = ("abs", _EW1)
    NEG = ("neg", _EW1)
    EXP = ("exp", _EW1)
    LOG = ("log", _EW1)
    SQRT = ("sqrt", _EW1)
    RSQRT = ("rsqrt", _EW1)
    RECIPROCAL = ("reciprocal", _EW1)
    SIN = ("sin", _EW1)
    COS = ("cos", _EW1)
    TANH = ("tanh", _EW1)
    SIGMOID = ("sigmoid", _EW1)
    ERF = ("erf", _EW1)
    RELU = ("relu", _EW1)
    GELU = ("gelu", _EW1)
    LEAKY_RELU = ("leaky_relu", _EW1)
    HARDSWISH = ("hardswish", _EW1)  # x * clamp(x + 3, 0, 6) / 6 (`kiln.rules.idioms`)
    CLAMP = ("clamp", _EW1)
    FLOOR = ("floor", _EW1)
    CEIL = ("ceil", _EW1)
    LOGICAL_NOT = ("logical_not", _EW1)
    CAST = ("cast", _EW1)
    # elementwise, two or three operands
    ADD = ("add", _EW2 | G.COMMUTATIVE)
    SUB = ("sub", _EW2)
    MUL = ("mul", _EW2 | G.COMMUTATIVE)
    DIV = ("div", _EW2)
    POW = ("pow", _EW2)
    MAXIMUM = ("maximum", _EW2 | G.COMMUTATIVE)
    MINIMUM = ("minimum", _EW2 | G.COMMUTATIVE)
    EQ = ("eq", _CMP | G.COMMUTATIVE)
    NE = ("ne", _CMP | G.COMMUTATIVE)
    LT = ("lt", _CMP)
    LE = ("le", _CMP)
    GT = ("gt", _CMP)
    GE = ("ge", _CMP)
    LOGICAL_AND = ("logical_and", _EW2 | G.COMMUTATIVE)
    LOGICAL_OR = ("logical_or", _EW2 | G.COMMUTATIVE)
    WHERE = ("where", G.ELEMENTWISE)
    # reductions
    SUM = ("sum", G.REDUCTION)
    MEAN = ("mean", G.REDUCTION)
    AMAX = ("amax", G.REDUCTION)
    AMIN = ("amin", G.REDUCTION)
    ARGMAX = ("argmax", G.REDUCTION)
    ARGMIN = ("argmin", G.REDUCTION)
    VAR = ("var", G.REDUCTION)
    # normalizations
    SOFTMAX = ("softmax", G.NORMALIZATION)
    LOG_SOFTMAX = ("log_softmax", G.NORMALIZATION)
    LAYER_NORM = ("layer_norm", G.NORMALIZATION)  # outputs: y, mean, rstd
    BATCH_NORM = ("batch_norm", G.NORMALIZATION)  # inference form, normalized output only
    # movement
    VIEW = ("view", G.MOVEMENT | G.VIEW)
    PERMUTE = ("permute", G.MOVEMENT | G.VIEW)
    EXPAND = ("expand", G.MOVEMENT | G.VIEW)
    SQUEEZE = ("squeeze", G.MOVEMENT | G.VIEW)
    UNSQUEEZE = ("unsqueeze", G.MOVEMENT | G.VIEW)
    SLICE = ("slice", G.MOVEMENT | G.VIEW)
    SELECT = ("select", G.MOVEMENT | G.VIEW)
    SPLIT = ("split", G.MOVEMENT | G.VIEW)  # one output per piece
    CAT = ("cat", G.MOVEMENT)
    CLONE = ("clone", G.MOVEMENT)
    TO_LAYOUT = ("to_layout", G.MOVEMENT)  # copy into a memory format (channels-last or not)
    PAD = ("pad", G.MOVEMENT)  # constant padding
    # contractions and friends
    MM = ("mm", G.CONTRACTION)
    BMM = ("bmm", G.CONTRACTION)
    ADDMM = ("addmm", G.CONTRACTION)
    CONVOLUTION = ("convolution", G.CONTRACTION)
    # fused by the rewrite rules: a contraction with its epilogue (bias, residual, activation)
    ADDMM_ACT = ("addmm_act", G.CONTRACTION)
    CONV_ACT = ("conv_act", G.CONTRACTION)
    EMBEDDING = ("embedding", G.MOVEMENT)
    MAX_POOL2D = ("max_pool2d", G.POOLING)  # outputs: values, indices
    AVG_POOL2D = ("avg_pool2d", G.POOLING)
    ADAPTIVE_AVG_POOL2D = ("adaptive_avg_pool2d", G.POOLING)
    # anything else: the original ATen op, run as it is
    CALL = ("call", G.OPAQUE)

    def __init__(self, text: str, groups: OpGroup) -> None:
        self.text = text
        self.groups = groups
        self._bits = groups._value_

    def is_a(self, group: OpGroup) -> bool:
        # on the flags' integers: a Flag's `&` builds a new member, and a search asks this
        # of every node it tries a rule at (400,000 times in 8 s on ResNeXt-50)
        return bool(self._bits & group._value_)

    @staticmethod
    def parse(text: str) -> Op:
        try:
            return _BY_TEXT[text]
        except KeyError:
            raise ValueError(f"unknown op {text!r}") from None

    def __repr__(self) -> str:
        return f"Op.{self.name}"


_BY_TEXT = {op.text: op for op in Op}
