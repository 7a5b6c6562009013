"""The one safe reader of record files (`kvlab.measure.record_json`): the size is checked before a byte is read,
nesting, bracket count, NaN / Infinity and huge numbers are refused without Python's recursion being reached,
field types are checked strictly and only known fields kept; every refusal is one line."""

import json
from pathlib import Path

import pytest
from typing_extensions import Required, TypedDict

from kvlab.measure.record_json import (DEFAULT_MAX_RECORD_MB, MAX_CONTAINERS, MAX_DEPTH, MAX_RECORD_MB_ENV,
                                       RecordJSONError, cap_text, load_json, max_record_bytes, nesting, parse,
                                       shaped, version_refusal)

ROOT = Path(__file__).resolve().parents[2]


def refusal(data) -> str:
    with pytest.raises(RecordJSONError) as caught:
        load_json(data)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("text, depth", [("[" * 10_000 + "]" * 10_000, 10_000),
                                         ('{"a":' * 5_000 + "1" + "}" * 5_000, 5_000),
                                         ("[" * 10_000, 10_000)])  # never closed: json would still recurse
def test_nesting_past_the_limit_is_refused_before_json_recurses(text, depth, monkeypatch):
    monkeypatch.setattr(json, "loads", lambda *a, **k: pytest.fail("json parsed a 10,000-deep text"))
    assert nesting(text)[0] == depth
    assert f"nests {depth} levels deep" in refusal(text.encode())


def test_brackets_inside_strings_do_not_count_and_escapes_do_not_hide_any():
    assert nesting('{"a": "[[[[[[", "b": "\\"[[[["}')[0] == 1
    assert nesting('{"a": "\\\\", "b": [[1]]}')[0] == 3  # an escaped backslash ends its string
    assert parse(json.dumps({"a": "[" * 40})) == {"a": "[" * 40}


def test_more_brackets_than_any_record_holds_are_refused_before_parsing():
    message = refusal(("[" + "[]," * (MAX_CONTAINERS + 1) + "[]]").encode())
    assert f"more than {2 * MAX_CONTAINERS:,} brackets" in message


@pytest.mark.parametrize("text, said", [('{"a": NaN}', "NaN"), ('{"a": [Infinity]}', "Infinity"),
                                        ('{"a": -Infinity}', "-Infinity"), ('{"a": 1e999}', "too large"),
                                        ('{"a": -2e15}', "too large"), ('{"a": 1.' + "5" * 60 + "}", "too long"),
                                        ('{"a": ' + "9" * 5_000 + "}", "integer of 5000 digits"),
                                        ('{"a": ' + "1" * 21 + "}", "integer of 21 digits")])
def test_nan_infinity_and_huge_numbers_are_refused(text, said):
    assert said in refusal(text.encode())


@pytest.mark.parametrize("data, said", [(b"{", "not a JSON file"), (b"\xff\xfe{}", "not UTF-8"),
                                        (b"[1, 2]", "not an object (it is an array)"),
                                        (b'"text"', "not an object (it is a string)"), (b"null", "(it is null)")])
def test_what_is_not_a_json_object_is_one_line(data, said):
    assert said in refusal(data)


def test_the_size_is_checked_before_a_byte_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv(MAX_RECORD_MB_ENV, "1")
    big = tmp_path / "big.json"
    big.write_bytes(b"{" + b" " * 2**20 + b"}")
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("an over-size file was read"))
    message = refusal(big)
    assert "1.0 MiB, more than the 1 MiB a kvlab record may be (KVLAB_MAX_RECORD_MB)" in message
    assert str(tmp_path) not in message and "big.json" not in message  # no server path, no name: the reader's
    assert "more than the 1 MiB" in refusal(b"{" + b" " * 2**20 + b"}")


def test_the_size_setting_is_checked_and_named(monkeypatch):
    monkeypatch.delenv(MAX_RECORD_MB_ENV, raising=False)
    assert max_record_bytes() == DEFAULT_MAX_RECORD_MB * 2**20 and cap_text() == "at most 16 MiB (KVLAB_MAX_RECORD_MB)"
    for bad in ("0", "-3", "lots", "1.5"):
        monkeypatch.setenv(MAX_RECORD_MB_ENV, bad)
        with pytest.raises(ValueError, match=f"KVLAB_MAX_RECORD_MB must be a whole number of MiB >= 1, got '{bad}'"):
            max_record_bytes()
        assert refusal(b"{}").startswith("KVLAB_MAX_RECORD_MB must be")


def test_real_records_fit_every_limit_with_room():
    """The shipped leaderboard records and an old command-line record read whole, well inside the limits."""
    for path in [*sorted((ROOT / "records").glob("*.json")), ROOT / "tests" / "fixtures" / "record_v2_quickstart.json"]:
        text = path.read_text()
        assert load_json(path) == json.loads(text)
        depth, brackets = nesting(text)
        assert depth <= MAX_DEPTH // 2 and brackets < MAX_CONTAINERS and len(text) < max_record_bytes() / 100


class Inner(TypedDict, total=False):
    name: Required[str]
    size: int | None


class Outer(TypedDict, total=False):
    kind: Required[str]
    parts: list[Inner]


def test_shaped_checks_types_strictly_and_keeps_only_known_fields():
    value = {"kind": "k", "extra": "<img src=x>", "parts": [{"name": "a", "size": 3, "evil": {"deep": 1}}]}
    assert shaped(value, Outer, "it") == {"kind": "k", "parts": [{"name": "a", "size": 3}]}
    for bad, said in [({"kind": "k", "parts": [{"name": 5}]}, "its field parts[0].name should be a valid string"),
                      ({"kind": "k", "parts": [{"name": "a", "size": "3"}]}, "parts[0].size should be a valid integer"),
                      ({"kind": "k", "parts": [{"size": 3}]}, "its field parts[0].name is missing"),
                      ({"kind": "k", "parts": {"name": "a"}}, "parts should be a valid list"),
                      ({"kind": "k", "parts": [True]}, "parts[0] should be a valid dictionary"),
                      ({"kind": 1.5}, "its field kind should be a valid string")]:
        with pytest.raises(RecordJSONError) as caught:
            shaped(bad, Outer, "its")
        assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_record_key_that_is_not_a_plain_name_is_not_echoed():
    with pytest.raises(RecordJSONError) as caught:
        shaped({"<b>x</b>": "y"}, dict[str, int], "its")
    assert "<b>" not in str(caught.value) and "[…]" in str(caught.value)


def test_every_reader_refuses_an_unread_version_in_the_same_words():
    assert version_refusal("report", "version", 1, (1,)) is None
    for found in (99, 0, "1", True, None, [1]):
        line = version_refusal("report", "version", found, (1,))
        assert line.startswith("report record version ") and "cannot be read by this kvlab, which reads version 1" in line
    assert version_refusal("Compare", "format_version", 99, (2, 3)) == (
        "Compare record format_version 99 cannot be read by this kvlab, which reads versions 2 and 3 (a newer kvlab "
        "wrote it, or another tool)")
