"""The Plan tab: `tab` lays out and wires; `view` (form -> a `PlanRequest`, a `Plan` -> rows, series, text) is pure."""
