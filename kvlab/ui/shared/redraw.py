"""gradio's native-plot redraw protocol, owned by one object: `Redraw`.

A native plot (`gr.LinePlot`, `gr.ScatterPlot`) builds its vega spec (axis types, the colour domain) from its
first value, and again only when a prop such as `color_map` changes, and then from the value it held *before*
that update. So a tab's frames hold every series of the plot's roster from the first frame on (blank rows, see
`kvlab.ui.shared.live_plots.roster_update`), and the tab forces a rebuild from a chosen frame by flipping the
case of the colour map's hex (`live_plots.roster_colors`). A tab's `draw(primer=False, blank=False)` returns
the {component: update} of one frame:

- `primer`: the colours in lower-case hex (upper case otherwise); the spec is rebuilt whenever the case flips,
  from the frame sent just before;
- `blank`: no point drawn, every series of the roster present.

`Redraw(draw)` yields each situation's frames in order:

- a live run, whose frames are spaced by its compute: `live` (a primer until the run has a point, upper case
  after), `ahead` (one upper-case frame with no point before the event that may bring the first one, so that
  point is drawn in the update that carries it), `finish` (SETTLE's frames back to back);
- rows shown at once (a replay): `replay` (REPLAY's frames, FRAME_GAP_S apart);
- the same rows against another figure: `switch` (SETTLE's frames, FRAME_GAP_S apart).

`time.sleep` makes the gaps, so the calling generator holds its worker thread for them (gradio's usual
streaming handler). No gradio import: `draw` builds the updates.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

FRAME_GAP_S = 0.5
"""Seconds between the frames of `replay` and `switch`. The native plot rebuilds its vega spec asynchronously
from the data of the frame before; frames sent back to back reach the page in one batch and the intermediate
ones are skipped, leaving an empty plot. A live run's frames are spaced by its compute."""
REPLAY = (dict(primer=True, blank=True), dict(blank=True), {}, dict(primer=True))
"""A replay's frames: a blank primer (every series, no point), a blank frame (upper case: the spec is rebuilt
from the primer), the rows, the rows as a primer (the spec is rebuilt from the rows)."""
SETTLE = ({}, dict(primer=True))
"""The frames that end a run or switch the figure: the rows, then the rows as a primer (the spec is rebuilt from
them: a fresh layout, titles and legends as they end)."""


@dataclass(frozen=True)
class Redraw:
    """The frames of one plot redraw (see the module docstring).

    draw: `draw(primer=False, blank=False) -> {component: update}`, called with each frame's flags as keywords
        (a flag not set is left out, so a `draw` used only for live runs and `switch` need not take `blank`).
    """

    draw: Callable[..., dict]

    def frames(self, flags: Iterable[dict], first: dict | None = None, gap_s: float = FRAME_GAP_S) -> Iterator[dict]:
        """`draw(**f)` for each flag set `f` of `flags`, in order, `gap_s` seconds apart (no wait before the first;
        none at all for 0); `first` ({component: update} of other components) goes with the first frame."""
        for i, flag in enumerate(flags):
            if i and gap_s:
                time.sleep(gap_s)
            yield {**first, **self.draw(**flag)} if i == 0 and first else self.draw(**flag)

    def live(self, points: bool) -> dict:
        """A live run's frame: a primer while the run has no point (`points` false), upper case once it has."""
        return self.draw(primer=not points)

    def ahead(self, points: bool) -> Iterator[dict]:
        """Before an event that may bring the run's first point: one upper-case frame while there is none
        (`points` false; the spec is rebuilt from the primer before), nothing once there is."""
        if not points:
            yield self.draw()

    def finish(self, last: dict | None = None) -> Iterator[dict]:
        """A live run's end: SETTLE's two frames back to back, `last` (e.g. the download) with the first."""
        return self.frames(SETTLE, last, gap_s=0)

    def replay(self, first: dict | None = None) -> Iterator[dict]:
        """Rows shown at once: REPLAY's four frames FRAME_GAP_S apart, `first` (status, table…) with the first."""
        return self.frames(REPLAY, first)

    def switch(self) -> Iterator[dict]:
        """The same rows against another figure: SETTLE's two frames FRAME_GAP_S apart."""
        return self.frames(SETTLE)
