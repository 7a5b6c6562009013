"""The planner wing: the exact KV-cache bytes of any model at any context, without its weights.

`planner` plans (the entry point: `plan(PlanRequest)`), `probe` reads a model's
architecture from its config, `meter` measures each strategy's real cache on
stand-in layers, `explain` words the result, `catalog` resolves model names to
configs. Nothing here loads weights or imports the runner.
"""
