"""Generated rewrite rules: the rule text format, instances, z3 proofs and checks."""
