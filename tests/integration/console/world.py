"""The hub objects the console's browser tests read (tests/integration/console/): two members
(one Ready and busy, one NotReady), a queue tree where one team borrows, a running preemptor,
its pending victim and a finished job, written with their statuses as the hub would write them;
a team identity that may read only its namespace's jobs; and the placement snapshot the hub's
blocks endpoint answers from."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from gpufed.api.decision import Reservation
from gpufed.api.inventory import ClusterInventory, MemberClusterState, NodeInventory
from gpufed.placement import FleetSnapshot
from tests.integration.console.harness import (
    GROUP,
    VERSION,
    condition,
    event,
    now_rfc3339,
    service_account_kubeconfig,
)
from tests.integration.hub.harness import gpu_job

TEAM_A, TEAM_B = "console-a", "console-b"
H100, GB200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-GB200"
MEMBERS = ("console-hgx", "console-nvl72")
QUEUES = ("console-org", "console-team-a", "console-team-b")


class World:
    """The hub objects of this module (made once, removed at the end)."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self.custom = k8s.CustomObjectsApi(api)
        self.core = k8s.CoreV1Api(api)
        self.rbac = k8s.RbacAuthorizationV1Api(api)

    def status(self, plural: str, name: str, status: dict[str, Any], ns: str = "") -> None:
        if ns:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, ns, plural, name, {"status": status}
            )
        else:
            self.custom.patch_cluster_custom_object_status(
                GROUP, VERSION, plural, name, {"status": status}
            )

    def member(self, name: str, labels: dict[str, str], status: dict[str, Any]) -> None:
        self.custom.create_cluster_custom_object(
            GROUP,
            VERSION,
            "memberclusters",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "MemberCluster",
                "metadata": {"name": name},
                "spec": {"labels": labels, "joinTokenRef": {"name": f"{name}-join"}},
            },
        )
        self.status("memberclusters", name, status)

    def queue(self, name: str, spec: dict[str, Any], status: dict[str, Any]) -> None:
        self.custom.create_cluster_custom_object(
            GROUP,
            VERSION,
            "gpuqueues",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "GPUQueue",
                "metadata": {"name": name},
                "spec": spec,
            },
        )
        self.status("gpuqueues", name, status)

    def job(self, ns: str, name: str, gpus: int, status: dict[str, Any]) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            ns,
            "gpujobs",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "GPUJob",
                "metadata": {"name": name},
                "spec": {"template": gpu_job(gpus)},
            },
        )
        self.status("gpujobs", name, status, ns)
        return obj

    def remove(self) -> None:
        """Delete what :func:`build` made. The GPUJobs first, one by one: the hub tests' API
        server runs no namespace controller, so a deleted namespace keeps its objects, and a
        later hub test's hub would take these placed-looking GPUJobs in."""
        for ns in (TEAM_A, TEAM_B):
            with contextlib.suppress(k8s.ApiException):
                jobs = self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "gpujobs")
                for job in jobs.get("items", []):
                    name = job["metadata"]["name"]
                    if job["metadata"].get("finalizers"):
                        self.custom.patch_namespaced_custom_object(
                            GROUP, VERSION, ns, "gpujobs", name, {"metadata": {"finalizers": None}}
                        )
                    self.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "gpujobs", name)
        for ns in (TEAM_A, TEAM_B):
            with contextlib.suppress(k8s.ApiException):
                self.core.delete_namespace(ns)
        for plural, names in (("memberclusters", MEMBERS), ("gpuqueues", QUEUES)):
            for name in names:
                with contextlib.suppress(k8s.ApiException):
                    self.custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
        with contextlib.suppress(k8s.ApiException):
            self.rbac.delete_cluster_role_binding("console-test-fleet-reader")
        with contextlib.suppress(k8s.ApiException):
            self.rbac.delete_cluster_role("console-test-fleet-reader")


