"""How the hub reads its Kubernetes client's replies: JSON decoded once into plain dicts (with a
raised recursion limit, :func:`deep_decoding`), non-2xx replies as ``ApiException``, watches
of plain dicts with bookmarks, 404 as None, and the status-replacement JSON patch.

Used by :mod:`gpufed.hub.adapters.kube` and :mod:`gpufed.hub.adapters.kuberesources` (split out
of ``kube.py``, no behaviour change); with them, the only hub modules that import a Kubernetes
client.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.client.rest import RESTResponse

from gpufed.hub.adapters.ports import WatchEvent
from gpufed.sync.retry import kube_retry

JSON_PATCH = "application/json-patch+json"

#: The API server stores objects nested up to 10,000 levels deep (its JSON decoder's limit);
#: Python's decoder recurses once per level and stops at the interpreter's recursion limit
#: (1,000 by default), so one such GPUJob used to fail every list of the hub and end every
#: leader term. Replies are decoded with this limit instead (about 3 MiB of C stack at most);
#: intake then refuses the job for its depth (api/bounds.py) like any other bad job.
DECODE_RECURSION_LIMIT = 12_000


#: How many :func:`deep_decoding` blocks are open now, and the limit to restore after the last.
_deep = {"open": 0, "saved": 0}


@contextlib.contextmanager
def deep_decoding() -> Iterator[None]:
    """Raise the recursion limit to :data:`DECODE_RECURSION_LIMIT` while a reply is decoded.

    The limit is process-wide and blocks overlap (coroutines await inside them): it is
    restored only when the last open block ends, so one coroutine leaving never lowers it
    under another one still decoding.
    """
    if _deep["open"] == 0:
        _deep["saved"] = sys.getrecursionlimit()
        if _deep["saved"] < DECODE_RECURSION_LIMIT:
            sys.setrecursionlimit(DECODE_RECURSION_LIMIT)
    _deep["open"] += 1
    try:
        yield
    finally:
        _deep["open"] -= 1
        if _deep["open"] == 0 and _deep["saved"] < DECODE_RECURSION_LIMIT:
            sys.setrecursionlimit(_deep["saved"])


class _NoApiClient:
    """What a :class:`DictWatch` holds where ``Watch`` builds an ``ApiClient``: the client's
    ``Watch`` uses one only to turn events into typed models, and closes it at the end."""

    async def close(self) -> None:
        return None


class DictWatch(watch.Watch):
    """A watch whose events carry the objects as decoded from the stream, once: for custom
    objects the client would encode each one to JSON and decode it again (three passes per
    event, and the hub sees every GPUJob status write come back). Events are decoded with
    :func:`deep_decoding`.

    It builds no ``ApiClient``: ``Watch.__init__`` makes one (an aiohttp session and an SSL
    context that loads the system's CA bundle: ~25 ms of CPU, 13 % of a busy hub's loop in a
    ``gpufed bench e2e`` profile) only to deserialize typed events, which this watch never
    asks for. The attributes are ``Watch.__init__``'s (a unit test compares them)."""

    def __init__(self) -> None:
        self._raw_return_type: str | None = None
        self._stop = False
        self._api_client = _NoApiClient()  # type: ignore[assignment]
        self.resource_version = None
        self.resp = None

    def get_return_type(self, func: object) -> str:
        return ""

    def unmarshal_event(self, data: str | bytes, response_type: str | None) -> Any:
        with deep_decoding():
            return super().unmarshal_event(data, response_type)


async def check_and_release(resp: Any) -> None:
    """For calls made with ``_preload_content=False`` (the client then skips its own check):
    raise ``ApiException`` for a non-2xx reply, and give the connection back."""
    await check_and_read(resp)


async def get_or_none(read: Callable[[], Awaitable[Any]]) -> dict[str, Any] | None:
    """``read()``'s object (transient errors retried through ``kube_retry``, the reply decoded
    with :func:`deep_decoding`), or None when it does not exist (404)."""
    try:
        async for attempt in kube_retry():
            with attempt, deep_decoding():
                obj: dict[str, Any] = await read()
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return obj


async def check_and_read(resp: Any) -> bytes:
    """As :func:`check_and_release`, returning the reply's body."""
    try:
        body: bytes = await resp.read()
        if not 200 <= resp.status <= 299:
            raise ApiException(http_resp=RESTResponse(resp, body))  # type: ignore[arg-type]
        return body
    finally:
        resp.release()


def status_replacement(status: dict[str, Any], resource_version: str) -> list[dict[str, Any]]:
    """The JSON patch that replaces a whole ``status`` if the object is still at
    ``resource_version`` (the API server checks the ``replace`` like an update's precondition)."""
    return [
        {"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version},
        {"op": "add", "path": "/status", "value": status},
    ]


def resource_version_of(body: bytes) -> str:
    """``metadata.resourceVersion`` of an object's JSON."""
    with deep_decoding():
        return str(json.loads(body)["metadata"]["resourceVersion"])


async def watch_events(func: Any, *args: Any, **kwargs: Any) -> AsyncIterator[WatchEvent | str]:
    """One watch of a list call, with bookmarks (see :meth:`gpufed.hub.adapters.kube.KubeAPI.watch_objects`)."""
    w = DictWatch()
    try:
        stream = w.stream(func, *args, allow_watch_bookmarks=True, **kwargs)
        async for event in stream:
            etype = event["type"]
            raw = event["raw_object"]
            if etype == "BOOKMARK":
                yield str(raw["metadata"]["resourceVersion"])
            elif etype in ("ADDED", "MODIFIED", "DELETED"):
                yield WatchEvent(etype, raw)
    finally:
        await w.close()


async def read_json(resp: Any) -> dict[str, Any]:
    """The JSON body of a call made with ``_preload_content=False`` (plain dicts, without the
    typed models' cost); ``ApiException`` for a non-2xx reply."""
    body = await check_and_read(resp)
    with deep_decoding():
        out: dict[str, Any] = json.loads(body)
    return out
