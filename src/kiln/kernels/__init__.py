"""The kernel layer: from a group of graph nodes to a runnable kernel, or a typed reason why
the group keeps its library calls.

    plan.py            KernelPlan: lowered program + Trace + named post-passes (replayable)
    outcome.py         Built | Skipped(SkipReason), Measured
    loops.py, rows.py  recipes: group -> plan (elementwise chains; softmax/layer-norm rows)
    gemm.py            mm/addmm groups -> GEMM plans
    *_schedule.py      the schedules the recipes apply (row schedule, default, BLIS GEMM)
    validate.py        a built kernel agrees with the library on random operands
    decide.py          and is faster than the library on its shapes (decisions kept on disk)
    build.py           the driver: plan, compile, validate, decide

`kiln.engine.KERNEL_STAGES` lists the stages in the order they run.
"""
