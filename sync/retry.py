"""The one error and retry vocabulary for Kubernetes and etcd errors, shared by hub and agent.

:func:`verdict_of` sorts an exception into a :class:`Verdict` (what to do next);
:func:`kube_retry` feeds that to tenacity for single API calls, and :class:`Backoff` gives the
delays of long-running list/watch loops. Callers retry in exactly one layer, never around it as
well.

=====================================================  ==============  =========================
error                                                  verdict         what the caller does
=====================================================  ==============  =========================
gpufed's own ``TransientError`` (:mod:`gpufed.api.     ``RETRY``       back off and try again
errors`)
gpufed's other errors (``PermanentError`` and the      ``PERMANENT``   report (broken input, or
rest of the tree), unless they carry an HTTP                           the error says what to
``status`` (which decides, as below)                                   do itself)
5xx, 429, status 0, connection errors and timeouts,    ``RETRY``       back off and try again
aiohttp/urllib3 transport errors, aetcd
``ConnectionFailedError`` / ``ConnectionTimeoutError``,
403 with cause ``NamespaceTerminating`` (heals once
the namespace is gone and is created again), 403
naming a bootstrap ClusterRole ``system:…`` not
found (an API server whose RBAC authorizer has not
listed its roles yet: seconds after its start);
any other 403 for ``FORBIDDEN_GRACE_S`` from the
first one of a work item (:class:`ForbiddenGrace`)
409 Conflict                                           ``RECONCILE``   re-read, recompute, write
404 Not Found, 410 Gone                                ``GONE``        the object (or the watch's
                                                                       resourceVersion) is gone
400, 403 (after the grace above), 422                  ``REFUSED``     report; the same request
                                                                       cannot succeed
other 4xx; anything that is not an API or transport    ``PERMANENT``   report (a bug or broken
error                                                                  input)
=====================================================  ==============  =========================

``GONE``, ``REFUSED`` and ``PERMANENT`` together are the errors that sending the same request
again cannot fix (:attr:`Verdict.permanent`). Retries honour ``Retry-After`` when the server
sends it.

gpufed's own errors are recognised by the one exception tree (:mod:`gpufed.api.errors`), never
by the built-in class they also derive from (a :class:`~gpufed.api.errors.TransientError` may be
a ``ConnectionError``, a :class:`~gpufed.api.errors.PermanentError` a ``ValueError``). Other
libraries' exceptions are recognised by shape (an ``int`` ``status`` attribute, as on the
``ApiException`` of both ``kubernetes`` and ``kubernetes_asyncio`` and on aiohttp's response
errors) and by the module and class name of transport errors, so this module imports no client (``aetcd``,
``aiohttp``, ``urllib3``, ``kubernetes``).
"""

from __future__ import annotations

import enum
import random
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from gpufed.api.errors import GpufedError, TransientError


class Verdict(enum.Enum):
    """What to do after an error (module docstring: which errors give which verdict)."""

    RETRY = "retry"  # temporary: back off and try again
    RECONCILE = "reconcile"  # 409: re-read the object and recompute
    GONE = "gone"  # 404/410: the object, or a watch's resourceVersion, no longer exists
    REFUSED = "refused"  # 400/403/422: the content or the caller's rights are refused
    PERMANENT = "permanent"  # other 4xx, or not an API error at all: a bug or broken input

    @property
    def permanent(self) -> bool:
        """True for ``GONE``, ``REFUSED`` and ``PERMANENT``: the same request sent again
        cannot succeed (``RETRY`` and ``RECONCILE`` may)."""
        return self in _PERMANENT_VERDICTS


_PERMANENT_VERDICTS = frozenset({Verdict.GONE, Verdict.REFUSED, Verdict.PERMANENT})
_RETRY_STATUSES = frozenset({429})
_GONE_STATUSES = frozenset({404, 410})
_REFUSED_STATUSES = frozenset({400, 403, 422})
#: Transport errors of clients this module does not import, by top-level module.
_TRANSPORT_MODULES = frozenset({"aiohttp", "urllib3"})
#: The transient errors of the etcd client (``aetcd``), by class name.
_ETCD_TRANSIENT = frozenset({"ConnectionFailedError", "ConnectionTimeoutError"})


