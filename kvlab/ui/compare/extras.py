"""The Compare tab's replay, share link, `compare` API and ZeroGPU sizing, as plain functions and one small object.

- `replay`: an uploaded run record (`kvlab.compare.replay`) shown as it was measured: the cards set to the recorded
  strategies, the columns' text and status, the native plots, the summary, the code, and the status line
  `replayed: measured on <machine> at <time> · ` and the run's own finished line; a file that cannot be replayed says why there.
- `open_shared`: the result a share link names (`?run=<id>`), shown as `replay` shows it; an id not of the exact
  form kvlab makes (`kvlab.ui.compare.records.valid_share_id`) is refused in one line before any file is touched.
- `run_gpu_s`: the GPU seconds a Run asks ZeroGPU for (`kvlab.ui.hosting.zerogpu.estimate_s`, columns × tokens).
- `run_cost`: what a Run costs before it is queued (`kvlab.ui.hosting.costs.compare_cost`).
- `wait_for_model`: start or join a model's load, yielding its progress into the status lines.
- `CompareApi`: the headless `compare` API (a preset run, returning its JSON record), its cost and its GPU seconds.

Each takes what it needs (a `CompareUpdater`, the loader, the preset files); none reads the tab itself.
"""

from __future__ import annotations

import logging
import threading
import time

import gradio as gr

from kvlab.compare.replay import RecordError, load_record
from kvlab.models.loading import ModelLoadError, ModelSpec
from kvlab.generation import MAX_NEW_TOKENS_CAP
from kvlab.compare.preset import PresetError, load_preset
from kvlab.sharing.cost import RunCost

from ..hosting import zerogpu
from ..hosting.costs import compare_cost, whole
from ..hosting.turns import ToolError
from kvlab.strategies.knob_yaml import shown
from .replay import form_values, replay_code, view_from_record
from .updates import CompareUpdater
from ..shared.knobs import NO_STRATEGY
from .kept_runs import policy_text
from .records import SHARE_PARAM, run_preset, shared_exports, valid_share_id
from ..shared.theme import line_html

logger = logging.getLogger(__name__)
LOAD_POLL_S = 0.5


def wait_for_model(loader, spec: ModelSpec, run_status, model_status):
    """Generator: start or join the load of `spec` on `loader`, yielding {component: update} progress for the
    `run_status` and `model_status` lines; returns the loaded model.

    Raises:
        ModelLoadError: the load failed (its message).
    """
    from .form import model_line

    status = loader.start(spec)
    while status.state == "loading":
        yield {run_status: line_html(f"{status.message} ({100 * status.fraction:.0f}%)", "busy"),
               model_status: model_line(status, spec)}
        time.sleep(LOAD_POLL_S)
        status = loader.status(spec)
    if status.state != "ready":
        raise ModelLoadError(status.message or f"could not load {spec.source!r}")
    yield {model_status: model_line(status, spec)}
    return status.loaded


def run_gpu_s(strategies: list[str | None], max_new_tokens) -> int:
    """ZeroGPU seconds a Run asks for: its picked columns (`strategies`, one per card) × max new tokens."""
    columns = sum(name not in (None, "", NO_STRATEGY) for name in strategies)
    try:
        tokens = int(max_new_tokens or 1)
    except (TypeError, ValueError):
        tokens = 1
    return zerogpu.estimate_s(columns, tokens)


def run_cost(strategies: list[str | None], max_new_tokens, prompt: str | None, system: str | None) -> RunCost:
    """What a Run costs (`kvlab.sharing.cost.RunCost`): its picked columns (`strategies`, one per card) × max new
    tokens after the prompt."""
    picked = [name for name in strategies if name not in (None, "", NO_STRATEGY)]
    return compare_cost(picked, max_new_tokens, prompt, system)


def takes(component, value) -> bool:
    """Whether form `component` takes a recorded `value` as it is: one of its choices (unless it takes free
    text), a number within its range. A value it would refuse when Run is pressed is not put in the form."""
    choices = getattr(component, "choices", None)
    if choices and not getattr(component, "allow_custom_value", False):
        return value in [choice[1] if isinstance(choice, tuple) else choice for choice in choices]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high = getattr(component, "minimum", None), getattr(component, "maximum", None)
        return (low is None or value >= low) and (high is None or value <= high)
    return True


