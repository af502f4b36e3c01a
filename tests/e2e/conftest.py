"""The end-to-end session: one sandbox with the example fleet (hub cluster + us-east-hgx,
eu-nvl72, ap-a100-mig) and the whole gpufed control plane running as processes (hub on the
sandbox's etcd, one agent per member), with short timers so the fault drills fit in minutes:

* member lease 5 s (NotReady after 5 s of silence), member-lost timeout 30 s (longer than the
  agents' reconnect backoff after a hub or etcd outage of a few seconds), heartbeat 1 s,
  leader lease 5 s.

Its own state dir, never the integration ``sandbox`` fixture: a second hub on that hub
cluster would act on the integration tests' GPUJobs. Every test starts with the control plane
healthy (whatever a drill left stopped is started again) and the drill namespace empty.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufed.sandbox.binaries import BinariesError, BinDir, ensure_binaries
from gpufed.sandbox.controlplane import ControlPlaneOptions
from gpufed.sandbox.hubpair import HubPair
from gpufed.sandbox.runtime import Sandbox
from tests.e2e.harness import DRILL_NS, E2E

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_FLEET = REPO_ROOT / "manifests" / "fleets" / "example.yaml"
E2E_OPTIONS = ControlPlaneOptions(
    member_lease_s=5,
    member_lost_s=30,
    heartbeat_s=1,
    leader_lease_s=5,
    ready_timeout_s=120,
    # the backoff between re-runs, 2 s doubling instead of 60 s (the drills wait about a minute),
    # and suspect marks for 90 s instead of an hour (a drill's marks must not shrink the fleet
    # of the tests after it: they wait for the marks to end, see wait_no_suspects)
    hub_args=[
        "--rerun-backoff-base",
        "2",
        "--rerun-backoff-max",
        "30",
        "--suspect-node-cooldown",
        "90",
    ],
)


@pytest.fixture(scope="session")
def e2e_bin_dir() -> BinDir:
    try:
        return ensure_binaries(progress=None)
    except BinariesError as exc:
        pytest.fail(f"control-plane binaries unavailable: {exc}")


@pytest.fixture(scope="session")
def e2e_sandbox(tmp_path_factory: pytest.TempPathFactory, e2e_bin_dir: BinDir) -> Iterator[Sandbox]:
    """The session's sandbox with hub and agents (example fleet, short timers)."""
    sb = Sandbox(tmp_path_factory.mktemp("e2e") / "state", bin_dir=e2e_bin_dir)
    sb.up(EXAMPLE_FLEET, control_plane=E2E_OPTIONS)
    try:
        yield sb
    finally:
        sb.down()


@pytest.fixture(scope="session")
def e2e_session(e2e_sandbox: Sandbox) -> Iterator[E2E]:
    env = E2E(e2e_sandbox, e2e_sandbox.info())
    env.hub.ensure_namespace(DRILL_NS)
    yield env
    env.close()


@pytest.fixture
def e2e(e2e_session: E2E) -> Iterator[E2E]:
    """The session's :class:`E2E`, healthy at the start of the test; the drill namespace is
    emptied afterwards."""
    e2e_session.wait_healthy()
    yield e2e_session
    e2e_session.wait_healthy()
    e2e_session.hub.clear(DRILL_NS)


@pytest.fixture
def hub_pair(e2e: E2E) -> Iterator[HubPair]:
    """Two hub replicas with leader election (:class:`gpufed.sandbox.hubpair.HubPair`) in
    place of the session's single hub, one of them leading; the single hub runs again
    afterwards."""
    pair = HubPair(e2e.sandbox)
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()
