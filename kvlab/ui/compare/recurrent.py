"""The Compare tab's recurrent parts: the bundled random-weight Mamba-2 in the model picker, and its run
(`kvlab.recurrent.runner.run_recurrent`, Compare's own events) laid out on the page: the picked columns in their
slots, the KV reference in the first slot no column uses (none when all are used: the run then has no reference).

No layout of its own and no run logic: it chooses the runner and the slots.
"""

from __future__ import annotations

from kvlab.columns import MAX_COLUMNS
from kvlab.models.recurrent import RECURRENT_MODELS
from kvlab.recurrent.runner import REFERENCE_TITLE, run_recurrent


def recurrent_choices() -> list[tuple[str, str]]:
    """(one-line description, source key) per bundled recurrent model, for Compare's model picker."""
    return [(model.line(), model.key) for model in RECURRENT_MODELS.values()]


def recurrent_run(loaded, prompt_ids, columns: list, slots: list[int], settings, stop):
    """(events, run titles, page slots) of a recurrent run: the columns in `slots`, then the KV reference in the
    first free slot (left out when every slot is taken)."""
    free = [slot for slot in range(MAX_COLUMNS) if slot not in slots]
    reference = bool(free)
    events = run_recurrent(loaded, prompt_ids, columns, settings, stop, reference=reference)
    titles = [column.describe() for column in columns] + ([REFERENCE_TITLE] if reference else [])
    return events, titles, list(slots) + free[:1]
