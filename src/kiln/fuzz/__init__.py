"""A random-graph fuzzer: kiln's compiled graphs against its reference interpreter.

    generate.py   random well-typed graphs (makers*.py: one maker per op, table.py: which),
                  values.py inputs
    check.py      compile at each configuration, run, compare (compare.py, at the strength
                  exactness.py derives from the rules and kernels that ran)
    shrink.py     delta debugging to a small failing case; repro.py writes it as IR text
    driver.py     the loop over many graphs and processes behind ``kiln fuzz``
"""
