"""What the Compare tab says about timing: the policy's help, the phase line (warm-up, re-timing), a column's
re-timed rate beside its live one, and the run's timing note (`kvlab.measure.noise.run_timing`). Pure text; no
gradio."""

from __future__ import annotations

PHASES = ("warm_up", "retiming")
"""The `RunPhase`s that have a line of their own; any other leaves the page's usual text."""

POLICY_INFO = "live: this run's figures; quiet: each column timed again after the run (slower)"
"""The one line beside the timing policy picker (docs/timing.md has the rest)."""
TIMING_HELP = ("The timing figures are the live run's, after a one-time warm-up; the `quiet` timing policy times "
               "each column again after the run and shows those (the cards show the live rate beside them); the "
               "plots are always the live run.")
"""The summary help's sentence on where the timing figures come from."""


def phase_text(phase, tokens: int) -> str | None:
    """The status line for a `kvlab.compare.events.RunPhase` (None when it has none): its detail, after the tokens so
    far once the columns ran."""
    if phase is None or phase.phase not in PHASES:
        return None
    if phase.phase == "warm_up":
        return f"warming up: {phase.detail}"
    return f"columns finished ({tokens} tokens); {phase.detail}"


def policy_readout(result, live_rate: float | None) -> str | None:
    """`24.3 tok/s (live 18.1)` for a column whose figures come from the quiet re-timing, else None."""
    if result is None or result.timing.policy != "quiet" or result.decode_tok_s is None:
        return None
    live = f" (live {live_rate:.1f})" if live_rate is not None else ""
    return f"{result.decode_tok_s:.1f} tok/s{live}"


def timing_line(timing: dict) -> str:
    """What the finished run's status line adds about its timing: how the figures were taken, and the busy
    note when the machine was too busy for a fair comparison ('' for a run without a timing record)."""
    if not timing:
        return ""
    parts = []
    if timing.get("policy") == "quiet":
        parts.append(f"timing: quiet re-timing of up to {timing.get('max_tokens')} tokens per column")
    if timing.get("replaced_steps"):
        n = timing["replaced_steps"]
        parts.append(f"{n} interrupted step{'s' if n != 1 else ''} timed again")
    if timing.get("warm_up_s"):
        parts.append(f"one-time warm-up {timing['warm_up_s']:.1f} s, not timed")
    if timing.get("note"):
        parts.append(timing["note"])
    return "".join(f" · {part}" for part in parts)
