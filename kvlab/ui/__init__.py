"""kvlab's browser UI: the only package (besides `app.py`) that imports gradio.

Each tab is two modules: a pure form/view module that turns the form into a
validated plan and the backend's typed events into a view model, tables and
figures (importable and tested without gradio), and a tab module that only lays
out components and wires their events.

- `loader`: background model loading shared by the tabs (no gradio).
- `knobs`: the strategy-card form (knob fields from the strategy dataclasses,
  choices filtered by a capability), shared by every tab (no gradio).
- `theme`: colours, CSS and small HTML helpers (no gradio).
- `figures`, `code`: matplotlib figures (object API) and the reproduce-it snippet (no gradio).
- `compare_view` / `chat_view` / `perplexity_view`: each tab's pure part (no gradio).
- `cards`, `compare_tab`, `chat_tab`, `perplexity_tab`: gradio layout and wiring.

This file imports nothing, so `import kvlab.ui.compare_view` works without gradio.
"""
