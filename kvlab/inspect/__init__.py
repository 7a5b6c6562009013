"""The inspector wing: step one strategy's decode loop and record what its cache holds after every step.

`inspector` holds the session and the per-step records; the tab and the CLI
render them (`kvlab.ui.inspect_*`, `kvlab.cli.inspect`). `diverge` steps a
strategy in lockstep beside a dense reference and measures, per layer, where
they part (`held`: which positions a layer holds; `probes`: the hooks and the
recomputed attention; `loops`: decode-loop mistakes to step the same way;
rendered by `kvlab.ui.inspect.diverge`, `kvlab.cli.diverge`); `diverge_run`
takes a diverge run from its request to its record, the one path the CLI's
`--json` and the `diverge` agent tool share.
"""
