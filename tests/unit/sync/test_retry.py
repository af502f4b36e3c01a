"""The one error and retry vocabulary (gpufed.sync.retry): which Kubernetes and etcd errors
get which verdict, pinned by status code and by exception shape; kube_retry's policy; Backoff."""

from __future__ import annotations

import itertools

import aetcd
import aiohttp
import pytest
import urllib3
from kubernetes_asyncio.client.exceptions import ApiException

from gpufed.sync.retry import (
    Backoff,
    ForbiddenGrace,
    Verdict,
    backoff_seconds,
    kube_retry,
    retry_after_seconds,
    verdict_of,
)


class FakeApiError(Exception):
    """Shaped like kubernetes(_asyncio).client.ApiException: status + headers."""

    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.headers = headers or {}


# --- verdicts ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (500, Verdict.RETRY),
        (502, Verdict.RETRY),
        (503, Verdict.RETRY),
        (504, Verdict.RETRY),
        (507, Verdict.RETRY),
        (429, Verdict.RETRY),
        (0, Verdict.RETRY),  # the client's "no response"
        (409, Verdict.RECONCILE),
        (404, Verdict.GONE),
        (410, Verdict.GONE),  # a watch's resourceVersion is too old
        (400, Verdict.REFUSED),
        (403, Verdict.REFUSED),
        (422, Verdict.REFUSED),
        (401, Verdict.PERMANENT),
        (405, Verdict.PERMANENT),
        (413, Verdict.PERMANENT),
        (415, Verdict.PERMANENT),
    ],
)
def test_status_codes_map_to_verdicts(status: int, verdict: Verdict) -> None:
    assert verdict_of(FakeApiError(status)) is verdict


@pytest.mark.parametrize(
    ("status", "verdict"),
    [(503, Verdict.RETRY), (409, Verdict.RECONCILE), (410, Verdict.GONE), (422, Verdict.REFUSED)],
)
def test_the_real_api_exception_is_recognised_by_its_status(status: int, verdict: Verdict) -> None:
    assert verdict_of(ApiException(status=status, reason="x")) is verdict


def test_a_boolean_status_is_not_an_http_status() -> None:
    err = FakeApiError(0)
    err.status = True  # a shape no client produces
    assert verdict_of(err) is Verdict.PERMANENT


def test_only_gone_refused_and_permanent_are_permanent() -> None:
    assert {v for v in Verdict if v.permanent} == {
        Verdict.GONE,
        Verdict.REFUSED,
        Verdict.PERMANENT,
    }


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(),
        ConnectionResetError("peer reset"),
        TimeoutError(),
        OSError("network is unreachable"),
    ],
)
def test_connection_errors_and_timeouts_retry(exc: BaseException) -> None:
    assert verdict_of(exc) is Verdict.RETRY


@pytest.mark.parametrize("exc", [KeyError("x"), ValueError("bad manifest"), RuntimeError()])
def test_bugs_and_broken_input_are_permanent(exc: BaseException) -> None:
    assert verdict_of(exc) is Verdict.PERMANENT


@pytest.mark.parametrize(
    "exc",
    [
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientPayloadError("truncated body"),
        aiohttp.ServerTimeoutError(),
        aiohttp.ClientConnectionError(),
        urllib3.exceptions.ProtocolError("connection aborted"),
        urllib3.exceptions.ReadTimeoutError(None, "/api", "read timed out"),  # type: ignore[arg-type]
    ],
)
def test_transport_errors_of_aiohttp_and_urllib3_retry(exc: BaseException) -> None:
    assert verdict_of(exc) is Verdict.RETRY


def test_an_aiohttp_response_error_is_judged_by_its_status() -> None:
    def response_error(status: int) -> aiohttp.ClientResponseError:
        return aiohttp.ClientResponseError(None, (), status=status)  # type: ignore[arg-type]

    assert verdict_of(response_error(503)) is Verdict.RETRY
    assert verdict_of(response_error(404)) is Verdict.GONE
    assert verdict_of(response_error(403)) is Verdict.REFUSED


