"""The Perplexity tab: `tab` lays out and wires; `view` (form -> a plan, scored tokens -> the view model) is pure."""
