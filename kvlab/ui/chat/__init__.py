"""The Chat tab: `tab` lays out and wires; `view` (form -> strategy and settings, session events -> the page)
and `sessions` (how many chat caches live at once, how long an idle one is kept) are pure."""
