"""Who may read the hub's HTTP endpoints that serve people: a bearer token, checked against the
hub cluster (TokenReview, then SubjectAccessReview), so that the hub cluster's RBAC is the one
authority, as for everything else a user reads.

Used by ``hub/edge/http.py`` for ``GET /fleet/members/<name>/blocks`` (what ``gpufed console``
draws): the caller must be allowed to ``get`` that MemberCluster (``gpufed.io``). Answers are
cached for ``ttl_s`` seconds per (token, member), at most ``max_entries`` of them (the oldest
go first), so a console refreshing every few seconds costs the API server two reviews per
member per ``ttl_s``; tokens are kept only as SHA-256 digests.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from gpufed.api.labels import GROUP

__all__ = ["AccessCheck", "Review"]

#: ``review(token, resourceAttributes) -> (allowed, who or why)``:
#: :meth:`gpufed.hub.adapters.kube.KubeAPI.review_access`.
Review = Callable[[str, dict[str, str]], Awaitable[tuple[bool | None, str]]]


class AccessCheck:
    """Bearer token -> HTTP status for reading one MemberCluster's blocks (see module doc)."""

    def __init__(
        self,
        review: Review,
        *,
        ttl_s: float = 10.0,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._review = review
        self._ttl = ttl_s
        self._max = max_entries
        self._clock = clock
        self._cache: OrderedDict[tuple[str, str], tuple[float, int, str]] = OrderedDict()

    async def check(self, authorization: str | None, member: str) -> tuple[int, str]:
        """(200, username) when the bearer of ``authorization`` (the ``Authorization`` header)
        may ``get`` MemberCluster ``member``; else (401, why) without a valid bearer token,
        (403, why) when RBAC denies it, (503, why) when the API server cannot be asked."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return 401, "send Authorization: Bearer <a token of the hub cluster>"
        key = (hashlib.sha256(token.encode()).hexdigest(), member)
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1], hit[2]
        attributes = {"verb": "get", "group": GROUP, "resource": "memberclusters", "name": member}
        try:
            allowed, why = await self._review(token, attributes)
        except Exception as exc:  # the API server's answer, whatever it is, is not a decision
            return 503, f"cannot ask the hub cluster's API server: {exc}"
        if allowed is None:
            code = 401
        elif allowed:
            code = 200
        else:
            code, why = 403, f"get memberclusters.{GROUP}/{member} is not allowed: {why}"
        self._cache[key] = (now + self._ttl, code, why)
        self._cache.move_to_end(key)
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)
        return code, why
