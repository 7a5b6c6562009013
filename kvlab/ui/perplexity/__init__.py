"""The Perplexity tab: `tab` lays out and wires; `view` (form -> a plan, `NllStep`s -> the view model) is pure."""