def test_transient_etcd_client_errors_retry() -> None:
    assert verdict_of(aetcd.ConnectionFailedError()) is Verdict.RETRY
    assert verdict_of(aetcd.ConnectionTimeoutError()) is Verdict.RETRY


class ConnectionFailedError(Exception):
    """An aetcd-shaped class of another package: the name alone does not make it etcd's."""


def _etcd_shaped(name: str, *, base: type[Exception] = Exception) -> type[Exception]:
    # As if defined in aetcd (the module is what verdict_of reads, not the import).
    return type(name, (base,), {"__module__": "aetcd.exceptions"})


def test_etcd_errors_are_matched_by_module_and_class_name() -> None:
    assert verdict_of(_etcd_shaped("ConnectionFailedError")()) is Verdict.RETRY
    assert verdict_of(_etcd_shaped("ConnectionTimeoutError")()) is Verdict.RETRY
    # A subclass of a transient etcd error is transient too.
    subclass = type("Flaky", (_etcd_shaped("ConnectionFailedError"),), {"__module__": __name__})
    assert verdict_of(subclass()) is Verdict.RETRY
    assert verdict_of(ConnectionFailedError()) is Verdict.PERMANENT


@pytest.mark.parametrize(
    "exc",
    [
        aetcd.PreconditionFailedError(),
        aetcd.InvalidArgumentError(),
        aetcd.exceptions.UnauthenticatedError(),
        aetcd.InternalError(),
    ],
)
def test_other_etcd_client_errors_are_permanent(exc: BaseException) -> None:
    assert verdict_of(exc) is Verdict.PERMANENT


# --- Retry-After and kube_retry ------------------------------------------------------------------


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

    assert await attempts_for(403) == 1


@pytest.mark.parametrize("status", [404, 409, 410, 422])
async def test_kube_retry_does_not_retry_what_retrying_cannot_fix(status: int) -> None:
    assert await attempts_for(status) == 1


async def test_kube_retry_gives_up_after_its_attempts() -> None:
    assert await attempts_for(503) == 5


async def attempts_for(status: int) -> int:
    """How many calls kube_retry(attempts=5) makes when every call fails with ``status``."""
    calls = 0

    async def call() -> None:
        nonlocal calls
        async for attempt in kube_retry(attempts=5, sleep=_no_sleep):
            with attempt:
                calls += 1
                raise FakeApiError(status)

    with pytest.raises(FakeApiError):
        await call()
    return calls


async def _no_sleep(_: float) -> None:
    return None


# --- backoff -------------------------------------------------------------------------------------


def test_backoff_doubles_from_base_up_to_the_cap() -> None:
    b = Backoff(base=0.5, cap=3.0)
    assert [b.next() for _ in range(6)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert b.attempt == 6


def test_backoff_defaults_are_those_of_kube_retry() -> None:
    b = Backoff()
    assert [b.next() for _ in range(8)] == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]


def test_reset_starts_again_at_base() -> None:
    b = Backoff(base=1.0, cap=60.0)
    b.next()
    b.next()
    b.reset()
    assert b.attempt == 0
    assert b.next() == 1.0
    assert b.attempt == 1


def test_jitter_is_uniform_below_each_step() -> None:
    draws = itertools.cycle([0.0, 0.5, 0.999])
    b = Backoff(base=1.0, cap=4.0, jitter=True, rng=lambda: next(draws))
    assert [b.next() for _ in range(4)] == [0.0, 1.0, 0.999 * 4.0, 0.0]


def test_a_cap_given_to_next_caps_that_delay_only() -> None:
    b = Backoff(base=1.0, cap=10.0)
    assert [b.next(), b.next(), b.next(cap=1.5), b.next()] == [1.0, 2.0, 1.5, 8.0]


def test_backoff_survives_hours_of_failures() -> None:
    # Before: backoff_seconds(1025) raised OverflowError (2**1024 does not fit a float), which
    # crashed a watch loop after about 1,000 consecutive failures.
    b = Backoff(base=0.5, cap=10.0)
    delays = [b.next() for _ in range(5_000)]
    assert delays[-1] == 10.0
    assert backoff_seconds(10_000, base=0.5, cap=10.0, rng=lambda: 1.0) == 10.0


