"""Cost-based rule application: backtracking search (TASO) over kiln's hand-written and
generated rules, ranked by `kiln.cost`."""
