"""The Compare tab's speech parts: where the model is speech (the bundled Whisper tiny.en), a clip picker takes
the prompt box's place and Run transcribes the clip under each column's self-attention cache
(`kvlab.speech.runner.run_speech`, Compare's own events, so the columns, plots and summary are the text run's).

Lays out one component and says what the prompt's components become for a model source; no run logic.
"""

from __future__ import annotations

import gradio as gr

from kvlab.models.whisper import SPEECH_MODELS, speech_model
from kvlab.speech.clips import list_clips

CLIP_INFO = ("spoken once by espeak-ng from a sentence kvlab ships; its text is the reference for each column's "
             "word error rate")


def speech_choices() -> list[tuple[str, str]]:
    """(one-line description, source key) per bundled speech model, for Compare's model picker."""
    return [(model.line(), model.key) for model in SPEECH_MODELS.values()]


def clip_picker() -> gr.Dropdown:
    """The clip dropdown (hidden until a speech model is picked); its value is a clip's name."""
    clips = list_clips()
    return gr.Dropdown([(clip.line(), name) for name, clip in clips.items()], value=next(iter(clips)), label="Clip",
                       info=CLIP_INFO, visible=False, elem_id="kv-clip")


def for_source(source: str | None) -> list:
    """Updates for (prompt, system prompt, chat checkbox, clip picker) when the model source becomes `source`:
    a speech model shows the clip picker instead of the three prompt components."""
    speech = speech_model(source or "") is not None
    return [gr.update(visible=not speech)] * 3 + [gr.update(visible=speech)]
