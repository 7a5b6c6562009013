"""The Compare wing: one prompt under several caches side by side, and the record it leaves.

`runner` runs the columns (`columns`: what a column is) and streams typed `events`; `turns` is how they share
the model, `timing` sequences the timing policy (`quiet` is its re-timing pass, `kvlab.measure` the shared
parts), `memory` samples process memory, `fidelity` scores each column against the baseline, `summary` turns the results into rows and the JSON
record and `replay` reads such a record back; `preset` is the schema of Compare's presets. No gradio: the page is in `kvlab.ui.compare`.
"""
