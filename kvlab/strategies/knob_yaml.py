"""Reading one knob value typed as text (`nbits=4`, `quantize=true`, `backend=hqq`), and showing a value in a
message, without trusting either.

`load_knob_value` reads the text as YAML (so `4` is an int and `true` a bool) through `KnobLoader`, PyYAML's
`SafeLoader` with anchors and aliases refused: an alias lets ~600 characters stand for a list of 10**6 items
(a "billion laughs" bomb). The text is capped at MAX_KNOB_VALUE_CHARS characters before it is parsed, and
every YAML error becomes one line naming the knob; `typed_knob` holds a value, however it was written (typed,
a preset, a saved record), to the kinds a knob takes: text, true/false, null, a finite number, a whole number
within a signed 64-bit integer's range (a `label` only text). `shown` is a value's `repr` cut to SHOWN_CHARS characters,
for messages that echo what was given; `brief` makes any message one line of at most MESSAGE_CHARS.

Pure: no model, no gradio.
"""

from __future__ import annotations

import yaml

MAX_KNOB_VALUE_CHARS = 1000
"""Longest knob value read, in characters (the longest real one, an engine column's base URL, is under 100)."""
SHOWN_CHARS = 60
"""Longest echo of a given value in a message, in characters (`shown`)."""
MAX_KNOB_INT = 2 ** 63 - 1
"""Largest whole number a knob takes, in magnitude (a signed 64-bit integer's range; torch's sizes are int64)."""
MESSAGE_CHARS = 400
"""Longest refusal a strategy's own check may give, in characters (`brief`): a cache's check deeper down may
echo a value whole."""


class AliasRefused(yaml.YAMLError):
    """The text uses a YAML anchor (`&a`) or alias (`*a`), which no knob value needs."""


class KnobLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader that refuses anchors and aliases as it composes, before any value is built."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise AliasRefused("YAML anchors and aliases (& and *) are not accepted in a knob value")
        return super().compose_node(parent, index)


def shown(value, limit: int = SHOWN_CHARS) -> str:
    """`repr(value)` cut to at most `limit` characters, ending in '…' when cut."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def brief(message: str, limit: int = MESSAGE_CHARS) -> str:
    """`message` on one line (runs of whitespace made one space; any other character that does not print, a
    control character or a lone surrogate, written as its Python escape such as `\\x1b` or `\\ud800`), cut
    to `limit` characters ending in '…'."""
    text = " ".join(str(message).split())
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _problem(err: yaml.YAMLError) -> str:
    """A YAML error in one short line: its problem (and where), without the echoed source lines."""
    if isinstance(err, yaml.MarkedYAMLError):
        text = err.problem or err.context or "not YAML"
        mark = err.problem_mark
        return f"{text} at character {mark.column + 1}" if mark is not None and mark.line == 0 else text
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def load_knob_value(key: str, text: str):
    """The value of knob `key` typed as `text`, read as YAML without anchors or aliases; a `label` (a column's
    name) is the text itself, stripped, so `label=2024-01-01` names a column rather than giving a date.

    Raises:
        ValueError: the text is longer than MAX_KNOB_VALUE_CHARS, or not YAML (a control character, an
            unclosed bracket, a `!!python` tag, an anchor or alias); one line naming the knob.
    """
    if len(text) > MAX_KNOB_VALUE_CHARS:
        raise ValueError(f"knob {shown(key)}: the value is {len(text):,} characters long; at most "
                         f"{MAX_KNOB_VALUE_CHARS:,} are read (MAX_KNOB_VALUE_CHARS)")
    if key == "label":
        return text.strip()
    try:
        return yaml.load(text, Loader=KnobLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        problem = " ".join(_problem(err).split())
        raise ValueError(f"knob {shown(key)}: {shown(text)} is not a value kvlab reads ({problem})") from None
    except RecursionError:
        raise ValueError(f"knob {shown(key)}: the value nests too deep to be a knob value") from None


def typed_knob(key: str, value):
    """`value` when it is of a kind knob `key` takes: text, a bool, None, a finite float or an int within
    ±MAX_KNOB_INT; a `label` (the column's name) only text.

    Raises:
        ValueError: any other kind (a list, a mapping, a date, an int past ±MAX_KNOB_INT, inf or NaN); one line
            naming the knob and the kinds it takes.
    """
    import math

    if key == "label":
        if isinstance(value, str):
            return value
        raise ValueError(f"knob 'label': a column's label is text, got {shown(value)}")
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        if -MAX_KNOB_INT <= value <= MAX_KNOB_INT:
            return value
        raise ValueError(f"knob {shown(key)}: {shown(value)} is past the largest whole number a knob takes "
                         f"(±{MAX_KNOB_INT:,})")
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise ValueError(f"knob {shown(key)}: {shown(value)} is not a finite number")
    raise ValueError(f"knob {shown(key)}: a {type(value).__name__} ({shown(value)}) is not a knob value; give "
                     f"text, a number, true/false or null")
