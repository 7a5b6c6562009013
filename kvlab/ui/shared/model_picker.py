"""The model picker every tab shows: a dropdown of the bundled models, one line each (family, size, layer
types, chat or base model, licence), that also takes any typed source (a hub id, a local folder, a `.gguf`
file; where local sources are off, its hint offers hub ids only). Lays out one component; the list is `kvlab.models.bundled.picker_choices`, what a source may be is
`kvlab.models.ModelSpec`'s. `chat_box` is what the "chat message" checkbox of a tab becomes when its model
changes."""

from __future__ import annotations

import gradio as gr

from kvlab.models.bundled import bundled_model, picker_choices
from kvlab.models.loading import ModelLoadError
from kvlab.models.sources import allow_local_folders

from .theme import line_html

PICKER_INFO = "a bundled model (offline), or type a hub id, a local folder or a local .gguf file"
PUBLIC_PICKER_INFO = "a bundled model (offline), or type a Hugging Face hub id (owner/name)"
"""The picker's hint where local sources are off (`kvlab.models.sources.allow_local_folders`)."""


def model_dropdown(value: str = "bundled", label: str = "Model", extra=(), **kwargs) -> gr.Dropdown:
    """A `gr.Dropdown` of the bundled models (then the `extra` (line, source) choices) that accepts free text;
    its value is the model source."""
    info = PICKER_INFO if allow_local_folders() else PUBLIC_PICKER_INFO
    return gr.Dropdown([*picker_choices(), *extra], value=value, label=label, allow_custom_value=True, info=info,
                       filterable=True, **kwargs)


def model_bar(dtypes: list[str], devices: list[str], extra=()):
    """Compare's model row: (source picker, dtype, device, Load button, status line), laid out in a row; `extra`:
    more (line, source) choices for the picker (Compare's speech model)."""
    with gr.Row(equal_height=False, elem_classes=["kv-modelbar"]):
        source = model_dropdown("bundled", scale=4, elem_id="kv-model", extra=extra)
        dtype = gr.Dropdown(dtypes, value="float32", label="dtype", scale=1, elem_id="kv-dtype",
                            interactive=len(dtypes) > 1,
                            info="half precision needs CUDA" if len(dtypes) == 1 else "weights and cache")
        device = gr.Dropdown(devices, value="auto", label="device", scale=1, elem_id="kv-device",
                             info="auto: CUDA if present, else CPU")
        load_button = gr.Button("Load", scale=0, min_width=90, elem_id="kv-load")
    status = gr.HTML(line_html("checking the model…", "busy"), elem_id="kv-model-status")
    return source, dtype, device, load_button, status


CHAT_INFO = "use the chat template"
BASE_INFO = "base model: no chat template, the prompt is plain text"


def chat_box(source: str, loaded, reset: bool) -> dict:
    """What the 'chat message' checkbox becomes for a model: on for a chat model when `reset` (the model was
    just picked), off and locked for a base model (no chat template), as is for a source not known yet.

    `loaded` (a LoadedModel or None) decides when given, else the bundled list; returns `gr.update` fields."""
    model = None
    try:
        model = bundled_model(source)
    except ModelLoadError:
        pass
    chat = loaded.has_chat_template if loaded is not None else (model.chat if model is not None else None)
    if chat is None:
        return {}
    if not chat:
        return {"value": False, "interactive": False, "info": BASE_INFO}
    return {"interactive": True, "info": CHAT_INFO, **({"value": True} if reset else {})}
