"""Inspect's wing: looking inside a run step by step (divergence forensics against a dense reference)."""
