"""The Compare tab: `tab` lays out and wires; `form` (the page's values -> a `RunPlan`), `view` (events -> the view
model), `updates` (the component updates of a run), `extras` (replay, share links, the `compare` API),
`replay`, `records` (what a finished run leaves behind) and `timing_text` are pure or plain functions."""
