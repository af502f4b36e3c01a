"""``gpufed console --listen``: HOST:PORT is parsed, anything else is refused naming the flag."""

from __future__ import annotations

import pytest

from gpufed.cli.console import parse_listen


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("127.0.0.1:8765", ("127.0.0.1", 8765)),
        ("[::1]:0", ("::1", 0)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
    ],
)
def test_host_and_port(value: str, parsed: tuple[str, int]) -> None:
    assert parse_listen(value) == parsed


@pytest.mark.parametrize("value", ["8765", ":8765", "host:", "host:port", "host:70000"])
def test_bad_values_name_the_flag_and_an_example(value: str) -> None:
    with pytest.raises(ValueError, match=r"--listen .*HOST:PORT.*127\.0\.0\.1:8765"):
        parse_listen(value)
