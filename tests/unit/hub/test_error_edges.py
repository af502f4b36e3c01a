"""The three edges translate gpufed's errors from the one tree (gpufed.api.errors): the retry
classifier (sync/retry.py), the agent stream's gRPC status (hub/edge/service.py) and the CLI's error
line (cli/errors.py); and the two places that judged errors themselves now ask the classifier:
the finalizer refusal (hub/components/finalizers.py) and the leader's campaign and lease renewal
(hub/edge/leader.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import aetcd
import grpc
import pytest

from gpufed.agent.hub_stream import HubUnavailableError
from gpufed.api.errors import FieldError, GpufedError, PermanentError, TransientError
from gpufed.api.kubeconfig import KubeconfigError
from gpufed.api.labels import FINALIZER
from gpufed.api.protocol.codec import ProtocolError
from gpufed.cli.errors import error_line
from gpufed.hub.adapters.sessions import RefusedError, StreamClosedError
from gpufed.hub.adapters.store import ConflictError, NotLeaderError, StoreUnavailableError
from gpufed.hub.edge.leader import LeaderElector
from gpufed.hub.edge.service import close_code, grpc_status
from gpufed.sandbox.state import SandboxError
from gpufed.sync.retry import Verdict, verdict_of
from tests.unit.api.test_errors import exception_classes
from tests.unit.hub.test_fencing import Lease, one_job


class FakeApiError(Exception):
    """Shaped like the Kubernetes client's ApiException."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = ""


# --- the retry classifier ---------------------------------------------------------------------


def test_every_error_of_the_tree_gets_its_verdict_from_the_tree() -> None:
    """Transient: RETRY; the rest: PERMANENT, unless it carries an HTTP status (the 409 of
    sync.apply's _StillChangingError: RECONCILE), whatever built-in base it also has."""
    for name, cls in exception_classes().items():
        if not issubclass(cls, GpufedError):
            continue
        exc = cls.__new__(cls)  # no constructor arguments needed to be judged
        if issubclass(cls, TransientError):
            expected = Verdict.RETRY
        elif getattr(cls, "status", None) == 409:
            expected = Verdict.RECONCILE
        else:
            expected = Verdict.PERMANENT
        assert verdict_of(exc) is expected, name


@pytest.mark.parametrize(
    ("exc", "verdict"),
    [
        (FieldError("spec.template", "bad"), Verdict.PERMANENT),  # a ValueError: as before
        (NotLeaderError("another replica leads"), Verdict.PERMANENT),
        (ConflictError("placed by someone else"), Verdict.PERMANENT),
        (StreamClosedError("ABORTED", "replaced"), Verdict.PERMANENT),
        (HubUnavailableError("the hub ended the stream"), Verdict.RETRY),  # as before
        (StoreUnavailableError("etcd at '/gpufed/': timeout"), Verdict.RETRY),
    ],
)
def test_transient_and_permanent_map_onto_the_verdict(exc: BaseException, verdict: Verdict) -> None:
    assert verdict_of(exc) is verdict


def test_a_transient_error_retries_whatever_its_built_in_base() -> None:
    class FlakyError(TransientError, ValueError):
        pass

    class BrokenError(PermanentError, ConnectionError):
        pass

    assert verdict_of(FlakyError("x")) is Verdict.RETRY  # a plain ValueError is PERMANENT
    assert verdict_of(BrokenError("x")) is Verdict.PERMANENT  # a plain ConnectionError retries


# --- the agent stream's gRPC status -----------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (StreamClosedError("INVALID_ARGUMENT", "bad seq"), grpc.StatusCode.INVALID_ARGUMENT),
        (StreamClosedError("ABORTED", "replaced"), grpc.StatusCode.ABORTED),
        (StreamClosedError("UNAVAILABLE", "term over"), grpc.StatusCode.UNAVAILABLE),
        (RefusedError("another member's job"), grpc.StatusCode.PERMISSION_DENIED),
        (ProtocolError("bad hello"), grpc.StatusCode.INVALID_ARGUMENT),
        (NotLeaderError("another replica leads"), grpc.StatusCode.UNAVAILABLE),
        (StoreUnavailableError("etcd down"), grpc.StatusCode.UNAVAILABLE),
        (TimeoutError(), grpc.StatusCode.UNAVAILABLE),  # the term's first lists were late
        (KeyError("a bug"), grpc.StatusCode.UNAVAILABLE),
    ],
)
def test_errors_close_an_agent_stream_with_these_codes(
    exc: BaseException, code: grpc.StatusCode
) -> None:
    assert grpc_status(close_code(exc)) == code


# --- the CLI's error line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (
            FieldError("metadata.name", "required to name the GPUJob"),
            "error: metadata.name: required to name the GPUJob",
        ),
        (
            KubeconfigError("no kubeconfig at /x (fix: pass --kubeconfig)"),
            "error: no kubeconfig at /x (fix: pass --kubeconfig)",
        ),
        (
            ValueError("--hub-url x: use http://HOST:PORT"),
            "error: --hub-url x: use http://HOST:PORT",
        ),
        (
            StoreUnavailableError("etcd at '/p/': timed out"),
            "error: etcd at '/p/': timed out (fix: it may be temporary: run the command again)",
        ),
        (
            SandboxError("the sandbox is not up"),
            "error: SandboxError: the sandbox is not up (an unexpected error: rerun with "
            "GPUFED_DEBUG=1 for the traceback, and report it)",
        ),
    ],
)
def test_the_cli_prints_errors_of_the_tree_by_their_branch(exc: BaseException, line: str) -> None:
    assert error_line(exc) == line


