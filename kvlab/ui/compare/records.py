"""What a finished Compare run leaves behind, and the headless `compare` API's run.

- `page_preset`: the preset a page run is made from, which its record names; `record_for`: the run's record
  with what only the page has (as `python -m kvlab compare --json` writes it, plus slots, memory, refused).
- `write_exports`: that record and the summary CSV as files the page offers (the plots PNG is rendered only
  when asked for: `kvlab.ui.shared.live_plots`), kept where a restart finds them (`kvlab.ui.compare.kept_runs`:
  a size cap and an expiry); their folder's name is the result's share id (`share_id`), and `shared_exports`
  finds a shared result's files again for the page a share link opens.
- `code_text`: the reproduce-it transformers code for every column of a plan.
- `run_preset`: a preset run headless (the `/compare` API), returning its record.

No gradio.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import threading
from pathlib import Path

from kvlab.compare.runner import run_preset as run_compare_preset
from kvlab.compare.summary import rows_to_csv
from kvlab.generation import GenerationSettings, check_prompt
from kvlab.models.atomic import write_atomic
from kvlab.models.loading import ModelSpec
from kvlab.compare.preset import Preset, load_preset, parse_preset
from kvlab.protocol import RunDone, collect

from ..shared.code import code_snippet
from ..shared.exports import export_id_pattern, fresh_export_folder
from .kept_runs import RUNS_DIR_ENV, kept_folder, new_run_folder, prune
from .form import RunPlan
from .view import RunView

logger = logging.getLogger(__name__)

SHARE_PARAM = "run"
"""The URL query parameter of a share link: `?run=<share id>`."""
SHARE_PREFIX = "run-"
SHARE_ID = export_id_pattern(SHARE_PREFIX)
"""The exact form of a share id: `run-` and 32 hex digits (the kept folder's name, `kept_runs.new_run_folder`)."""
EXPORT_NAMES = ("kvlab-run.json", "kvlab-summary.csv")


def page_preset(plan: RunPlan) -> Preset:
    """The preset a page run is made from (its name, prompt, settings, mode, baseline and columns), which its
    record names (`kvlab.compare.runner.run_compare`'s `preset`)."""
    request = plan.request
    return parse_preset({
        "name": request.preset or "custom",
        "model": {"source": plan.spec.source, "dtype": plan.spec.dtype, "device": plan.spec.device},
        "prompt": {"text": request.prompt, "system": request.system or "", "chat": bool(request.chat)},
        "generation": dataclasses.asdict(plan.settings),
        "mode": request.mode,
        "baseline": plan.baseline_index(),
        "columns": [{"strategy": s.name, **s.knobs(), **(plan.budgets[slot].spec() if slot in plan.budgets else {})}
                    for slot, s in plan.columns],
    }, "page")


def record_for(plan: RunPlan, done: RunDone, view: RunView | None = None) -> dict:
    """The JSON run record of a page run (the run's own, as `python -m kvlab compare --json` writes it); with
    the run's `view`, also what only the page has: `slots` (the page column of each run column, its colour); and
    `refused`, the cards that were not run (slot, strategy, the knob fields as typed, why), when there were any.
    Its `memory` samples are the run's own (`kvlab.compare.summary.run_record`), as every front writes them."""
    request = plan.request
    record = dict(done.record)
    if plan.slot_errors:
        record["refused"] = [{"slot": slot, "strategy": request.slots[slot][0], "values": list(request.slots[slot][1]),
                              "message": message} for slot, message in sorted(plan.slot_errors.items())
                             if slot < len(request.slots)]
    if view is not None:
        record["slots"] = list(view.slots)
    return record


def write_exports(record: dict, rows: list[dict], owner: str | None = None) -> list[str]:
    """JSON record and summary CSV in a fresh kept folder (`kvlab.ui.compare.kept_runs.new_run_folder`), kept for
    the client at address `owner` (None: no client known); returns their paths.

    Then the kept results past the keeping rule are removed (`kept_runs.prune`: the owner's own oldest past its
    share, then the oldest of all past the cap; this one stays). gradio serves
    its own copies of the files. Each file is written whole (`kvlab.models.atomic.write_atomic`) and a share
    link needs both, so a process killed while writing leaves no share link to half a record; its folder goes
    when it expires.
    """
    folder = new_run_folder(SHARE_PREFIX, owner)
    try:
        write_atomic(folder / EXPORT_NAMES[0], json.dumps(record, indent=1))
        write_atomic(folder / EXPORT_NAMES[1], rows_to_csv(rows))
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)  # no folder without a share link's two files
        raise
    prune(SHARE_PREFIX, keep=folder)
    return [str(folder / name) for name in EXPORT_NAMES]