def build(w: World) -> None:
    """Two members (one Ready and busy, one NotReady), a queue tree where team-b borrows, a
    running preemptor in team-a and its victim pending in team-b, and a finished job."""
    for ns in (TEAM_A, TEAM_B):
        w.core.create_namespace({"metadata": {"name": ns}})
    ready = condition("Ready", "True", "AgentConnected", "the agent is connected")
    w.member(
        MEMBERS[0],
        {"region": "us-east"},
        {
            "conditions": [ready],
            "gpusTotal": {H100: 64},
            "gpusFree": {H100: 20},
            "gpusReserved": {H100: 8},
            "largestFreeNVLinkBlock": 8,
            "largestFreeNVLinkBlockByProduct": {H100: 8},
            "nodes": 8,
            "agentVersion": "0.1.0",
            "lastHeartbeatTime": now_rfc3339(),
            "suspectNodes": [{"node": "hgx-3", "reason": "NodeNotReady"}],
        },
    )
    w.member(
        MEMBERS[1],
        {"region": "eu"},
        {
            "conditions": [
                condition("Ready", "False", "LeaseExpired", "no message from the agent for 40 s")
            ],
            "gpusTotal": {GB200: 144},
            "gpusFree": {GB200: 144},
            "largestFreeNVLinkBlock": 72,
            "largestFreeNVLinkBlockByProduct": {GB200: 72},
            "nodes": 36,
        },
    )
    active = [condition("Active", "True", "Admitting", "")]
    w.queue(
        QUEUES[0],
        {"quotas": [{"gpuProduct": H100, "nominal": 64}]},
        {"conditions": active, "usage": [{"gpuProduct": H100, "nominal": 64, "used": 40}]},
    )
    w.queue(
        QUEUES[1],
        {
            "parent": QUEUES[0],
            "namespaces": [TEAM_A],
            "quotas": [{"gpuProduct": H100, "nominal": 48}],
            "fairShare": {"weight": 2},
        },
        {
            "conditions": active,
            "usage": [{"gpuProduct": H100, "nominal": 48, "used": 32}],
            "pendingJobs": 0,
            "admittedJobs": 1,
            "fairShare": "1200.5",
        },
    )
    w.queue(
        QUEUES[2],
        {
            "parent": QUEUES[0],
            "namespaces": [TEAM_B],
            "quotas": [{"gpuProduct": H100, "nominal": 0, "borrowingLimit": 16}],
        },
        {
            "conditions": active,
            "usage": [{"gpuProduct": H100, "nominal": 0, "used": 8, "borrowed": 8}],
            "pendingJobs": 1,
            "admittedJobs": 1,
        },
    )
    # Times from now on (a status cannot predate the object's creation, which is now).
    t0, t1, t2, t3 = (now_rfc3339(k) for k in (0, 1, 2, 3))
    victim = w.job(
        TEAM_B,
        "borrower-b",
        8,
        {
            "phase": "Pending",
            "message": "preempted by console-a/pretrain-a; waiting for GPUs",
            "gpus": 8,
            "preemptions": 1,
            "conditions": [
                condition("Valid", "True", "Valid", "", t0),
                condition("Preempted", "True", "Reclaim", "preempted by console-a/pretrain-a", t1),
            ],
            "placement": {
                "outcome": "Unschedulable",
                "message": "no member has 8 free H100 GPUs in one NVLink domain",
                "rejections": [
                    {
                        "cluster": MEMBERS[0],
                        "plugin": "Quota",
                        "code": "Unschedulable",
                        "reason": "queue console-team-b may borrow at most 16",
                    },
                    {
                        "cluster": MEMBERS[1],
                        "plugin": "Health",
                        "code": "Unschedulable",
                        "reason": "member is not Ready (LeaseExpired)",
                    },
                ],
                "explained": True,
            },
        },
    )
    event(w.core, victim, "Normal", "Placed", f"placed on {MEMBERS[0]}: hgx-1", t0)
    event(w.core, victim, "Warning", "Preempted", "preempted by console-a/pretrain-a", t1)
    preemptor = w.job(
        TEAM_A,
        "pretrain-a",
        32,
        {
            "phase": "Running",
            "message": f"running on {MEMBERS[0]}",
            "cluster": MEMBERS[0],
            "gpus": 32,
            "attempt": 1,
            "conditions": [
                condition("Valid", "True", "Valid", "", t0),
                condition("Placed", "True", "Placed", f"on {MEMBERS[0]}", t2),
                condition("Dispatched", "True", "Applied", "objects exist in the member", t2),
            ],
            "placement": {
                "outcome": "Placed",
                "cluster": MEMBERS[0],
                "gpuProduct": H100,
                "nvlinkDomains": ["node:hgx-0", "node:hgx-1", "node:hgx-2", "node:hgx-4"],
                "podSets": [
                    {
                        "name": "main",
                        "requests": {"nvidia.com/gpu": 8},
                        "nodes": {"hgx-0": 1, "hgx-1": 1, "hgx-2": 1, "hgx-4": 1},
                    }
                ],
                "score": 91.0,
                "message": f"placed on {MEMBERS[0]}",
                "decidedTime": t2,
            },
            "preemption": {
                "cluster": MEMBERS[0],
                "nodes": ["hgx-1"],
                "nvlinkDomains": ["node:hgx-1"],
                "victims": [
                    {
                        "job": f"{TEAM_B}/borrower-b",
                        "priority": 0,
                        "costGpuSeconds": 2400,
                        "reason": "reclaim",
                    }
                ],
                "costGpuSeconds": 2400,
                "time": t1,
                "message": "team-b borrowed from team-a",
            },
            "startTime": t3,
        },
    )
    event(w.core, preemptor, "Normal", "Preempting", f"preempting {TEAM_B}/borrower-b", t1)
    event(w.core, preemptor, "Normal", "Placed", f"placed on {MEMBERS[0]}", t2)
    w.job(
        TEAM_A,
        "eval-a",
        8,
        {
            "phase": "Succeeded",
            "message": "completed",
            "cluster": MEMBERS[0],
            "gpus": 8,
            "conditions": [condition("Finished", "True", "Succeeded", "", t1)],
            "completionTime": t1,
        },
    )


