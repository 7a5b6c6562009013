"""kvlab's browser UI: the only package (besides `app.py`) that imports gradio.

One package per tab (`compare`, `chat`, `perplexity`, `plan`, `inspect`, `needle`, `report`), each a `tab` module that
only lays out components and wires their events beside pure modules (`view`, `form`, ...) that turn the form
into a validated plan and the backend's typed events into a view model, tables and figures (importable and
tested without gradio); `shared` holds what every tab uses and `hosting` how the app is served (the agent
tools, run costs and turns, the queue, shutdown, ZeroGPU). A tab's package imports `shared` and `hosting`,
never another tab's package; `hosting` imports neither. Nothing here imports the CLI: what a tab or an agent
tool shares with a subcommand lives in the wing both call.

This file imports nothing, so `import kvlab.ui.compare.view` works without gradio.
"""
