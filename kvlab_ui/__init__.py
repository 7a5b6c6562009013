"""kvlab's browser UI: one module per tab, each building its components inside a `gr.Tab`.

Only this package (and `app.py`) imports gradio; what the tabs show is computed
by the gradio-free `kvlab` package (`kvlab.view` for the Compare tab).
"""
