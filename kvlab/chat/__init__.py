"""The chat wing: multi-turn chat with one cache kept across turns, and prefix reuse.

`session` runs a conversation (`ChatSession`; its typed events and `TurnStats` are `events`), `prefix` answers
several prompts from copies of one prefilled cache, `reuse` is what both share
(how much of a cache to reuse, generating one reply). Rendering is the UI's and
the CLI's.
"""