def test_the_cli_judges_its_own_errors_by_the_tree_not_the_built_in_base() -> None:
    """A TransientError that is a ConnectionError is not 'cannot reach the API server'."""
    line = error_line(HubUnavailableError("the hub ended the stream"))
    assert (
        line == "error: the hub ended the stream (fix: it may be temporary: run the command again)"
    )


# --- hub/components/finalizers.py: a refused finalizer -----------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "raises"),
    [
        (FakeApiError(422), False),  # no new finalizers on an object being deleted
        (FakeApiError(404), False),
        (FakeApiError(403), False),
        (FakeApiError(503), True),  # kube_retry gave up: not a refusal
        (FakeApiError(429), True),
        (RuntimeError("a bug"), True),
    ],
)
async def test_only_a_permanent_api_refusal_of_the_finalizer_is_dropped(
    exc: BaseException, raises: bool
) -> None:
    kube, ctrl, job = one_job(Lease(held=True))
    job.obj.metadata.finalizers.remove(FINALIZER)

    async def refuse(*args: Any) -> dict[str, Any]:
        raise exc

    kube.set_job_finalizers = refuse  # type: ignore[method-assign,assignment]
    if raises:
        with pytest.raises(type(exc)):
            await ctrl.finalizers.add_finalizer(job.uid)
    else:
        await ctrl.finalizers.add_finalizer(job.uid)
    await ctrl.mirror.stop()


# --- hub/edge/leader.py: what the campaign and the renewal retry -------------------------------------


class FlakyLeaseStore:
    """The part of Store the elector uses; each call raises the next scripted error first."""

    hub_id = "hub-a"

    def __init__(self, errors: list[BaseException], ttl_left: int = 3) -> None:
        self.errors = errors
        self.ttl_left = ttl_left

    def _next(self) -> None:
        if self.errors:
            raise self.errors.pop(0)

    async def grant_lease(self, ttl_s: int) -> object:
        self._next()
        return object()

    async def try_acquire(self, lease: object) -> bool:
        self._next()
        return True

    async def refresh(self, lease: object) -> int:
        self._next()
        return self.ttl_left


@pytest.fixture
def no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    real_sleep = asyncio.sleep

    async def fast(_: float) -> None:
        await real_sleep(0)

    monkeypatch.setattr("gpufed.hub.edge.leader.asyncio.sleep", fast)


@pytest.mark.usefixtures("no_waits")
async def test_the_campaign_polls_again_after_what_the_classifier_retries() -> None:
    store = FlakyLeaseStore(
        [
            ConnectionRefusedError(),
            aetcd.ConnectionFailedError(),
            StoreUnavailableError("etcd past its retry budget"),
        ]
    )
    elector = LeaderElector(store, ttl_s=3)  # type: ignore[arg-type]
    await asyncio.wait_for(elector.acquire(), 5)
    assert elector.is_leader
    assert not store.errors


@pytest.mark.usefixtures("no_waits")
async def test_the_campaign_keeps_trying_through_what_etcd_refuses() -> None:
    # A hub whose etcd refuses (bad credentials) or answers INTERNAL / UNKNOWN while it
    # restarts campaigns on, so it comes back by itself; a bug is still raised.
    store = FlakyLeaseStore(
        [
            aetcd.exceptions.UnauthenticatedError(),
            aetcd.InternalError(),
            aetcd.ClientError("UNKNOWN"),
        ]
    )
    elector = LeaderElector(store, ttl_s=3)  # type: ignore[arg-type]
    await asyncio.wait_for(elector.acquire(), 5)
    assert elector.is_leader
    assert not store.errors
    store2 = FlakyLeaseStore([KeyError("a bug")])
    with pytest.raises(KeyError):
        await asyncio.wait_for(LeaderElector(store2, ttl_s=3).acquire(), 5)  # type: ignore[arg-type]


@pytest.mark.usefixtures("no_waits")
async def test_the_leader_keeps_renewing_through_an_outage_and_steps_down_on_a_refusal() -> None:
    store = FlakyLeaseStore([])
    elector = LeaderElector(store, ttl_s=3)  # type: ignore[arg-type]
    await elector.acquire()
    store.errors = [ConnectionResetError(), StoreUnavailableError("slow")]
    store.ttl_left = 0  # answered after the outage: the lease is gone
    assert await asyncio.wait_for(elector.hold(), 5) == "the leader lease expired"

    await elector.acquire()
    store.ttl_left = 3
    store.errors = [aetcd.InternalError()]
    reason = await asyncio.wait_for(elector.hold(), 5)
    assert reason.startswith("could not renew the lease")
    assert not elector.is_leader


async def test_a_failed_campaign_is_raised_not_taken_for_an_election() -> None:
    # hub/edge/app.py's _first returned True for a campaign that raised, so a controller that
    # was not the leader started (its writes fenced at once).
    from gpufed.hub.edge.app import _first

    async def broken() -> None:
        raise KeyError("a bug")

    never = asyncio.Event()
    with pytest.raises(KeyError):
        await _first(broken(), never.wait())

    async def elected() -> None:
        return None

    assert await _first(elected(), never.wait()) is True
