"""Which Kubernetes API errors retry (gpufed.sync.retry): pinned status codes."""

from __future__ import annotations

import pytest

from gpufed.sync.retry import (
    Verdict,
    backoff_seconds,
    classify,
    kube_retry,
    retry_after_seconds,
)


class FakeApiError(Exception):
    """Shaped like kubernetes(_asyncio).client.ApiException: status + headers."""

    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.headers = headers or {}


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (500, Verdict.RETRY),
        (502, Verdict.RETRY),
        (503, Verdict.RETRY),
        (504, Verdict.RETRY),
        (429, Verdict.RETRY),
        (409, Verdict.RECONCILE),
        (400, Verdict.PERMANENT),
        (401, Verdict.PERMANENT),
        (403, Verdict.PERMANENT),
        (404, Verdict.PERMANENT),
        (422, Verdict.PERMANENT),
        (0, Verdict.RETRY),
    ],
)
def test_status_codes_map_to_verdicts(status: int, verdict: Verdict) -> None:
    assert classify(FakeApiError(status)) is verdict


def test_connection_errors_retry_and_bugs_do_not() -> None:
    assert classify(ConnectionRefusedError()) is Verdict.RETRY
    assert classify(TimeoutError()) is Verdict.RETRY
    assert classify(KeyError("x")) is Verdict.PERMANENT


def test_retry_after_header_is_read() -> None:
    assert retry_after_seconds(FakeApiError(429, {"Retry-After": "3"})) == 3.0
    assert retry_after_seconds(FakeApiError(429, {"retry-after": "soon"})) is None


async def test_kube_retry_retries_503_then_succeeds_and_gives_up_on_403() -> None:
    calls = 0
    async for attempt in kube_retry(attempts=5, sleep=_no_sleep):
        with attempt:
            calls += 1
            if calls < 3:
                raise FakeApiError(503, {"Retry-After": "0"})
    assert calls == 3

    forbidden_calls = 0

    async def forbidden() -> None:
        nonlocal forbidden_calls
        async for attempt in kube_retry(attempts=5, sleep=_no_sleep):
            with attempt:
                forbidden_calls += 1
                raise FakeApiError(403)

    with pytest.raises(FakeApiError):
        await forbidden()
    assert forbidden_calls == 1


async def _no_sleep(_: float) -> None:
    return None


def test_backoff_survives_hours_of_failures() -> None:
    # backoff_seconds(1025) raised OverflowError (2**1024 does not fit a float): the agent's
    # informer, which counts failures in a row, crashed after about 1,000 of them.
    assert backoff_seconds(1025, base=0.5, cap=10.0, rng=lambda: 1.0) == 10.0
    assert backoff_seconds(10_000, base=0.5, cap=10.0, rng=lambda: 1.0) == 10.0
