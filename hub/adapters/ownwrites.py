"""Own writes: the resourceVersions the hub's own conditional writes of one object produced, so
that its next write to the object is conditioned on the newest of them instead of failing with
409 on a change the hub made itself.

Every hub write of a GPUJob carries a resourceVersion precondition (docs/design.md §10): a
status computed from an older view must not overwrite a newer one. But the hub writes one
GPUJob in two parts that touch different fields — the status (the mirror, through the status
subresource) and ``metadata.finalizers`` (:mod:`gpufed.hub.components.finalizers`) — and each
write moves the object's resourceVersion. So a status write conditioned on the view just before
the finalizer patch failed with 409 (a GET and a second write), and so did the finalizer patch
after a status write; as did a status write conditioned on a watch view that lagged behind the
hub's own last status write.

A write conditioned on ``before`` that succeeded with ``after`` proves that between the two
nothing but that write changed the object. :class:`OwnWrites` keeps these links per object,
each with the part it wrote; :meth:`OwnWrites.rebase` follows them from a caller's
resourceVersion over the links of the parts the caller lets it skip (a write of the other part,
which changed nothing the new write was computed from; for a status write, also the hub's own
earlier status: the mirror writes its latest status whole). A link of another writer never
exists, so a change by anyone else still fails the precondition, as before. Writes of one
object are serialised (:meth:`OwnWrites.serial`), so a write waits for the other part's write
in flight and then rebases over it, instead of racing it.

Used by :class:`gpufed.hub.adapters.kube.KubeAPI`. Bounded: ``MAX_LINKS`` links per object,
``MAX_OBJECTS`` objects (the least recently written forgotten first: a forgotten link only
costs the 409 it would have saved).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Collection, Hashable

#: Links kept per object (a job's writes: a finalizer patch and a few status writes).
MAX_LINKS = 16
#: Objects whose links are kept.
MAX_OBJECTS = 20_000


class OwnWrites:
    """Links ``before -> (after, part)`` of this process's own conditional writes, per object
    key (module docstring); and one lock per object key with a write in flight."""

    def __init__(self, *, max_links: int = MAX_LINKS, max_objects: int = MAX_OBJECTS) -> None:
        self._max_links = max_links
        self._max_objects = max_objects
        self._links: OrderedDict[Hashable, dict[str, tuple[str, str]]] = OrderedDict()
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    def record(self, key: Hashable, part: str, before: str, after: str) -> None:
        """Our write of ``part`` of object ``key``, conditioned on resourceVersion ``before``,
        succeeded with ``after``. Ignored when either is empty or they are equal."""
        if not before or not after or before == after:
            return
        links = self._links.get(key)
        if links is None:
            links = self._links[key] = {}
            if len(self._links) > self._max_objects:
                self._links.popitem(last=False)
        else:
            self._links.move_to_end(key)
        links[before] = (after, part)
        while len(links) > self._max_links:
            del links[next(iter(links))]  # the oldest link (dicts keep insertion order)

    def rebase(self, key: Hashable, resource_version: str, over: Collection[str]) -> str:
        """The resourceVersion a write of ``key`` computed at ``resource_version`` may be
        conditioned on: the end of the chain of our own links from it whose parts are all in
        ``over`` (``resource_version`` itself when there is none)."""
        links = self._links.get(key)
        rv = resource_version
        while links is not None and (link := links.get(rv)) is not None and link[1] in over:
            rv = link[0]
        return rv

    def forget(self, key: Hashable) -> None:
        """The object is gone."""
        self._links.pop(key, None)

    @contextlib.asynccontextmanager
    async def serial(self, key: Hashable) -> AsyncIterator[None]:
        """Hold the write lock of ``key``: one write of an object at a time (its lock is
        dropped when no write of it waits)."""
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
