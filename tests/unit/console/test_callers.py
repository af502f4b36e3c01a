"""The console served for callers (:mod:`gpufed.console.callers` and the server's login):
tokens are bounded and cleaned, each caller gets its own reader (bounded, idle ones dropped,
closed when evicted), and the app answers 401 with the login form until a token comes."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from kubernetes_asyncio import client

from gpufed.console import callers as callers_mod
from gpufed.console.callers import (
    COOKIE,
    MAX_TOKEN_BYTES,
    CallerReaders,
    TokenRefused,
    clean_token,
)
from gpufed.console.reader import Listed
from gpufed.console.server import make_app


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (None, None),
        ("", None),
        ("Bearer ", None),
        ("Bearer abc.def", "abc.def"),
        ("bearer  abc ", "abc"),
        ("abc", "abc"),
    ],
)
def test_clean_token_takes_the_header_or_the_cookie_form(raw: str | None, want: str | None) -> None:
    assert clean_token(raw) == want


@pytest.mark.parametrize(
    "raw", ["a" * (MAX_TOKEN_BYTES + 1), "abc def", "abc\ndef", "tok\u00e9n", "a\x00b"]
)
def test_clean_token_refuses_long_or_odd_tokens(raw: str) -> None:
    with pytest.raises(TokenRefused):
        clean_token(raw)


@pytest.fixture
def whoami(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Tokens the fake API server accepts: token -> user name; any other is a 401."""
    known: dict[str, str] = {}

    async def fake(api: client.ApiClient) -> str:
        token = api.configuration.api_key["BearerToken"]
        if token not in known:
            raise TokenRefused("the hub cluster's API server did not accept the token")
        return known[token]

    monkeypatch.setattr(callers_mod, "_whoami", fake)
    return known


def _base() -> client.Configuration:
    cfg = client.Configuration(host="https://hub.example:6443")
    cfg.api_key = {"BearerToken": "the-consoles-own"}
    cfg.cert_file = "/etc/own.crt"
    return cfg


async def test_each_caller_reads_with_its_own_token_never_the_consoles(
    whoami: dict[str, str],
) -> None:
    whoami.update({"t-a": "system:serviceaccount:team-a:viewer", "t-b": "alice"})
    readers = CallerReaders(_base())
    try:
        a = await readers.reader("t-a")
        b = await readers.reader("t-b")
        assert a is not b
        assert a._api.configuration.api_key == {"BearerToken": "t-a"}
        assert b._api.configuration.api_key == {"BearerToken": "t-b"}
        assert a._api.configuration.cert_file is None
        assert a.namespaces == ["team-a"]  # the service account's own namespace
        assert b.namespaces == ["default"]
        assert "alice" in b.source.describe()
        assert await readers.reader("t-a") is a  # kept
        with pytest.raises(TokenRefused):
            await readers.reader("forged")
        assert len(readers) == 2
    finally:
        await readers.close()


async def test_readers_are_bounded_and_idle_ones_dropped(whoami: dict[str, str]) -> None:
    now = [0.0]
    whoami.update({f"t{i}": f"u{i}" for i in range(5)})
    readers = CallerReaders(_base(), clock=lambda: now[0], max_callers=3, idle_s=60)
    closed: list[str] = []
    try:
        for i in range(5):
            r = await readers.reader(f"t{i}")
            original = r.close

            async def close(r: Any = r, original: Any = original) -> None:
                closed.append(r.source.user)
                await original()

            r.close = close  # type: ignore[method-assign]
        assert len(readers) == 3
        assert closed == ["u0", "u1"]  # least recently used, evicted and closed
        now[0] = 30
        await readers.reader("t4")  # used again at 30
        now[0] = 80
        await readers.reader("t4")  # t2, t3 idle 80 s > 60: dropped and closed
        assert len(readers) == 1
        assert closed[2:] == ["u2", "u3"]
    finally:
        await readers.close()


async def test_a_refused_token_is_not_asked_about_again_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    async def fake(api: client.ApiClient) -> str:
        asked.append(api.configuration.api_key["BearerToken"])
        raise TokenRefused("the hub cluster's API server did not accept the token")

    monkeypatch.setattr(callers_mod, "_whoami", fake)
    now = [0.0]
    readers = CallerReaders(_base(), clock=lambda: now[0])
    for _ in range(3):
        with pytest.raises(TokenRefused):
            await readers.reader("forged")
    assert asked == ["forged"]
    now[0] = callers_mod.REFUSED_S + 1
    with pytest.raises(TokenRefused):
        await readers.reader("forged")
    assert asked == ["forged", "forged"]
    assert len(readers) == 0


class _Reader:
    """What a page reads: nothing, as the named user."""

    def __init__(self, user: str) -> None:
        self.source = callers_mod.CallerSource(user, "default")
        self.server = "https://hub.example:6443"
        self.hub_url = None

    async def clusters(self) -> Listed:
        return Listed()

    async def queues(self) -> Listed:
        return Listed()

    async def jobs(self, _: Any = ()) -> Listed:
        return Listed()

    async def blocks(self, _: Any) -> tuple[dict[str, Any], list[Any]]:
        return {}, []


async def test_app_answers_the_login_form_until_a_token_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readers = CallerReaders(_base())

    async def reader(token: str) -> Any:
        if token != "good":
            raise TokenRefused("the hub cluster's API server did not accept the token")
        return _Reader("alice")

    monkeypatch.setattr(readers, "reader", reader)
    app = make_app(readers, explain=lambda _: "", listen_host="0.0.0.0")
    async with TestClient(TestServer(app)) as http:
        resp = await http.get("/jobs")
        assert resp.status == 401
        assert 'id="login"' in await resp.text()
        resp = await http.get("/jobs", headers={"Authorization": "Bearer bad"})
        assert resp.status == 401
        assert "did not accept" in await resp.text()
        resp = await http.get("/jobs", headers={"Authorization": "Bearer good"})
        assert resp.status == 200
        assert "alice (your token)" in await resp.text()

        resp = await http.post(
            "/login", data={"token": "good"}, headers={"Origin": "https://evil.example"}
        )
        assert resp.status == 403
        resp = await http.post("/login", data={"token": "bad"})
        assert resp.status == 401
        resp = await http.post("/login", data={"token": "good"}, allow_redirects=False)
        assert resp.status == 303
        morsel = resp.cookies[COOKIE]
        assert morsel.value == "good"
        assert morsel["httponly"]
        assert morsel["samesite"] == "Strict"
        resp = await http.get("/queues", cookies={COOKIE: "good"})
        assert resp.status == 200
        resp = await http.post("/logout", allow_redirects=False)
        assert resp.status == 303
        assert resp.cookies[COOKIE].value == ""


async def test_a_console_with_one_identity_has_no_login() -> None:
    app = make_app(_Reader("me"), explain=lambda _: "")  # type: ignore[arg-type]
    async with TestClient(TestServer(app)) as http:
        assert (await http.get("/login")).status == 404
        assert (await http.get("/jobs")).status == 200
