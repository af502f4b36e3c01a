"""One retry policy for calls to Kubernetes API servers, shared by hub and agent.

:func:`classify` sorts an exception into what to do next; :func:`kube_retry` feeds that to
tenacity. Callers retry in exactly one layer (this one), never around it as well.

- 5xx, 429 and connection errors/timeouts are *temporary*: retry with jittered exponential
  backoff, honouring ``Retry-After`` when the server sends it.
- 409 Conflict means *re-read and reconcile*: the caller's loop must fetch the object again and
  recompute (retrying the same write would fail the same way), so it is not retried here.
- Other 4xx are *permanent*: the request itself is wrong (bad manifest, forbidden, not found);
  report it, do not retry.

Exceptions are recognised by shape (an ``int`` ``status`` attribute, as on the ``ApiException``
of both ``kubernetes`` and ``kubernetes_asyncio``), so this module imports neither client.
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections.abc import Callable, Mapping
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt


class Verdict(enum.Enum):
    """What to do after an error."""

    RETRY = "retry"  # temporary: back off and try again
    RECONCILE = "reconcile"  # 409: re-read the object and recompute
    PERMANENT = "permanent"  # the request is wrong: report, do not retry


_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def status_of(exc: BaseException) -> int | None:
    """HTTP status of an API error (``ApiException.status``), or None for other errors."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def classify(exc: BaseException) -> Verdict:
    """Sort an exception from a Kubernetes API call into a :class:`Verdict`.

    ``ApiException`` status 0 (the client's "no response" value) counts as a connection error.
    """
    status = status_of(exc)
    if status is not None and status != 0:
        if status == 409:
            return Verdict.RECONCILE
        if status in _RETRY_STATUSES or status >= 500:
            return Verdict.RETRY
        return Verdict.PERMANENT
    if isinstance(exc, (ConnectionError, TimeoutError, asyncio.TimeoutError, OSError)):
        return Verdict.RETRY
    # aiohttp's client errors do not subclass OSError in every case; match by module.
    if type(exc).__module__.startswith(("aiohttp", "urllib3")):
        return Verdict.RETRY
    if status == 0:
        return Verdict.RETRY
    return Verdict.PERMANENT


def is_retryable(exc: BaseException) -> bool:
    """True when :func:`classify` says :attr:`Verdict.RETRY`."""
    return classify(exc) is Verdict.RETRY


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