def _created(create: Any, *args: Any) -> None:
    """``create(*args)``, an object already there (409) left as it is."""
    try:
        create(*args)
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise


def team_a_identity(w: World, admin_kubeconfig: Path, out: Path) -> Path:
    """ServiceAccount console-a/viewer: GPUJobs and Events of console-a only; MemberClusters
    and GPUQueues cluster-wide (read). Made once; a second call reuses the grants."""
    _created(
        w.rbac.create_namespaced_role,
        TEAM_A,
        {
            "metadata": {"name": "console-viewer"},
            "rules": [
                {"apiGroups": [GROUP], "resources": ["gpujobs"], "verbs": ["get", "list"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
            ],
        },
    )
    _created(
        w.rbac.create_namespaced_role_binding,
        TEAM_A,
        {
            "metadata": {"name": "console-viewer"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "console-viewer",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": TEAM_A}],
        },
    )
    _created(
        w.rbac.create_cluster_role,
        {
            "metadata": {"name": "console-test-fleet-reader"},
            "rules": [
                {
                    "apiGroups": [GROUP],
                    "resources": ["memberclusters", "gpuqueues"],
                    "verbs": ["get", "list"],
                }
            ],
        },
    )
    _created(
        w.rbac.create_cluster_role_binding,
        {
            "metadata": {"name": "console-test-fleet-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "console-test-fleet-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": TEAM_A}],
        },
    )
    return service_account_kubeconfig(w.custom.api_client, admin_kubeconfig, TEAM_A, "viewer", out)


def fleet_snapshot() -> FleetSnapshot:
    """What the hub would hold for the two members: console-hgx's 8 HGX nodes (hgx-0..3 full,
    hgx-4 half used, 8 GPUs reserved on hgx-5, hgx-3 NotReady) and console-nvl72's two idle
    72-GPU cliques."""

    def node(name: str, domain: str, product: str, gpus: int, used: int = 0, **kw: Any) -> Any:
        return NodeInventory(
            name=name,
            gpu_product=product,
            nvlink_domain=domain,
            allocatable={"nvidia.com/gpu": gpus},
            requested={"nvidia.com/gpu": used} if used else {},
            **kw,
        )

    hgx = [
        node(
            f"hgx-{i}",
            f"node:hgx-{i}",
            H100,
            8,
            used=8 if i < 4 else 4 if i == 4 else 0,
            ready=i != 3,
        )
        for i in range(8)
    ]
    trays = [node(f"tray-{i}", f"clique:c{i // 18}", GB200, 4) for i in range(36)]
    snap = FleetSnapshot(
        [
            MemberClusterState(
                name=MEMBERS[0], inventory=ClusterInventory(cluster=MEMBERS[0], nodes=tuple(hgx))
            ),
            MemberClusterState(
                name=MEMBERS[1], inventory=ClusterInventory(cluster=MEMBERS[1], nodes=tuple(trays))
            ),
        ]
    )
    snap.add_reservation(
        Reservation(
            job_uid="u1",
            cluster=MEMBERS[0],
            nodes={"hgx-5": {"nvidia.com/gpu": 8}},
            created_at=0.0,
            ttl_s=3600.0,
        )
    )
    return snap
