"""Effect keys: canonical JSON (RFC 8785 after normalization), default keys, markers."""

from __future__ import annotations

import enum
import hashlib
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel

from runtime import canonical_json, default_effect_key, effect_marker, find_effect_markers
from runtime.keys import MAX_EFFECT_KEY_LENGTH, check_effect_key


class Inner(BaseModel):
    when: datetime
    amount: Decimal


class Outer(BaseModel):
    name: str
    inner: Inner
    tags: dict[str, int]


def test_keys_in_any_order_at_every_depth_give_one_text() -> None:
    one = {"b": [{"y": 1, "x": {"q": None, "p": True}}], "a": "é"}
    two = {"a": "é", "b": [{"x": {"p": True, "q": None}, "y": 1}]}
    assert canonical_json(one) == canonical_json(two) == (
        '{"a":"é","b":[{"x":{"p":true,"q":null},"y":1}]}')


def test_models_dump_in_json_mode_and_special_types_take_their_json_form() -> None:
    when = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    model = Outer(name="n", inner=Inner(when=when, amount=Decimal("1.50")), tags={"z": 1, "a": 2})
    as_json = {"tags": {"a": 2, "z": 1}, "name": "n",
               "inner": {"amount": "1.50", "when": "2024-01-02T03:04:05Z"}}
    assert canonical_json(model) == canonical_json(as_json)

    class Color(enum.Enum):
        RED = "red"

    ident = uuid.UUID(int=5)
    assert canonical_json([date(2024, 1, 2), ident, Decimal("2"), Color.RED, (1, 2)]) == (
        f'["2024-01-02","{ident}","2",' + '"red",[1,2]]')
    # Numbers as RFC 8785 writes them: 1 and 1.0 are one number.
    assert canonical_json({"n": 1.0}) == canonical_json({"n": 1}) == '{"n":1}'


@pytest.mark.parametrize(
    ("value", "path", "what"),
    [
        ({"cb": print}, "args.cb", "a function"),
        ({"a": [1, float("nan")]}, "args.a[1]", "the float nan"),
        ({"a": {"b": float("inf")}}, "args.a.b", "the float inf"),
        ({"s": {1, 2}}, "args.s", "a value of type set"),
        ({1: "x"}, "args[1]", "a mapping key of type int"),
        ({"big": 2**60}, "args.big", "the integer 1152921504606846976"),
        ({"o": object()}, "args.o", "a value of type object"),
        ({"raw": b"\xff"}, "args.raw", "a bytes without a JSON form"),
        ({"a": "\ud800"}, "args.a", "a string with a lone surrogate (U+D800 at index 0"),
        ({"l": ["ok", "x\udfff"]}, "args.l[1]", "a string with a lone surrogate (U+DFFF"),
        ({"\ud800": 1}, "args['\\ud800']", "a mapping key with a lone surrogate"),
    ],
)
def test_unsupported_values_name_the_tool_and_the_path(value: Any, path: str, what: str) -> None:
    with pytest.raises(TypeError) as caught:
        default_effect_key("run-1", "post_comment", value)
    message = str(caught.value)
    assert message.startswith(f"canonical_json (tool post_comment): {path} is {what}")


def test_a_lone_surrogate_without_a_tool_names_the_value_path() -> None:
    with pytest.raises(TypeError, match=r"^canonical_json: value\.a is a string with a lone"):
        canonical_json({"a": "\ud800"})


def test_a_cycle_is_a_type_error_not_a_recursion_error() -> None:
    loop: dict[str, Any] = {"a": []}
    loop["a"].append(loop)
    with pytest.raises(TypeError, match=r"value\.a\[0\] is a cycle"):
        canonical_json(loop)
    shared = [1]
    assert canonical_json({"x": shared, "y": shared}) == '{"x":[1],"y":[1]}'  # not a cycle


def test_the_default_key_is_run_tool_and_hash_of_the_canonical_args() -> None:
    args = {"issue": 7, "body": "hi"}
    digest = hashlib.sha256(b'{"body":"hi","issue":7}').hexdigest()
    assert default_effect_key("run-1", "post_comment", args) == f"run-1:post_comment:{digest}"
    assert default_effect_key("run-2", "post_comment", args) != default_effect_key(
        "run-1", "post_comment", args)
    assert default_effect_key("r", "tool", None) == default_effect_key("r", "tool", {})
    with pytest.raises(ValueError, match="run_id must be a non-empty string"):
        default_effect_key("", "tool", {})


def test_markers_round_trip_and_no_key_breaks_out_of_the_comment() -> None:
    assert effect_marker("run-1:comment:7") == "<!-- thread-effects:effect=run-1:comment:7 -->"
    nasty = ["a-->b", "x -- y", "100%", "<!-- x -->", "end-", "tab\tnew\nline", "é:ü", "--->"]
    text = "Intro\n" + "\n".join(f"para {effect_marker(k)} tail" for k in nasty)
    assert find_effect_markers(text) == nasty
    for key in nasty:
        marker = effect_marker(key)
        inner = marker.removeprefix("<!-- ").removesuffix(" -->")
        assert "--" not in inner.removeprefix("thread-effects:effect=") and ">" not in inner
    assert effect_marker("a-->b") == "<!-- thread-effects:effect=a-%2D%3Eb -->"
    assert find_effect_markers("no markers <!-- other --> here") == []
    assert find_effect_markers("<!-- thread-effects:effect=a%FFb -->") == ["a\ufffdb"]
    with pytest.raises(ValueError, match="non-empty"):
        effect_marker("")


def test_custom_keys_are_checked() -> None:
    assert check_effect_key("k", "t") == "k"
    with pytest.raises(TypeError, match="tool t: effect_key must return a string, got int"):
        check_effect_key(5, "t")
    with pytest.raises(ValueError, match="empty"):
        check_effect_key("", "t")
    with pytest.raises(ValueError, match=f"over the limit of {MAX_EFFECT_KEY_LENGTH}"):
        check_effect_key("k" * (MAX_EFFECT_KEY_LENGTH + 1), "t")
