"""The inspector wing: step one strategy's decode loop and record what its cache holds after every step.

`inspector` holds the session and the per-step records; the tab and the CLI
render them (`kvlab.ui.inspect_*`, `kvlab.cli.inspect`).
"""
