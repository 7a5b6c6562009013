"""How a comparison's columns share the machine: the run modes (see `kvlab.compare.runner`).

Weight-free: the preset schema (`kvlab.compare.preset`) and the Compare tab read it. A column itself is the core's
`kvlab.columns.Column`.
"""

from __future__ import annotations

MODES = ("fair", "parallel", "sequential")
"""How a comparison's columns share the machine (see `kvlab.compare.runner`)."""