def keep_exports(record: dict, rows: list[dict], owner: str | None = None) -> tuple[list[str], str | None]:
    """(export paths, note): `write_exports`' kept files and None; or, when the runs folder cannot take them
    (full, read-only: any OSError), the same two files in a fresh folder under the system's temporary folder
    (`kvlab.ui.shared.exports.fresh_export_folder`, offered for download, no share link) and a one-line note saying
    why, naming `KVLAB_RUNS_DIR` and no server path. What the failed write made in the runs folder is removed.

    Raises:
        OSError: the temporary folder cannot take them either.
    """
    try:
        return write_exports(record, rows, owner), None
    except OSError as err:
        logger.warning("cannot keep a result in the runs folder (%s): %s", RUNS_DIR_ENV, err)
        reason = err.strerror or type(err).__name__
    folder = fresh_export_folder("unkept-")
    (folder / EXPORT_NAMES[0]).write_text(json.dumps(record, indent=1))
    (folder / EXPORT_NAMES[1]).write_text(rows_to_csv(rows))
    note = (f"this result has no share link: the server could not keep it ({reason}; "
            f"{RUNS_DIR_ENV}); its record and CSV are offered below")
    return [str(folder / name) for name in EXPORT_NAMES], note


def share_id(exports: list[str]) -> str:
    """The share id of a result from its `write_exports` paths: their folder's name (`run-…`)."""
    return Path(exports[0]).parent.name


def valid_share_id(run_id) -> bool:
    """Whether `run_id` has the exact form kvlab makes (SHARE_ID): checked before any file is touched, so no
    `..`, slash, other folder's name or over-long text ever reaches a path."""
    return isinstance(run_id, str) and SHARE_ID.fullmatch(run_id) is not None


def shared_exports(run_id: str | None) -> list[str] | None:
    """The export paths (record first) of the result `run_id` names, or None when it names none kept here
    (not a share id, or expired or evicted: `kvlab.ui.compare.kept_runs`). Nothing is touched unless
    `valid_share_id(run_id)`."""
    if not valid_share_id(run_id):
        return None
    folder = kept_folder(run_id)
    if folder is None:
        return None
    paths = [folder / name for name in EXPORT_NAMES]
    return [str(path) for path in paths] if all(path.is_file() for path in paths) else None


def code_text(plan: RunPlan, view: RunView | None = None) -> str:
    """One self-contained snippet per column; columns that could not run here say why."""
    request = plan.request
    blocks = []
    for i, (slot, strategy) in enumerate(plan.columns):
        header = f"# ── column {slot + 1}: {strategy.describe()} " + "─" * 20
        column = view.columns[i] if view is not None else None
        if column is not None and column.status in ("unavailable", "error"):
            header += f"\n# ({column.status} here: {column.message})"
        if slot in plan.budgets:
            header += (f"\n# (this column has a cache {plan.budgets[slot].describe()}: the code below is its first "
                       "cache; kvlab re-prefilled into each fallback cache as the run went, see the run's JSON)")
        blocks.append(header + "\n" + code_snippet(strategy, plan.settings, request.prompt, request.system or "",
                                                   bool(request.chat), plan.spec.source, plan.spec.dtype))
    return "\n\n".join(blocks)


def run_preset(loader, path, name: str, prompt: str | None = None, max_new_tokens: int | None = None,
               stop: threading.Event | None = None) -> dict:
    """Run a preset headless and return its JSON run record (what `python -m kvlab compare --json` writes).

    Args:
        loader: the tab's `kvlab.ui.shared.loader.BackgroundLoader`; path: the preset file; name: its name.
        prompt: replaces the preset's prompt text when given.
        max_new_tokens: replaces the preset's max_new_tokens when given.
        stop: set it to end every column within a token (the record then says the columns were stopped).

    Raises:
        PresetError, ModelLoadError, ValueError: bad input or a model that cannot load; the message says why.
    """
    data = load_preset(path).model_dump()
    if prompt is not None:
        check_prompt(prompt)
        data["prompt"]["text"] = prompt
    if max_new_tokens is not None:
        GenerationSettings(**{**data["generation"], "max_new_tokens": max_new_tokens}).check()
        data["generation"]["max_new_tokens"] = max_new_tokens
    parsed = parse_preset(data, name)
    parsed.settings().check()
    loaded = loader.get(ModelSpec(**parsed.model.model_dump()))
    return collect(run_compare_preset(loaded, parsed, stop or threading.Event())).record
