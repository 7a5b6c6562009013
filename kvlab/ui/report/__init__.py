"""The Report tab: `tab` lays out and wires; `view` (the form -> a plan, report events or saved records -> table,
plot frame, status) is pure."""
