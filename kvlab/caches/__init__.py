"""kvlab's own cache classes."""
