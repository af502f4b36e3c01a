"""Two hub replicas in the sandbox, as the Deployment runs them (docs/hub.md, "Replicas"): both
answer ``/readyz`` 200, each labels its own Pod ``gpufed.io/hub-role`` and a Service that
selects ``leader`` (here a TCP forwarder on the address the agents dial, choosing the Ready Pod
labelled leader on each new connection, as kube-proxy follows the EndpointSlice) brings every
agent to the leader. The leader is killed (SIGKILL, no resignation): the other replica leads,
relabels its Pod, the agents reconnect through the same address, and no job is lost or
duplicated. The drill's timeline is printed.

The sandbox's own hub is stopped for the drill (its gRPC port becomes the Service's) and is
started again afterwards by the ``e2e`` fixture.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpufed.api.labels import HUB_ROLE_LABEL
from gpufed.hub.adapters.etcd import free_port
from gpufed.sandbox.controlplane import HUB_COMPONENT, TOKEN_NAMESPACE
from tests.e2e.harness import E2E, batch_job, http_status, unique, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


class Replica:
    """One ``gpufed hub`` process with the sandbox hub's flags, its own id, ports and Pod."""

    def __init__(self, name: str, argv: list[str], tmp: Path) -> None:
        self.name = name
        self.grpc_port, self.http_port = free_port(), free_port()
        keep = ("--listen=", "--http-listen=", "--hub-id=", "--data-dir=")
        args = [a for a in argv if not a.startswith(keep)]
        args += [
            f"--listen=127.0.0.1:{self.grpc_port}",
            f"--http-listen=127.0.0.1:{self.http_port}",
            f"--hub-id={name}",
            f"--data-dir={tmp / name}",
            f"--pod-name={name}",
            f"--pod-namespace={TOKEN_NAMESPACE}",
        ]
        self.log = tmp / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=out, start_new_session=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}{path}"

    def status(self, path: str) -> int | None:
        """HTTP status of ``path`` (None: no answer, e.g. killed)."""
        return http_status(self.url(path))

    def metric(self, name: str) -> float | None:
        try:
            with urllib.request.urlopen(self.url("/metrics"), timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
        return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class LeaderService:
    """The hub Service on ``port``: each new TCP connection goes to a replica whose Pod is
    labelled ``gpufed.io/hub-role=leader`` and which answers ``/readyz`` 200 (an endpoint of
    the Service); with none, the connection is closed at once (no endpoints)."""

    def __init__(self, port: int, endpoint: Callable[[], int | None]) -> None:
        self._endpoint = endpoint
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(16)
        self.routed: list[tuple[float, int]] = []
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            backend = self._endpoint()
            if backend is None:
                conn.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", backend), timeout=5)
            except OSError:
                conn.close()
                continue
            upstream.settimeout(None)
            self.routed.append((time.monotonic(), backend))
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    for s in (src, dst):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


def pod(name: str) -> dict[str, Any]:
    """A hub replica's Pod as the Deployment would create it (never scheduled here)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "gpufed-hub"}},
        "spec": {
            "serviceAccountName": "gpufed-hub",
            "automountServiceAccountToken": False,
            "containers": [{"name": "hub", "image": "gpufed:0.1.0"}],
        },
    }


@pytest.fixture
def replicas(e2e: E2E, tmp_path: Path) -> Iterator[tuple[E2E, list[Replica], LeaderService]]:
    core: Any = k8s.CoreV1Api(e2e.info.api_client("hub"))
    names = ("hub-a", "hub-b")
    for n in names:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(n, TOKEN_NAMESPACE, grace_period_seconds=0)
        wait_until(lambda n=n: _gone(core, n), f"old Pod {n} gone", 30)
        core.create_namespaced_pod(TOKEN_NAMESPACE, pod(n))
    argv = e2e.sandbox.supervisor.spec(HUB_COMPONENT).argv
    cp = e2e.info.control_plane
    assert cp is not None
    e2e.sandbox.supervisor.stop(HUB_COMPONENT)
    procs = [Replica(n, argv, tmp_path) for n in names]
    by_name = {r.name: r for r in procs}

    def endpoint() -> int | None:
        pods = core.list_namespaced_pod(
            TOKEN_NAMESPACE, label_selector=f"{HUB_ROLE_LABEL}=leader"
        ).items
        for p in pods:
            r = by_name.get(p.metadata.name)
            if r is not None and r.status("/readyz") == 200:
                return r.grpc_port
        return None

    service = LeaderService(int(cp.hub_address.rsplit(":", 1)[1]), endpoint)
    try:
        yield e2e, procs, service
    finally:
        service.close()
        for r in procs:
            r.stop()
        for n in names:
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(n, TOKEN_NAMESPACE, grace_period_seconds=0)


def _gone(core: Any, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, TOKEN_NAMESPACE)
    except ApiException as exc:
        return exc.status == 404
    return False


def test_both_replicas_are_ready_agents_follow_the_leader_and_a_killed_leader_loses_nothing(
    replicas: tuple[E2E, list[Replica], LeaderService],
) -> None:
    e2e, procs, service = replicas
    core: Any = k8s.CoreV1Api(e2e.info.api_client("hub"))
    agents = len(e2e.members)
    t0 = time.monotonic()
    timeline: list[tuple[float, str]] = []

    def mark(what: str) -> None:
        timeline.append((time.monotonic() - t0, what))

    def role(name: str) -> str | None:
        labels = core.read_namespaced_pod(name, TOKEN_NAMESPACE).metadata.labels or {}
        return labels.get(HUB_ROLE_LABEL)

    def leader() -> Replica | None:
        return next((r for r in procs if r.status("/leaderz") == 200), None)

    first = wait_until(leader, "a replica to lead", 90)
    standby = next(r for r in procs if r is not first)
    mark(f"{first.name} leads")
    wait_until(lambda: all(r.status("/readyz") == 200 for r in procs), "both replicas Ready", 60)
    mark("both replicas answer /readyz 200")
    wait_until(lambda: role(first.name) == "leader" and role(standby.name) == "standby", "roles")
    mark(f"Pods labelled: {first.name}=leader, {standby.name}=standby")
    wait_until(
        lambda: first.metric("gpufed_agents_connected") == agents, "agents on the leader", 90
    )
    assert standby.metric("gpufed_agents_connected") == 0.0
    assert standby.status("/leaderz") == 503
    mark(f"{agents} agents connected to {first.name}, none to {standby.name}")

    hub = e2e.hub
    before = unique("before")
    before_uid = hub.submit(before, batch_job(4))["metadata"]["uid"]
    cluster = hub.wait_phase(before, "Running", timeout_s=90)["cluster"]
    (copy,) = e2e.members[cluster].jobs_of(before_uid)
    mark(f"job {before} Running on {cluster}")

    first.kill()
    t_kill = time.monotonic()
    mark(f"{first.name} killed (SIGKILL, no resignation)")
    wait_until(lambda: standby.status("/leaderz") == 200, f"{standby.name} to lead", 60)
    mark(f"{standby.name} leads")
    wait_until(lambda: role(standby.name) == "leader", f"{standby.name}'s Pod labelled leader", 30)
    mark(f"{standby.name}'s Pod labelled leader")
    wait_until(
        lambda: standby.metric("gpufed_agents_connected") == agents, "agents reconnected", 90
    )
    mark(f"{agents} agents reconnected to {standby.name} (through the same Service address)")
    recovered_s = time.monotonic() - t_kill

    after = unique("after")
    after_uid = hub.submit(after, batch_job(4))["metadata"]["uid"]
    hub.wait_phase(after, "Running", timeout_s=90)
    mark(f"job {after} Running")
    st = hub.status(before)
    assert (st["phase"], st["cluster"]) == ("Running", cluster), "the first job kept running"
    assert {j.metadata.uid for j in e2e.members[cluster].jobs_of(before_uid)} == {copy.metadata.uid}
    for uid in (before_uid, after_uid):
        assert sum(len(v) for v in e2e.copies(uid).values()) == 1, "one member copy per job"
    mark("no job lost or duplicated (one member Job each, the first one unchanged)")

    print(f"\ntwo-replica drill (leader lease {e2e.options.leader_lease_s} s):")
    for at, what in timeline:
        print(f"  t+{at:6.1f}s  {what}")
    print(f"  kill -> agents back on the new leader: {recovered_s:.1f}s")
    print(f"  connections routed by the Service: {len(service.routed)}")
