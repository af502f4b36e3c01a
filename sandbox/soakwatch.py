"""The chaos soak's observer: polls the hub's and members' API servers and writes the history
:mod:`gpufed.sandbox.soakcheck` judges (JSON lines, one record per observation).

Each round (every ``interval_s``) it lists, with plain Kubernetes clients: the GPUJobs of the
soak's namespaces and the GPUQueues on the hub, the hub Pods labelled leader and the
MemberClusters' Ready condition; in every member, the pods labelled ``gpufed.io/job-uid`` and
the nodes' GPU products. A member whose API server does not answer has its last pods written
again (marked ``stale``), so an outage hides nothing it showed before. It reads what an
operator's ``kubectl`` reads, nothing of gpufed's own state.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from kubernetes import client as k8s

from gpufed.api.labels import GROUP, HUB_ROLE_LABEL, JOB_UID_LABEL, VERSION
from gpufed.sandbox.controlplane import TOKEN_NAMESPACE
from gpufed.sandbox.runtime import SandboxInfo

PRODUCT_LABEL = "nvidia.com/gpu.product"


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def pod_record(member: str, pod: Any, t: float) -> dict[str, Any]:
    """One member pod (a kubernetes client V1Pod) as a ``pod`` history record."""
    st = pod.status
    started: list[float] = []
    finished: list[float] = []
    codes: list[int] = []
    statuses = st.container_statuses or []
    for cs in statuses:
        state = cs.state
        if state and state.running and state.running.started_at:
            started.append(_ts(state.running.started_at) or 0.0)
        if state and state.terminated:
            if state.terminated.started_at:
                started.append(_ts(state.terminated.started_at) or 0.0)
            if state.terminated.finished_at:
                finished.append(_ts(state.terminated.finished_at) or 0.0)
            codes.append(int(state.terminated.exit_code or 0))
    if not started and st.phase == "Running" and st.start_time:
        started.append(_ts(st.start_time) or 0.0)
    resources: dict[str, int] = {}
    for c in pod.spec.containers or []:
        for res, qty in ((c.resources.limits if c.resources else None) or {}).items():
            if res == "nvidia.com/gpu" or res.startswith("nvidia.com/mig-"):
                resources[res] = resources.get(res, 0) + int(qty)
    owners = pod.metadata.owner_references or []
    all_done = bool(statuses) and len(finished) == len(statuses)
    return {
        "type": "pod",
        "t": t,
        "member": member,
        "ns": pod.metadata.namespace,
        "name": pod.metadata.name,
        "pod_uid": pod.metadata.uid,
        "job_uid": (pod.metadata.labels or {}).get(JOB_UID_LABEL, ""),
        "copy": owners[0].uid if owners else "",
        "phase": st.phase,
        "node": pod.spec.node_name or "",
        "resources": resources,
        "started": min(started) if started else None,
        "finished": max(finished) if all_done else None,
        "deleting": _ts(pod.metadata.deletion_timestamp),
        "exit_codes": codes,
    }


class Observer:
    """Polls the sandbox's API servers into ``path`` (module docstring) from a daemon thread
    between :meth:`start` and :meth:`stop`; :meth:`write` adds records of the soak's own
    (``submit``, ``fault``) to the same file, in time order."""

    def __init__(
        self, info: SandboxInfo, path: Path, namespaces: list[str], interval_s: float = 2.0
    ) -> None:
        self.path = path
        self.namespaces = namespaces
        self.interval_s = interval_s
        self._hub_custom: Any = k8s.CustomObjectsApi(info.api_client("hub"))
        self._hub_core: Any = k8s.CoreV1Api(info.api_client("hub"))
        self._core: dict[str, Any] = {m: k8s.CoreV1Api(info.api_client(m)) for m in info.members}
        self._lock = threading.Lock()
        self._fh: IO[str] = path.open("a")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="soak-observer")
        self._jobs_seen: set[tuple[str, str]] = set()
        self._last_pods: dict[str, list[dict[str, Any]]] = {}
        self._last_nodes: dict[str, dict[str, str]] = {}
        self._last_queues: Any = None
        self.rounds = 0

    def write(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._fh.write(json.dumps(record, sort_keys=True) + "\n")
            self._fh.flush()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """One last round, then close the file."""
        self._stop.set()
        self._thread.join(60)
        self.observe()
        with self._lock:
            self._fh.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.observe()
            except Exception as exc:
                self.write({"type": "observer-error", "t": time.time(), "error": str(exc)[:300]})

    def observe(self) -> None:
        """One round: hub objects, member pods and nodes, health, then a ``sample`` mark."""
        self._hub()
        for member in self._core:
            self._member(member)
        self.write({"type": "sample", "t": time.time()})
        self.rounds += 1

    def _hub(self) -> None:
        now = time.time()
        try:
            seen: set[tuple[str, str]] = set()
            for ns in self.namespaces:
                items = self._hub_custom.list_namespaced_custom_object(
                    GROUP, VERSION, ns, "gpujobs", _request_timeout=10
                )["items"]
                for obj in items:
                    key = (ns, obj["metadata"]["name"])
                    seen.add(key)
                    self.write(
                        {
                            "type": "job",
                            "t": now,
                            "ns": ns,
                            "name": key[1],
                            "uid": obj["metadata"]["uid"],
                            "phase": (obj.get("status") or {}).get("phase", "Pending"),
                            "restarts": (obj.get("status") or {}).get("restarts") or 0,
                            "message": str((obj.get("status") or {}).get("message", ""))[:300],
                        }
                    )
            for ns, name in sorted(self._jobs_seen - seen):
                self.write({"type": "job", "t": now, "ns": ns, "name": name, "phase": "gone"})
            self._jobs_seen = seen
            queues = self._hub_custom.list_cluster_custom_object(
                GROUP, VERSION, "gpuqueues", _request_timeout=10
            )["items"]
            specs = [{"name": q["metadata"]["name"], **(q.get("spec") or {})} for q in queues]
            if specs != self._last_queues:
                self.write({"type": "queues", "t": now, "queues": specs})
                self._last_queues = specs
            leaders = self._hub_core.list_namespaced_pod(
                TOKEN_NAMESPACE, label_selector=f"{HUB_ROLE_LABEL}=leader", _request_timeout=10
            ).items
            members = self._hub_custom.list_cluster_custom_object(
                GROUP, VERSION, "memberclusters", _request_timeout=10
            )["items"]
            ready = bool(members) and all(
                any(
                    c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (m.get("status") or {}).get("conditions") or []
                )
                for m in members
            )
            self.write(
                {
                    "type": "health",
                    "t": now,
                    "members_ready": ready,
                    "leader": leaders[0].metadata.name if leaders else None,
                }
            )
        except Exception as exc:
            self.write(
                {
                    "type": "health",
                    "t": now,
                    "members_ready": False,
                    "leader": None,
                    "error": str(exc)[:200],
                }
            )

    def _member(self, member: str) -> None:
        now = time.time()
        core = self._core[member]
        try:
            pods = core.list_pod_for_all_namespaces(
                label_selector=JOB_UID_LABEL, _request_timeout=10
            ).items
            nodes = core.list_node(_request_timeout=10).items
        except Exception:
            for rec in self._last_pods.get(member, []):
                self.write({**rec, "t": now, "stale": True})
            return
        recs = [pod_record(member, p, now) for p in pods]
        for rec in recs:
            self.write(rec)
        self._last_pods[member] = recs
        products = {
            n.metadata.name: (n.metadata.labels or {}).get(PRODUCT_LABEL, "") for n in nodes
        }
        if products != self._last_nodes.get(member):
            new = {k: v for k, v in products.items() if v}
            self.write({"type": "nodes", "t": now, "member": member, "products": new})
            self._last_nodes[member] = products
