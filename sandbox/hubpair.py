"""Two hub replicas with leader election in the sandbox, as the Helm Deployment runs them.

The sandbox's one ``hub`` component is stopped; two supervised components ``hub/a`` and
``hub/b`` run ``gpufed hub`` with the same flags but their own ``--hub-id``, ports, data dir
and ``--pod-name`` (a Pod of that name is created on the hub cluster, never scheduled, for the
replica to label ``gpufed.io/hub-role``). A TCP forwarder on the address the agents dial plays
the hub Service: each new connection goes to the replica whose Pod is labelled ``leader`` and
which answers ``/readyz`` 200 (kube-proxy following the EndpointSlice); with none, the
connection is closed at once. Used by the chaos soak (:mod:`gpufed.sandbox.soak`), whose fault
injector kills and pauses the leader by component name, and by the e2e drills with two
replicas, which put the single hub back afterwards (:meth:`HubPair.stop`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpufed.api.labels import HUB_ROLE_LABEL
from gpufed.sandbox.controlplane import HUB_COMPONENT, TOKEN_NAMESPACE
from gpufed.sandbox.runtime import Sandbox, free_ports
from gpufed.sandbox.supervisor import ComponentSpec, Probe, http_ok

#: Component names of the two replicas.
REPLICAS = ("hub/a", "hub/b")


def _pod_name(component: str) -> str:
    return "gpufed-" + component.replace("/", "-")


def _pod(name: str) -> dict[str, Any]:
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


class HubPair:
    """Two hub replicas behind a leader-following forwarder on the sandbox's hub address.

    :meth:`start` replaces the sandbox's single hub with the pair; :meth:`leader` names the
    component whose Pod is labelled leader (None while nobody leads); :meth:`close` stops the
    forwarder (the replicas are supervised components: ``Sandbox.down`` stops them);
    :meth:`stop` undoes :meth:`start` (the single hub runs again)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        info = sandbox.info()
        cp = info.control_plane
        if cp is None:
            raise ValueError("HubPair needs a sandbox started with its control plane")
        self._address_port = int(cp.hub_address.rsplit(":", 1)[1])
        self.core: Any = k8s.CoreV1Api(info.api_client("hub"))
        self.http: dict[str, str] = {}
        self.grpc: dict[str, int] = {}
        self._sock: socket.socket | None = None
        self._closing = False

    def start(self, timeout_s: float = 90.0) -> None:
        """Stop the single hub, register and start both replicas, open the forwarder and wait
        until one of them leads. Raises TimeoutError naming the replicas' logs otherwise."""
        sup = self.sandbox.supervisor
        argv = sup.spec(HUB_COMPONENT).argv
        sup.stop(HUB_COMPONENT)
        state = self.sandbox.state_dir
        keep = ("--listen=", "--http-listen=", "--hub-id=", "--data-dir=")
        for comp in REPLICAS:
            pod = _pod_name(comp)
            with contextlib.suppress(ApiException):
                self.core.delete_namespaced_pod(pod, TOKEN_NAMESPACE, grace_period_seconds=0)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self._pod_exists(pod):
                time.sleep(0.2)
            self.core.create_namespaced_pod(TOKEN_NAMESPACE, _pod(pod))
            grpc, http = free_ports(2)
            self.grpc[comp], self.http[comp] = grpc, f"http://127.0.0.1:{http}"
            args = [a for a in argv if not a.startswith(keep)] + [
                f"--listen=127.0.0.1:{grpc}",
                f"--http-listen=127.0.0.1:{http}",
                f"--hub-id={pod}",
                f"--data-dir={state / pod}",
                f"--pod-name={pod}",
                f"--pod-namespace={TOKEN_NAMESPACE}",
            ]
            sup.register(
                ComponentSpec(
                    name=comp,
                    argv=args,
                    ports=[grpc, http],
                    probe=Probe(kind="http", url=f"http://127.0.0.1:{http}/healthz"),
                    start_timeout_s=60,
                )
            )
        sup.start_many(list(REPLICAS))
        self._open_forwarder()
        deadline = time.monotonic() + timeout_s
        while self.leader() is None:
            if time.monotonic() > deadline:
                logs = ", ".join(str(sup.log_path(c)) for c in REPLICAS)
                raise TimeoutError(f"no hub replica leads after {timeout_s:.0f}s (logs: {logs})")
            time.sleep(0.5)

    def _pod_exists(self, name: str) -> bool:
        try:
            self.core.read_namespaced_pod(name, TOKEN_NAMESPACE)
        except ApiException as exc:
            return bool(exc.status != 404)
        return True

    def leader(self) -> str | None:
        """The replica component whose Pod is labelled leader and answers ``/readyz``."""
        try:
            pods = self.core.list_namespaced_pod(
                TOKEN_NAMESPACE, label_selector=f"{HUB_ROLE_LABEL}=leader"
            ).items
        except (ApiException, OSError, Exception):
            return None
        for p in pods:
            for comp in REPLICAS:
                if p.metadata.name == _pod_name(comp) and http_ok(f"{self.http[comp]}/readyz"):
                    return comp
        return None

    # --- the Service -----------------------------------------------------------------------------

    def _open_forwarder(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self._address_port))
        sock.listen(32)
        self._sock = sock
        threading.Thread(target=self._accept, daemon=True, name="hub-service").start()

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._closing:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            comp = self.leader()
            if comp is None:
                conn.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.grpc[comp]), timeout=5)
            except OSError:
                conn.close()
                continue
            upstream.settimeout(None)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def url(self, component: str, path: str) -> str:
        """The HTTP URL of ``path`` (``/readyz``, ``/leaderz``, ``/metrics``) on a replica."""
        return f"{self.http[component]}{path}"

    def stop(self, timeout_s: float = 120.0) -> None:
        """Undo :meth:`start`: close the forwarder, stop and unregister both replicas, delete
        their Pods and start the sandbox's single hub again (on the address the forwarder
        held)."""
        self.close()
        sup = self.sandbox.supervisor
        sup.stop_many(list(REPLICAS))
        for comp in REPLICAS:
            sup.unregister(comp)
            with contextlib.suppress(ApiException):
                self.core.delete_namespaced_pod(
                    _pod_name(comp), TOKEN_NAMESPACE, grace_period_seconds=0
                )
        sup.start(HUB_COMPONENT, timeout=timeout_s)

    def close(self) -> None:
        """Stop accepting connections (open ones end with their replica)."""
        self._closing = True
        if self._sock is not None:
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


def replica_data_dir(state_dir: Path, component: str) -> Path:
    """Where replica ``component`` keeps its ``--data-dir``."""
    return state_dir / _pod_name(component)
