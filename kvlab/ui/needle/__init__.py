"""The Needle tab: `tab` lays out and wires; `view` (a needle run's events -> plot frames, status, summary) is pure."""
