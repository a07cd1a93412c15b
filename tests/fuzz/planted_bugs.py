"""A wrong pass to plant in the pipeline, so tests can watch the fuzzer catch and shrink it."""

from __future__ import annotations

import kiln.engine
from kiln.ir import Op
from kiln.ir.graph import Node, transform

real_pipeline = kiln.engine.run_pipeline


def maximum_becomes_minimum(graph, options, *args, **kwargs):
    """The real pipeline, then a wrong rewrite: every maximum computes a minimum."""
    graph, records, snapshots = real_pipeline(graph, options, *args, **kwargs)

    def rewrite(node: Node, inputs):
        if node.op is Op.MAXIMUM:
            return Node(Op.MINIMUM, inputs, node.attrs, node.types, node.name)
        return None
    return transform(graph, rewrite), records, snapshots
