"""The replica's role label on its own Pod (gpufed.hub.edge.podrole) and what /readyz and /leaderz
answer on a leader and a standby (gpufed.hub.edge.app, gpufed.hub.edge.http)."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.metrics import HubMetrics
from gpufed.hub.edge.app import Hub
from gpufed.hub.edge.http import make_app
from gpufed.hub.edge.leader import LeaderElector
from gpufed.hub.edge.podrole import PodRole


class FlakyLabeller:
    """Fails the first ``failures`` patches, then records each (namespace, name, labels)."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.patches: list[tuple[str, str, dict[str, str]]] = []

    async def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        if self.failures:
            self.failures -= 1
            raise OSError("connection refused")
        self.patches.append((namespace, name, labels))


async def until(check: object, turns: int = 200) -> None:
    for _ in range(turns):
        if callable(check) and check():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def test_the_pod_is_labelled_standby_then_leader_then_standby_on_stop() -> None:
    kube = FlakyLabeller()
    role = PodRole(kube, "gpufed-system", "hub-0")
    role.start()
    await until(lambda: role.applied == "standby")
    role.set("leader")
    await until(lambda: role.applied == "leader")
    await role.stop()
    assert [p[2]["gpufed.io/hub-role"] for p in kube.patches] == ["standby", "leader", "standby"]
    assert {p[:2] for p in kube.patches} == {("gpufed-system", "hub-0")}


async def test_a_failed_label_is_retried_until_it_lands() -> None:
    kube = FlakyLabeller(failures=2)
    role = PodRole(kube, "gpufed-system", "hub-0", retry_s=0)
    role.set("leader")
    role.start()
    await until(lambda: role.applied == "leader")
    await role.stop(final=None)
    assert [p[2]["gpufed.io/hub-role"] for p in kube.patches] == ["leader"]


async def test_a_standby_that_reaches_etcd_is_ready_but_not_leading() -> None:
    hub = Hub(HubConfig(insecure=True))
    elector = LeaderElector(store=None, ttl_s=5)  # type: ignore[arg-type]
    hub._elector = elector
    assert hub.readiness() == (False, "standby: etcd not reached (yet)")
    elector.reachable = True
    assert hub.readiness() == (True, "standby")
    async with TestClient(
        TestServer(make_app(HubMetrics(), hub.readiness, leading=hub.leading))
    ) as client:
        ready = await client.get("/readyz")
        assert (ready.status, await ready.text()) == (200, "standby\n")
        leader = await client.get("/leaderz")
        assert (leader.status, await leader.text()) == (503, "standby\n")
