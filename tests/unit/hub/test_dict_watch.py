"""The hub's watch builds no Kubernetes ApiClient (an SSL context per watch) and keeps the
library's Watch state, so its stream and close work as the library's do."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio.watch import watch

from gpufed.hub.adapters.kubewire import DictWatch


async def test_its_attributes_are_the_library_watchs() -> None:
    """A new kubernetes_asyncio Watch that sets more state would break the hand-written init."""
    theirs = watch.Watch()
    try:
        assert set(vars(DictWatch())) == set(vars(theirs))
    finally:
        await theirs.close()


async def test_it_builds_no_api_client(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise AssertionError("an ApiClient was built for a watch")

    monkeypatch.setattr(watch, "ApiClient", refuse)
    w = DictWatch()
    line = json.dumps(
        {"type": "MODIFIED", "object": {"metadata": {"name": "j", "resourceVersion": "7"}}}
    )
    event = w.unmarshal_event(line, w.get_return_type(None))
    assert event["type"] == "MODIFIED"
    assert event["raw_object"] == {"metadata": {"name": "j", "resourceVersion": "7"}}
    await w.close()
    assert w.resp is None
