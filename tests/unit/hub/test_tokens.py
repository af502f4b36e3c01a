"""Join tokens are watched, not read on demand (gpufed.hub.components.tokens; issue 10 item 7).

- Rotating a member's token (its Secret rewritten) or revoking it (Secret deleted, or a new
  ``joinTokenRef``) closes the stream it authenticated at once, and the old token is refused.
- An unknown token costs the hub no Kubernetes request, however often it is presented (the hub
  used to re-read every member's Secret every 2 s on an unknown token).
- A token namespace the hub may not read (no Role there) does not end the leader term.

Every test drives a real Controller over the typed fakes (tests/unit/hub/fakes.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.components.tokens import Credentials
from tests.unit.hub.builders import membercluster_obj
from tests.unit.hub.fakes import token_secret
from tests.unit.hub.term import Term, settle

NS = "gpufed-system"


async def watching(term: Term, *members: str) -> None:
    """The term's token watch runs and MemberClusters ``members`` (Secret ``<name>-join``) are
    registered, as after the term's first lists."""
    term.ctrl.tokens.start()
    for name in members:
        term.ctrl.members.on_event("ADDED", membercluster_obj(name, token_secret=f"{name}-join"))
    term.ctrl.intake.members_synced.set()
    await settle()


def secret_event(term: Term, type_: str, obj: dict[str, Any]) -> None:
    term.kube.secret_events.setdefault(NS, asyncio.Queue()).put_nowait(WatchEvent(type_, obj))


async def test_a_rotated_token_closes_the_stream_at_once_and_the_old_token_is_refused() -> None:
    term = Term()
    term.kube.secrets[NS] = [token_secret("m1-join", "old")]
    await watching(term, "m1")
    assert await term.ctrl.authenticate(Credentials("old")) == "m1"
    s = term.connect("m1")

    secret_event(term, "MODIFIED", token_secret("m1-join", "new"))
    await settle()

    assert s.closed is not None
    assert s.closed.code == "PERMISSION_DENIED"
    assert "join token of member m1 was rotated" in s.closed.reason
    assert "gpufed-system/m1-join" in s.closed.reason
    assert await term.ctrl.authenticate(Credentials("old")) is None
    assert await term.ctrl.authenticate(Credentials("new")) == "m1"


async def test_a_deleted_token_secret_revokes_the_token_and_closes_the_stream() -> None:
    term = Term()
    term.kube.secrets[NS] = [token_secret("m1-join", "tok")]
    await watching(term, "m1")
    s = term.connect("m1")

    secret_event(term, "DELETED", token_secret("m1-join", "tok"))
    await settle()

    assert s.closed is not None
    assert "was revoked" in s.closed.reason
    assert term.ctrl.authenticated(Credentials("tok")) is None


async def test_a_new_join_token_ref_closes_the_stream_opened_with_the_old_secret() -> None:
    term = Term()
    term.kube.secrets[NS] = [token_secret("m1-join", "a"), token_secret("other", "b")]
    await watching(term, "m1")
    s = term.connect("m1")

    term.ctrl.members.on_event("MODIFIED", membercluster_obj("m1", token_secret="other"))

    assert s.closed is not None
    assert term.ctrl.authenticated(Credentials("a")) is None
    assert term.ctrl.authenticated(Credentials("b")) == "m1"


async def test_an_unchanged_secret_event_keeps_the_stream() -> None:
    term = Term()
    term.kube.secrets[NS] = [token_secret("m1-join", "tok")]
    await watching(term, "m1")
    s = term.connect("m1")

    secret_event(term, "MODIFIED", token_secret("m1-join", "tok"))  # e.g. a label added
    await settle()

    assert s.closed is None


async def test_unknown_tokens_cost_the_hub_no_kubernetes_request() -> None:
    term = Term()
    term.kube.secrets[NS] = [token_secret("m1-join", "tok")]
    await watching(term, "m1")
    before = dict(term.kube.requests)

    for i in range(1_000):
        assert await term.ctrl.authenticate(Credentials(f"guess-{i}")) is None
        term.clock.advance(5.0)  # the old code re-read every Secret once 2 s had passed
    assert await term.ctrl.authenticate(Credentials(None)) is None

    assert dict(term.kube.requests) == before
    assert before["list_secrets"] == 1  # the one list of the watch


async def test_a_token_two_members_share_authenticates_neither() -> None:
    term = Term()
    term.kube.secrets[NS] = [token_secret("m1-join", "same"), token_secret("m2-join", "same")]
    await watching(term, "m1", "m2")

    assert term.ctrl.authenticated(Credentials("same")) is None


async def test_a_member_gone_takes_its_token_with_it() -> None:
    term = Term()
    term.kube.secrets[NS] = [token_secret("m1-join", "tok")]
    await watching(term, "m1")

    term.ctrl.members.gone("m1")

    assert term.ctrl.authenticated(Credentials("tok")) is None


async def test_a_namespace_the_hub_may_not_read_does_not_end_the_term() -> None:
    term = Term()
    term.kube.forbidden_namespaces.add("elsewhere")
    await watching(term)
    obj = membercluster_obj("m1")
    obj["spec"]["joinTokenRef"] = {"name": "m1-join", "namespace": "elsewhere"}
    term.ctrl.members.on_event("ADDED", obj)
    await settle()

    # The first list failed (403): authentication answers at once instead of waiting 30 s.
    assert await term.ctrl.authenticate(Credentials("tok"), timeout_s=1) is None
    assert not term.ctrl.stopped