@pytest.mark.parametrize(("base", "cap"), [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0)])
def test_backoff_refuses_a_base_or_cap_that_is_not_positive(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        Backoff(base, cap)


def test_creating_in_a_namespace_being_terminated_retries_other_forbiddens_do_not() -> None:
    # A job whose member namespace is still terminating (deleted moments ago) used to fail for
    # good: 403 is REFUSED. The namespace goes away and is created again, so it heals.
    body = (
        '{"kind":"Status","apiVersion":"v1","status":"Failure","message":"jobs.batch \\"j\\" '
        "is forbidden: unable to create new content in namespace team-a because it is being "
        'terminated","reason":"Forbidden","details":{"name":"j","group":"batch","kind":"jobs",'
        '"causes":[{"reason":"NamespaceTerminating","message":"namespace team-a is being '
        'terminated","field":"metadata.namespace"}]},"code":403}'
    )
    terminating = ApiException(status=403, reason="Forbidden")
    terminating.body = body
    assert verdict_of(terminating) is Verdict.RETRY
    forbidden = ApiException(status=403, reason="Forbidden")
    forbidden.body = '{"kind":"Status","reason":"Forbidden","code":403}'
    assert verdict_of(forbidden) is Verdict.REFUSED


def test_a_forbidden_from_an_api_server_whose_rbac_is_still_starting_retries() -> None:
    # Found by the chaos soak: seconds after a member's API server (or its etcd) restarted,
    # every request was Forbidden because its RBAC authorizer had not listed the bootstrap
    # ClusterRoles yet, and jobs dispatched then failed for good ("the member refused").
    message = (
        'forbidden: User \\"system:serviceaccount:gpufed-system:gpufed-agent\\" cannot get '
        'path \\"/apis/batch/v1\\": RBAC: [clusterrole.rbac.authorization.k8s.io '
        '\\"system:basic-user\\" not found, clusterrole.rbac.authorization.k8s.io '
        '\\"system:service-account-issuer-discovery\\" not found]'
    )
    starting = ApiException(status=403, reason="Forbidden")
    starting.body = f'{{"kind":"Status","message":"{message}","reason":"Forbidden","code":403}}'
    assert verdict_of(starting) is Verdict.RETRY
    # A binding to a role of the admin's that does not exist is a steady refusal.
    missing = ApiException(status=403, reason="Forbidden")
    missing.body = (
        '{"kind":"Status","message":"jobs.batch is forbidden: User \\"x\\" cannot create '
        'resource \\"jobs\\": RBAC: role.rbac.authorization.k8s.io \\"team-a-editor\\" not '
        'found","reason":"Forbidden","code":403}'
    )
    assert verdict_of(missing) is Verdict.REFUSED


def forbidden(message: str, *, as_bytes: bool = False) -> ApiException:
    exc = ApiException(status=403, reason="Forbidden")
    body = f'{{"kind":"Status","message":"{message}","reason":"Forbidden","code":403}}'
    exc.body = body.encode() if as_bytes else body
    return exc


PLAIN_403 = (
    'namespaces \\"soak-a\\" is forbidden: User \\"system:serviceaccount:gpufed-system:'
    'gpufed-agent\\" cannot get resource \\"namespaces\\" in API group \\"\\" in the '
    'namespace \\"soak-a\\"'
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_plain_forbidden_is_retried_for_the_grace_period_from_its_first_one_then_refused() -> (
    None
):
    # issue 26: a member API server that just restarted answered a plain Forbidden (no RBAC
    # suffix) and the job failed for good. One work item: RETRY for 60 s from its first 403.
    clock = FakeClock()
    grace = ForbiddenGrace(60.0, clock=clock)
    exc = forbidden(PLAIN_403)
    assert verdict_of(exc) is Verdict.REFUSED, "stateless, a 403 is still a refusal"
    assert grace.forbidden_for("u1") is None
    assert grace.verdict("u1", exc) is Verdict.RETRY
    clock.now += 59.9
    assert grace.verdict("u1", exc) is Verdict.RETRY
    assert grace.forbidden_for("u1") == pytest.approx(59.9)
    assert grace.verdict("u2", exc) is Verdict.RETRY, "another work item has its own period"
    clock.now += 0.1
    assert grace.verdict("u1", exc) is Verdict.REFUSED, "a stable 403 is a refusal"
    assert grace.verdict("u2", exc) is Verdict.RETRY
    # a success starts the next 403 afresh
    grace.clear("u1")
    assert grace.verdict("u1", exc) is Verdict.RETRY


DISCOVERY_403 = (
    'forbidden: User \\"system:serviceaccount:gpufed-system:gpufed-agent\\" cannot get path '
    '\\"/apis/batch/v1\\"'
)


def test_a_forbidden_discovery_path_is_retried_ten_times_as_long() -> None:
    # the chaos soak under load (seed 2): a restarted member API server refused discovery
    # (every authenticated user may read it: its authorizer was not ready) for 84 s, past the
    # 60 s grace, and two jobs failed as "the member refused the objects"
    clock = FakeClock()
    grace = ForbiddenGrace(60.0, clock=clock)
    exc = forbidden(DISCOVERY_403, as_bytes=True)
    assert grace.verdict("u1", exc) is Verdict.RETRY
    clock.now += 84
    assert grace.verdict("u1", exc) is Verdict.RETRY, "84 s: the soak's case"
    clock.now += 515.9
    assert grace.verdict("u1", exc) is Verdict.RETRY
    clock.now += 0.1
    assert grace.verdict("u1", exc) is Verdict.REFUSED, "bounded: 600 s"
    # a resource 403 keeps the plain period
    grace.verdict("u2", forbidden(PLAIN_403))
    clock.now += 60
    assert grace.verdict("u2", forbidden(PLAIN_403)) is Verdict.REFUSED


def test_the_grace_changes_only_403s() -> None:
    clock = FakeClock()
    grace = ForbiddenGrace(60.0, clock=clock)
    for status, verdict in ((422, Verdict.REFUSED), (400, Verdict.REFUSED), (503, Verdict.RETRY),
                            (404, Verdict.GONE), (409, Verdict.RECONCILE)):  # fmt: skip
        assert grace.verdict("u1", FakeApiError(status)) is verdict
    assert grace.forbidden_for("u1") is None, "only a 403 starts the period"
    assert ForbiddenGrace(0.0, clock=clock).verdict("u1", forbidden(PLAIN_403)) is (
        Verdict.REFUSED
    ), "a period of 0: every 403 is a refusal at once"


def test_the_grace_remembers_a_bounded_number_of_work_items() -> None:
    clock = FakeClock()
    grace = ForbiddenGrace(60.0, clock=clock, max_keys=3)
    for i in range(5):
        grace.verdict(f"u{i}", forbidden(PLAIN_403))
    assert [grace.forbidden_for(f"u{i}") is None for i in range(5)] == [
        True,
        True,
        False,
        False,
        False,
    ]


def test_a_negative_grace_period_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="forbidden retry period -1"):
        ForbiddenGrace(-1.0)


@pytest.mark.parametrize("as_bytes", [False, True])
def test_both_403_checks_read_the_status_body_as_text_or_bytes(as_bytes: bool) -> None:
    # one decoding of the ApiException body serves the terminating-namespace and the
    # RBAC-starting checks
    starting = forbidden(
        'cannot get path \\"/apis\\": RBAC: [clusterrole.rbac.authorization.k8s.io '
        '\\"system:discovery\\" not found]',
        as_bytes=as_bytes,
    )
    assert verdict_of(starting) is Verdict.RETRY
    terminating = forbidden("x", as_bytes=as_bytes)
    terminating.body = (
        b'{"details":{"causes":[{"reason":"NamespaceTerminating"}]},"code":403}'
        if as_bytes
        else '{"details":{"causes":[{"reason":"NamespaceTerminating"}]},"code":403}'
    )
    assert verdict_of(terminating) is Verdict.RETRY
    assert verdict_of(forbidden(PLAIN_403, as_bytes=as_bytes)) is Verdict.REFUSED