def replay(updater: CompareUpdater, path: str | None, session: dict, exports: list[str] | None = None,
           owner: str | None = None) -> dict:
    """A record uploaded: its columns, plots, summary and code as measured, and the form it was made with (prompt,
    settings, model; refused cards with their reasons), labelled `replayed: measured on <machine> at <time> ·`
    and the run's own finished line (its wall time, summary time, fidelity and timing marks, as it ended); a
    file that is not a replayable record, or holds a field of the wrong type, says why in the status line, in one
    line. `exports`: the result's files when they are already kept here (a share link), else they are written
    from the record as read (its known fields only), kept for the client at address `owner`. The replayed view is kept in `session["view"]` (for the PNG
    export)."""
    if not path:
        return {updater.run_status: gr.skip()}
    try:
        replayed = load_record(path)  # its messages never name the file, so no server path reaches the page
    except RecordError as err:
        return {updater.run_status: line_html(f"✖ cannot replay this file: {err}", "error")}
    try:
        view = view_from_record(replayed)
        form = {updater.form[name]: value for name, value in form_values(replayed.record).items()
                if name in updater.form and takes(updater.form[name], value)}
        updates = {**form, **updater.plots.cleared(), **updater.columns(view, set(range(len(view.columns)))),
                   **updater.plots.updates(view), **updater.summary_updates(view, replayed.record, exports, owner),
                   updater.code: replay_code(replayed.record),
                   updater.run_status: line_html(f"{replayed.label} · {view.progress_text()}", "ok")}
        updates = {**updater.recorded_cards(view, replayed.record), **updates}
    except Exception:  # a record of the right types whose values no run makes: the page says so and keeps serving
        logger.exception("a record that passed its checks could not be shown")
        return {updater.run_status: line_html("✖ cannot replay this file: its values are not those of a kvlab "
                                              "run (the server log has the details)", "error")}
    session["view"] = view
    return updates


def open_shared(updater: CompareUpdater, session: dict, request: gr.Request | None) -> dict:
    """Page load: the result a share link names (`?run=<id>`, `kvlab.ui.compare.records.SHARE_PARAM`) shown as
    `replay` shows it, with its own exports and link; nothing without the parameter; a link whose result
    is no longer kept (expired or evicted, `kvlab.ui.compare.kept_runs`) says so, and the keeping rule, in one
    line."""
    run_id = dict(request.query_params).get(SHARE_PARAM) if request is not None else None
    if not run_id:
        return {updater.run_status: gr.skip()}  # an empty dict would read as one value for every output
    if not valid_share_id(run_id):  # checked before any file is touched; the id itself is not echoed
        return {updater.run_status: line_html("✖ this link does not name a shared result (its id is not one this "
                                              "app makes): ask for the link again", "error")}
    exports = shared_exports(run_id)
    if exports is None:
        return {updater.run_status: line_html(f"✖ this shared result is not kept on this server any more (results "
                                              f"are {policy_text()}): run it again", "error")}
    return replay(updater, exports[0], session, exports)


class CompareApi:
    """The headless `compare` API: `loader` (a `kvlab.ui.shared.loader.BackgroundLoader`) and `presets` (name -> file,
    `kvlab.compare.preset.list_presets`)."""

    def __init__(self, loader, presets: dict):
        self.loader = loader
        self.presets = presets

    def gpu_s(self, preset: str, prompt: str | None = None, max_new_tokens: int | None = None, **_) -> int:
        """ZeroGPU seconds a `compare` API call asks for: the preset's columns × its (or the given) tokens."""
        try:
            loaded = load_preset(self.presets[preset])
        except (KeyError, PresetError):
            return zerogpu.MIN_DURATION_S
        return zerogpu.estimate_s(len(loaded.columns), int(max_new_tokens or loaded.generation.max_new_tokens))

    def cost(self, preset: str, prompt: str | None = None, max_new_tokens: int | None = None) -> RunCost:
        """What a `compare` API call costs: the preset's columns, each with its (or the given) max new tokens,
        after its (or the given) prompt. An unknown preset or max_new_tokens out of range is a `gr.Error` here,
        before the call is queued; a preset that does not load costs one step (the call then says why)."""
        if preset not in self.presets:
            raise ToolError(f"unknown preset {shown(preset)}; available: {', '.join(self.presets)}")
        if max_new_tokens is not None and not 1 <= whole(max_new_tokens, 0) <= MAX_NEW_TOKENS_CAP:
            raise ToolError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_CAP}, got {shown(max_new_tokens)}")
        try:
            loaded = load_preset(self.presets[preset])
        except PresetError:
            return RunCost(1, 1)
        columns = [str(column.get("strategy", "")) for column in loaded.columns]
        tokens = max_new_tokens if max_new_tokens is not None else loaded.generation.max_new_tokens
        text = prompt if prompt is not None else loaded.prompt.text
        return compare_cost(columns, tokens, text, loaded.prompt.system)

    def compare(self, preset: str, prompt: str | None = None, max_new_tokens: int | None = None, *,
                stop: threading.Event | None = None) -> dict:
        """Run a preset headless and return its JSON run record (what `python -m kvlab compare --json` writes).

        Args:
            preset: the name of a file in presets/ (e.g. "quickstart").
            prompt: replaces the preset's prompt text when given.
            max_new_tokens: replaces the preset's max_new_tokens when given.
        """
        if preset not in self.presets:
            raise ToolError(f"unknown preset {shown(preset)}; available: {', '.join(self.presets)}")
        try:
            return run_preset(self.loader, self.presets[preset], preset, prompt, max_new_tokens, stop)
        except (PresetError, ModelLoadError, ValueError) as err:
            raise ToolError(str(err)) from None
