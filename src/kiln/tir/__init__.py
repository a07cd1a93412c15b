"""kiln's loop-nest IR (TensorIR-like): nodes, lowering from kiln ops, printer, interpreter,
and the schedule primitives recorded as replayable traces."""

from kiln.tir.nodes import (
    Allocate,
    Binary,
    BinOp,
    Block,
    Buffer,
    BufferStore,
    Cast,
    CmpOp,
    Compare,
    Const,
    Expr,
    For,
    ForKind,
    IfThenElse,
    IterKind,
    IterVar,
    Load,
    Prefetch,
    PrimFunc,
    Scope,
    Select,
    SeqStmt,
    Stmt,
    Unary,
    UnOp,
    Var,
    const,
    seq,
)

__all__ = [
    "Allocate", "BinOp", "Binary", "Block", "Buffer", "BufferStore", "Cast", "CmpOp", "Compare",
    "Const", "Expr", "For", "ForKind", "IfThenElse", "IterKind", "IterVar", "Load", "Prefetch",
    "PrimFunc", "Scope", "Select", "SeqStmt", "Stmt", "UnOp", "Unary", "Var", "const", "seq",
]
