"""The Inspect tab: `tab` lays out and wires; `view` (form -> a plan, step records -> the page) and `diverge`
(the "compare with" view: a lockstep session's records -> the divergence figure and summary) are pure."""
