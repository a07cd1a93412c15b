"""Partially equivalent transformations with automatic correction, as PET does them (Wang et
al., OSDI'21): `split` cuts a graph into small multi-linear subprograms, `mutate` builds other
programs over their inputs, `regions` finds where each differs from the original, `correct`
recomputes exactly those boxes, and `select` keeps a mutant plus corrections where it is
faster. ``Options(pet=True)`` runs it as the ``pet`` pass; docs/pet.md walks through it."""
