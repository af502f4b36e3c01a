"""The structural limits of untrusted input are pinned: quantities (characters, grammar,
exponent, magnitude) and JSON-like templates (depth, values, characters), each refused with an
error naming the field, before any arithmetic or recursive code runs."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from gpufed.api.bounds import (
    MAX_TEMPLATE_CHARS,
    MAX_TEMPLATE_DEPTH,
    MAX_TEMPLATE_VALUES,
    Shape,
    measure,
)
from gpufed.api.errors import MAX_ERROR_CHARS, FieldError, clip
from gpufed.api.resources import (
    MAX_QUANTITY,
    MAX_QUANTITY_CHARS,
    MAX_QUANTITY_EXPONENT,
    QuantityError,
    parse_quantity,
    to_canonical,
)


def test_the_limits_are_what_the_docs_say() -> None:
    assert (MAX_QUANTITY_CHARS, MAX_QUANTITY_EXPONENT, MAX_QUANTITY) == (64, 64, 2**63 - 1)
    assert (MAX_TEMPLATE_DEPTH, MAX_TEMPLATE_VALUES, MAX_TEMPLATE_CHARS) == (64, 10_000, 1572864)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("1e999999999", "exponent 999999999"),
        ("1e65", "exponent 65"),
        ("1e-65", "exponent -65"),
        ("9" * 1_000_000, "1000000 characters long"),
        ("1" + "0" * 63, "larger than Kubernetes can hold"),
        ("9223372036854775808", "larger than Kubernetes can hold"),
        ("8Ei", "larger than Kubernetes can hold"),
        ("1e20", "larger than Kubernetes can hold"),
        ("1K", "not a Kubernetes quantity"),
        ("1e", "not a Kubernetes quantity"),
        (".", "not a Kubernetes quantity"),
        (10**4000, "larger than Kubernetes can hold"),
        (1e300, "larger than Kubernetes can hold"),
        (Decimal("1e999999999"), "larger than Kubernetes can hold"),
    ],
)
def test_an_absurd_quantity_is_refused_naming_the_field(value: Any, says: str) -> None:
    with pytest.raises(QuantityError) as err:
        to_canonical("nvidia.com/gpu", value, field="spec.containers[0].resources.limits")
    assert str(err.value).startswith("spec.containers[0].resources.limits: ")
    assert says in str(err.value)
    assert len(str(err.value)) < 400, "the message never quotes a huge input whole"


@pytest.mark.parametrize(
    ("value", "amount"),
    [
        ("9223372036854775807", 2**63 - 1),
        ("7Ei", 7 * 2**60),
        ("1e18", 10**18),
        ("1e-64", 1),
        ("+2", 2),
        (".5", 1),
        ("0000000000000000000000000000000000000000000000000000000000000008", 8),
    ],
)
def test_quantities_up_to_the_limits_still_parse(value: str, amount: int) -> None:
    assert to_canonical("memory", value) == amount


def test_the_largest_cpu_is_in_millicores_past_int64_and_left_to_the_caller() -> None:
    # parse_quantity bounds the value; callers that scale it (cpu x 1000) check int64 after.
    assert parse_quantity("9223372036854775807") == MAX_QUANTITY


def nested(depth: int) -> list[Any]:
    root: list[Any] = []
    cur = root
    for _ in range(depth - 1):
        nxt: list[Any] = []
        cur.append(nxt)
        cur = nxt
    return root


def test_depth_is_counted_in_maps_and_lists_and_refused_past_the_limit_with_the_path() -> None:
    assert measure({"a": [1, {"b": "xy"}]}, field="t") == Shape(depth=3, values=5, chars=4)
    assert measure(nested(MAX_TEMPLATE_DEPTH), field="t").depth == MAX_TEMPLATE_DEPTH
    with pytest.raises(FieldError) as err:
        measure({"spec": nested(100_000)}, field="spec.template")
    assert err.value.field.startswith("spec.template.spec[0][0]")
    assert f"more than {MAX_TEMPLATE_DEPTH}" in err.value.message


def test_values_and_characters_are_refused_past_their_limits() -> None:
    with pytest.raises(FieldError, match="more than 10000 values"):
        measure({"env": [{"name": "x"}] * 5001}, field="spec.template")
    with pytest.raises(FieldError, match="more than 10000 values"):
        measure({str(i): i for i in range(1_000_000)}, field="spec.template")
    with pytest.raises(FieldError, match="characters of keys and strings"):
        measure({"data": "x" * (MAX_TEMPLATE_CHARS + 1)}, field="spec.template")


def test_clip_keeps_short_text_and_says_how_long_long_text_was() -> None:
    assert clip("short") == "short"
    long = clip("x" * 100_000)
    assert len(long) <= MAX_ERROR_CHARS
    assert long.endswith("(100000 characters)")