def status_of(exc: BaseException) -> int | None:
    """HTTP status of an API error (``ApiException.status``), or None for other errors."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def verdict_of(exc: BaseException) -> Verdict:
    """Sort an exception from a Kubernetes API or etcd call into a :class:`Verdict`.

    ``ApiException`` status 0 (the client's "no response" value) counts as a connection error.
    Never raises.
    """
    status = status_of(exc)
    if status is not None and status != 0:
        if status == 409:
            return Verdict.RECONCILE
        if status in _GONE_STATUSES:
            return Verdict.GONE
        if status == 403 and (_namespace_terminating(exc) or _rbac_starting(exc)):
            return Verdict.RETRY
        if status in _REFUSED_STATUSES:
            return Verdict.REFUSED
        if status in _RETRY_STATUSES or status >= 500:
            return Verdict.RETRY
        return Verdict.PERMANENT
    # gpufed's own errors: by the tree, not by the built-in base each also has.
    if isinstance(exc, TransientError):
        return Verdict.RETRY
    if isinstance(exc, GpufedError):
        return Verdict.PERMANENT
    if status == 0 or isinstance(exc, (ConnectionError, TimeoutError, OSError)):
        return Verdict.RETRY
    # aiohttp's client errors do not subclass OSError in every case; match by module.
    if _top_module(type(exc)) in _TRANSPORT_MODULES:
        return Verdict.RETRY
    if any(
        _top_module(cls) == "aetcd" and cls.__name__ in _ETCD_TRANSIENT for cls in type(exc).__mro__
    ):
        return Verdict.RETRY
    return Verdict.PERMANENT


def _status_text(exc: BaseException) -> str:
    """The text of an API error's Status body (its first 64 KiB; bytes decoded as UTF-8), else
    its ``reason``; empty when it has neither."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body[:65536].decode("utf-8", errors="replace")
    text = body if isinstance(body, str) else str(getattr(exc, "reason", "") or "")
    return text[:65536]


def _namespace_terminating(exc: BaseException) -> bool:
    """The API server refused new content in a namespace that is being deleted (a Status whose
    ``details.causes`` carry reason ``NamespaceTerminating``)."""
    return "NamespaceTerminating" in _status_text(exc)


#: What a kube-apiserver's RBAC authorizer adds to a Forbidden while its informers have not
#: listed the bootstrap ClusterRoles (``system:discovery``, ``system:basic-user``, ...) that every
#: API server keeps: only in the seconds after it (or its etcd) starts.
_RBAC_STARTING = re.compile(r'RBAC: [^"]*clusterrole[^"]*"system:[^"]+" not found')


def _rbac_starting(exc: BaseException) -> bool:
    """A Forbidden from an API server that is still starting: its RBAC authorizer does not find
    a bootstrap ClusterRole (found by the chaos soak after member API server and etcd restarts:
    ``RBAC: clusterrole.rbac.authorization.k8s.io "system:discovery" not found``)."""
    return bool(_RBAC_STARTING.search(_status_text(exc)))


#: Seconds a Forbidden (403) on one work item is retried, from the first one, before it counts
#: as a refusal (:class:`ForbiddenGrace`).
FORBIDDEN_GRACE_S = 60.0
#: Most keys a :class:`ForbiddenGrace` remembers (the oldest first 403 is forgotten past it).
MAX_FORBIDDEN_KEYS = 10_000


#: A 403 on an API discovery path (``cannot get path "/apis/batch/v1"``): every authenticated
#: user may read those (the default ``system:discovery`` ClusterRole), so it means the member's
#: authorizer is not ready yet, hardly ever a missing grant; such a 403 is retried this many
#: times longer (found by the chaos soak under load: a restarted member API server refused
#: discovery for 84 s, past the 60 s grace, and two jobs failed).
DISCOVERY_GRACE_FACTOR = 10
_DISCOVERY_FORBIDDEN = re.compile(r'cannot get path \\?"/apis?(/|\\?"|$)')


class ForbiddenGrace:
    """A Forbidden is a retry for ``grace_s`` seconds from the first one for a key (a work
    item), then a refusal.

    A member API server that has just restarted answers plain Forbiddens for a while (its RBAC
    authorizer has not listed the roles and bindings yet: ``namespaces "team-a" is forbidden:
    User "…gpufed-agent" cannot get resource "namespaces"``, found by the chaos soak, issue 26),
    which looks exactly like a missing grant. So one 403 is not final: :meth:`verdict` answers
    ``RETRY`` for a 403 until ``grace_s`` has passed since that key's first 403, and
    ``REFUSED`` after (a grant that stays missing); a 403 on an API discovery path gets
    :data:`DISCOVERY_GRACE_FACTOR` times as long. Other errors get :func:`verdict_of`'s
    verdict. :meth:`clear` after a success. ``clock``: monotonic seconds (fake in tests). At
    most :data:`MAX_FORBIDDEN_KEYS` keys are remembered. Raises ValueError for a negative
    ``grace_s``.
    """

    def __init__(
        self,
        grace_s: float = FORBIDDEN_GRACE_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = MAX_FORBIDDEN_KEYS,
    ) -> None:
        if grace_s < 0:
            raise ValueError(f"forbidden retry period {grace_s} s: must be >= 0")
        self.grace_s = grace_s
        self._clock = clock
        self._max_keys = max_keys
        self._first: OrderedDict[str, float] = OrderedDict()

    def verdict(self, key: str, exc: BaseException) -> Verdict:
        """``exc``'s verdict for work item ``key`` (class docstring)."""
        verdict = verdict_of(exc)
        if verdict is not Verdict.REFUSED or status_of(exc) != 403:
            return verdict
        now = self._clock()
        first = self._first.setdefault(key, now)
        while len(self._first) > self._max_keys:
            self._first.popitem(last=False)
        grace = self.grace_s
        if _DISCOVERY_FORBIDDEN.search(_status_text(exc)):
            grace *= DISCOVERY_GRACE_FACTOR
        return Verdict.RETRY if now - first < grace else Verdict.REFUSED

    def forbidden_for(self, key: str) -> float | None:
        """Seconds since ``key``'s first 403 (None: none since the last :meth:`clear`)."""
        first = self._first.get(key)
        return None if first is None else self._clock() - first

    def clear(self, key: str) -> None:
        """``key`` succeeded: its next 403 starts a new grace period."""
        self._first.pop(key, None)


def _top_module(cls: type) -> str:
    return cls.__module__.partition(".")[0]


def is_retryable(exc: BaseException) -> bool:
    """True when :func:`verdict_of` says :attr:`Verdict.RETRY`."""
    return verdict_of(exc) is Verdict.RETRY


def retry_after_seconds(exc: BaseException) -> float | None:
    """The ``Retry-After`` header of an API error in seconds, when present and numeric."""
    headers = getattr(exc, "headers", None)
    if not isinstance(headers, Mapping):
        return None
    for key, value in headers.items():
        if str(key).lower() == "retry-after":
            try:
                return max(0.0, float(value))
            except (TypeError, ValueError):
                return None
    return None


def backoff_seconds(
    attempt: int, *, base: float = 0.2, cap: float = 10.0, rng: Callable[[], float] = random.random
) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2**(attempt-1))].

    ``attempt`` counts from 1; any count is fine (a loop that has failed for hours).
    """
    # The exponent stops growing long before a float overflows (2.0**1024 does).
    ceiling: float = min(cap, base * 2.0 ** min(max(0, attempt - 1), _MAX_EXPONENT))
    return rng() * ceiling


_MAX_EXPONENT = 64


class Backoff:
    """Exponential backoff for list/watch loops that retry forever: one instance per loop.

    :meth:`next` returns the delay to wait now, in seconds, and advances: ``base``,
    ``2 * base``, ``4 * base`` ... capped at ``cap``; with ``jitter``, uniform in [0, that]
    (``rng`` gives [0, 1)). :meth:`reset` after a success starts again at ``base``. Pure: it
    never sleeps, the loop does (so tests can use fake time). ``next(cap=...)`` caps one delay
    differently (a loop that waits longer for errors that heal slowly).
    """

    def __init__(
        self,
        base: float = 0.2,
        cap: float = 10.0,
        *,
        jitter: bool = False,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if base <= 0 or cap <= 0:
            raise ValueError(f"backoff base and cap must be positive, got {base} and {cap}")
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self._rng = rng
        self._attempt = 0

    @property
    def attempt(self) -> int:
        """How many :meth:`next` calls since construction or the last :meth:`reset`."""
        return self._attempt

    def next(self, *, cap: float | None = None) -> float:
        """The delay to wait now (seconds); the following call returns the next step."""
        self._attempt += 1
        return backoff_seconds(
            self._attempt,
            base=self.base,
            cap=self.cap if cap is None else cap,
            rng=self._rng if self.jitter else _no_jitter,
        )

    def reset(self) -> None:
        """Start again at ``base`` (after a success)."""
        self._attempt = 0


def _no_jitter() -> float:
    return 1.0


def _wait(retry_state: RetryCallState) -> float:
    outcome = retry_state.outcome
    exc = outcome.exception() if outcome is not None else None
    hinted = retry_after_seconds(exc) if exc is not None else None
    if hinted is not None:
        return min(hinted, 60.0)
    return backoff_seconds(retry_state.attempt_number)


def kube_retry(*, attempts: int = 6, **kwargs: Any) -> AsyncRetrying:
    """A tenacity ``AsyncRetrying`` for Kubernetes API calls, with this module's policy.

    Usage::

        async for attempt in kube_retry():
            with attempt:
                await api.create_namespaced_job(...)

    Re-raises the last exception when attempts run out or the error is not retryable.
    """
    return AsyncRetrying(
        retry=retry_if_exception(is_retryable),
        wait=_wait,
        stop=stop_after_attempt(attempts),
        reraise=True,
        **kwargs,
    )
