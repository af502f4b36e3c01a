"""Real workload operators in the members (issue 28): a JobSet, a PyTorchJob and a RayJob
submitted as GPUJobs, run by the JobSet controller, the Kubeflow training-operator and KubeRay
that the example fleet runs as sandbox processes (``clusters[].operators``).

Every test runs once per kind (:data:`KINDS`):

* placed, created in the member, its pods made by the operator (not by gpufed), all in the
  placed member and each on a node the hub chose; the operator's own conditions and the right
  phase mirrored on the hub (a RayJob cannot finish here, nothing answers the Ray dashboard:
  its RayCluster's head and GPU workers run in one member and the hub shows it Running);
* deleting the GPUJob leaves none of the operator's children (Jobs, pods, Services,
  RayClusters, the submitter Job);
* a low-priority copy preempted by a high-priority GPUJob: the old copy and everything its
  operator made are gone before the preemptor's first pod exists, and the victim waits in the
  queue (Pending, ``Preempted``);
* a copy whose node is deleted is re-run, the old copy and everything it made gone (but pods on
  the deleted node, which no kubelet confirms) before the new copy exists.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client as k8s

from gpufed.api.labels import ATTEMPT_ANNOTATION, GPU_PRODUCT_LABEL, SIM_DURATION_ANNOTATION
from tests.e2e.harness import (
    DRILL_NS,
    E2E,
    GB200,
    H100,
    Member,
    batch_job,
    priority_classes,
    unique,
    wait_until,
)
from tests.e2e.test_9_failures import restore_nodes  # noqa: F401 (the fixture, shared)

# 420 s: run alone, the first test also waits for the session sandbox (with three operators,
# several minutes on a loaded 2-core machine)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

#: PriorityClasses of the preemption tests: the victim, the rest of its member, the preemptor.
CLASSES = {"e2e-low": 100, "e2e-mid": 1_000, "e2e-high": 100_000}


def _pod(gpus: int, run_for: str | None, name: str = "main") -> dict[str, Any]:
    annotations = {SIM_DURATION_ANNOTATION: run_for} if run_for else {}
    return {
        "metadata": {"annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": name,
                    "image": "e2e:1.0",
                    "resources": {"limits": {"nvidia.com/gpu": gpus}},
                }
            ],
        },
    }


def jobset(pods: int, gpus: int, run_for: str | None = None) -> dict[str, Any]:
    """A JobSet of one replicated Job of ``pods`` pods of ``gpus`` GPUs."""
    job = {"parallelism": pods, "completions": pods, "backoffLimit": 0}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "spec": {
            "replicatedJobs": [
                {
                    "name": "trainer",
                    "replicas": 1,
                    "template": {"spec": {**job, "template": _pod(gpus, run_for)}},
                }
            ]
        },
    }


def pytorchjob(workers: int, gpus: int, run_for: str | None = None) -> dict[str, Any]:
    """A PyTorchJob: a Master and ``workers`` Workers of ``gpus`` GPUs each."""

    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "Never", "template": _pod(gpus, run_for, "pytorch")}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(workers)}},
    }


def rayjob(workers: int, gpus: int, run_for: str | None = None) -> dict[str, Any]:
    """A RayJob whose RayCluster has a head (no GPU) and ``workers`` GPU workers (which run
    until deleted: ``run_for`` is ignored, a RayJob never finishes here)."""

    def pod(name: str, limits: dict[str, Any]) -> dict[str, Any]:
        container = {
            "name": name,
            "image": "rayproject/ray:2.46.0",
            "resources": {"limits": limits},
        }
        return {"spec": {"containers": [container]}}

    group = {"groupName": "gpu", "replicas": workers, "minReplicas": workers}
    group |= {"maxReplicas": workers, "rayStartParams": {}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "spec": {
            "entrypoint": "python -c 'import ray; ray.init()'",
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": pod("ray-head", {"cpu": "1", "memory": "2Gi"}),
                },
                "workerGroupSpecs": [
                    {**group, "template": pod("ray-worker", {"nvidia.com/gpu": gpus})}
                ],
            },
        },
    }


@dataclass(frozen=True)
class Kind:
    """One workload kind run by its real operator in the example fleet."""

    id: str
    group: str
    version: str
    plural: str
    #: (GPU pods, GPUs each, run_for) -> the GPUJob template
    build: Callable[[int, int, str | None], dict[str, Any]]
    #: GPU pods of ``build(n, …)`` for n: (the PyTorchJob's n counts its Master)
    member: str
    product: str
    gpus: int
    #: kind of the owner of the operator's pods
    pod_owner: str
    #: pods without a GPU the operator adds (the Ray head)
    extra_pods: int
    #: the operator's condition (type, (status, reason)) that ends a successful run; None:
    #: never finishes here
    done: tuple[str, tuple[str, str]] | None

    def template(self, gang: int, run_for: str | None = None) -> dict[str, Any]:
        """``gang`` GPU pods of :attr:`gpus` GPUs each."""
        return self.build(gang, self.gpus, run_for)

    def get(self, member: Member, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = _custom(member).get_namespaced_custom_object(
                self.group, self.version, DRILL_NS, self.plural, name
            )
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj


KINDS = [
    Kind(
        "jobset",
        "jobset.x-k8s.io",
        "v1alpha2",
        "jobsets",
        jobset,
        member="us-east-hgx",
        product=H100,
        gpus=8,
        pod_owner="Job",
        extra_pods=0,
        done=("Completed", ("True", "AllJobsCompleted")),
    ),
    Kind(
        "pytorchjob",
        "kubeflow.org",
        "v1",
        "pytorchjobs",
        lambda n, g, r: pytorchjob(n - 1, g, r),
        member="us-east-hgx",
        product=H100,
        gpus=8,
        pod_owner="PyTorchJob",
        extra_pods=0,
        done=("Succeeded", ("True", "PyTorchJobSucceeded")),
    ),
    Kind(
        "rayjob",
        "ray.io",
        "v1",
        "rayjobs",
        rayjob,
        member="eu-nvl72",
        product=GB200,
        gpus=4,
        pod_owner="RayCluster",
        extra_pods=1,
        done=None,
    ),
]
by_kind = pytest.mark.parametrize("kind", KINDS, ids=[k.id for k in KINDS])


def _custom(member: Member) -> Any:
    return k8s.CustomObjectsApi(member.api)


@dataclass(frozen=True)
class Obj:
    """One object of the drill namespace, as far as these tests care."""

    kind: str
    name: str
    uid: str
    owners: tuple[str, ...]
    node: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}" + (f" on {self.node}" if self.node else "")


def _objects(member: Member, kind: Kind, name: str) -> list[Obj]:
    """The workload ``name`` and everything in the drill namespace its operator may have made
    for it: RayClusters (KubeRay), Jobs, pods and Services named ``name`` or ``name-…`` (every
    operator here names its children after the workload)."""

    def meta(k: str, m: Any, node: str | None = None) -> Obj:
        if isinstance(m, dict):
            refs = m.get("ownerReferences") or []
            return Obj(k, m["name"], m["uid"], tuple(r["uid"] for r in refs))
        refs = m.owner_references or []
        return Obj(k, m.name, m.uid, tuple(r.uid for r in refs), node)

    custom = _custom(member)
    plurals = [(kind.id, kind.group, kind.version, kind.plural)]
    if kind.id == "rayjob":
        plurals.append(("raycluster", "ray.io", "v1", "rayclusters"))
    found: list[Obj] = []
    for k, group, version, plural in plurals:
        items = custom.list_namespaced_custom_object(group, version, DRILL_NS, plural)["items"]
        found += [meta(k, o["metadata"]) for o in items]
    found += [meta("Job", j.metadata) for j in member.batch.list_namespaced_job(DRILL_NS).items]
    found += [
        meta("Pod", p.metadata, p.spec.node_name)
        for p in member.core.list_namespaced_pod(DRILL_NS).items
    ]
    found += [
        meta("Service", s.metadata) for s in member.core.list_namespaced_service(DRILL_NS).items
    ]
    return [o for o in found if o.name == name or o.name.startswith(f"{name}-")]


def _pod_phases(member: Member, name: str) -> list[str]:
    """``name-…`` pods as ``pod@node:phase[:Terminating]``."""
    return sorted(
        f"{p.metadata.name}@{p.spec.node_name}:{p.status.phase}"
        + (":Terminating" if p.metadata.deletion_timestamp else "")
        for p in member.core.list_namespaced_pod(DRILL_NS).items
        if p.metadata.name.startswith(f"{name}-")
    )


def _summary(objs: list[Obj]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for o in objs:
        out.setdefault(o.kind, []).append(o.name)
    return {k: sorted(v) for k, v in sorted(out.items())}


def _placed(status: dict[str, Any]) -> set[str]:
    return {n for ps in status["placement"]["podSets"] for n in ps["nodes"]}


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c.get("reason", "")) for c in status.get("conditions") or []}


def _running_condition(hub: Any, name: str, timeout_s: float = 60) -> dict[str, Any]:
    return wait_until(
        lambda: (
            s if _conditions(s := hub.status(name)).get("Running", ("",))[0] == "True" else None
        ),
        "the operator's Running condition on the hub",
        timeout_s,
    )


def _check_pods_made_by_the_operator_where_placed(
    e2e: E2E, st: dict[str, Any], uid: str, kind: Kind, gang: int, timeout_s: float = 60
) -> list[Any]:
    """Every pod of the job's current copy (the attempt ``st`` shows) is in the placed member,
    on a node the hub chose, made by the operator (owned by ``kind.pod_owner``, never by gpufed
    directly); returns them. A previous copy's pods on a deleted node still read Running (no
    kubelet there) until the member's pod GC removes them: they are left out by attempt."""
    count = gang + kind.extra_pods
    member = e2e.members[st["cluster"]]
    attempt = str(st.get("attempt", 1))

    def current() -> list[Any] | None:
        pods = [
            p
            for p in member.pods_of(uid, running=True)
            if (p.metadata.annotations or {}).get(ATTEMPT_ANNOTATION) == attempt
        ]
        return pods if len(pods) == count else None

    pods = wait_until(current, f"{count} pods of attempt {attempt} running", timeout_s)
    for other, m in e2e.members.items():
        if other != st["cluster"]:
            assert m.pods_of(uid) == [], f"pods of one gang in two members ({other})"
    for p in pods:
        assert p.spec.node_name in _placed(st), (p.metadata.name, p.spec.node_name, _placed(st))
        assert [o.kind for o in p.metadata.owner_references or []] == [kind.pod_owner]
    return pods


def _check_what_the_operator_made(member: Member, kind: Kind, name: str, pods: list[Any]) -> None:
    """Each operator's own children, as docs/agent.md "Real workload operators" describes."""
    made = _summary(_objects(member, kind, name))
    if kind.id == "jobset":
        # one Job per replica, owned by the JobSet; a headless Service named after the JobSet
        (job,) = member.batch.list_namespaced_job(
            DRILL_NS, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}"
        ).items
        assert [o.kind for o in job.metadata.owner_references] == ["JobSet"]
        assert {p.metadata.labels["jobset.sigs.k8s.io/jobset-name"] for p in pods} == {name}
        assert made["Service"] == [name]
    elif kind.id == "pytorchjob":
        roles = sorted(p.metadata.labels["training.kubeflow.org/replica-type"] for p in pods)
        assert roles == ["master"] + ["worker"] * (len(pods) - 1)
        assert len(made["Service"]) == len(pods)  # one per pod
    else:
        types = sorted(p.metadata.labels["ray.io/node-type"] for p in pods)
        assert types == ["head"] + ["worker"] * (len(pods) - 1)
        (cluster,) = made["raycluster"]
        rc = _custom(member).get_namespaced_custom_object(
            "ray.io", "v1", DRILL_NS, "rayclusters", cluster
        )
        assert [o["kind"] for o in rc["metadata"]["ownerReferences"]] == ["RayJob"]
        assert rc["status"]["state"] == "ready"


# --- run and status ------------------------------------------------------------------------------


@by_kind
def test_a_workload_runs_under_its_operator_and_its_status_comes_back(e2e: E2E, kind: Kind) -> None:
    hub = e2e.hub
    name = unique(kind.id)
    submitted = time.monotonic()
    placement = {"gpuProducts": [kind.product]}
    uid = hub.submit(name, kind.template(2, run_for="10s"), placement=placement)["metadata"]["uid"]
    st = _running_condition(hub, name) if kind.done is None else hub.wait_phase(name, "Running")
    running_s = time.monotonic() - submitted
    assert st["phase"] == "Running"
    assert st["cluster"] == kind.member
    member = e2e.members[st["cluster"]]
    pods = _check_pods_made_by_the_operator_where_placed(e2e, st, uid, kind, 2)
    _check_what_the_operator_made(member, kind, name, pods)
    made = _summary(_objects(member, kind, name))
    if kind.id == "pytorchjob":
        st = _running_condition(hub, name, 30)
        assert _conditions(st)["Created"][1] == "PyTorchJobCreated"
    if kind.id == "rayjob":
        own = kind.get(member, name)
        assert own is not None
        assert own["status"]["jobDeploymentStatus"] == "Running"
    if kind.done is not None:
        st = hub.wait_phase(name, "Succeeded", timeout_s=60)
        # the operator's own condition, mirrored as it wrote it
        cond, want = kind.done
        assert _conditions(st)[cond] == want
    if kind.id == "jobset":
        own = kind.get(member, name)
        assert own is not None
        assert own["status"]["terminalState"] == "Completed"
    print(
        f"{kind.id} submit->Running {running_s:.1f}s; member objects {made}; hub conditions "
        f"{_conditions(st)}; counts {[st.get(k) for k in ('active', 'succeeded', 'failed')]}"
    )


# --- deletion ------------------------------------------------------------------------------------


@by_kind
def test_deleting_the_gpujob_leaves_none_of_the_operators_children(e2e: E2E, kind: Kind) -> None:
    hub = e2e.hub
    name = unique(f"{kind.id}-del")
    placement = {"gpuProducts": [kind.product]}
    uid = hub.submit(name, kind.template(2), placement=placement)["metadata"]["uid"]
    st = _running_condition(hub, name) if kind.done is None else hub.wait_phase(name, "Running")
    member = e2e.members[st["cluster"]]
    _check_pods_made_by_the_operator_where_placed(e2e, st, uid, kind, 2)
    made = _summary(_objects(member, kind, name))
    assert {kind.id, "Pod", "Service"} <= set(made), made

    hub.delete(name)
    wait_until(lambda: hub.job(name) is None, "the GPUJob gone")
    wait_until(
        lambda: not _objects(member, kind, name),
        f"the {kind.id} and its Jobs, pods, Services (RayCluster, submitter Job) gone",
    )


# --- preemption ----------------------------------------------------------------------------------


@pytest.fixture
def classes(e2e: E2E) -> Iterator[E2E]:
    """PriorityClasses e2e-low, e2e-mid, e2e-high on the hub cluster, removed afterwards."""
    with priority_classes(e2e.hub.api, CLASSES):
        try:
            yield e2e
        finally:
            e2e.hub.clear()


@by_kind
def test_a_preempted_workload_and_all_its_operator_made_are_gone_before_the_preemptor_starts(
    classes: E2E, kind: Kind
) -> None:
    """The member's GPUs of ``kind.product``: 2 pods' worth held by the low-priority victim of
    ``kind``, the rest by a mid-priority batch Job; a high-priority batch Job of 2 such pods
    can only run by preempting the victim (the lowest priority, the cheapest plan)."""
    e2e, hub = classes, classes.hub
    member = e2e.members[kind.member]
    # device-plugin GPUs only: us-east-hgx's DRA nodes take no nvidia.com/gpu pod
    total = sum(
        int((n.status.allocatable or {}).get("nvidia.com/gpu", "0"))
        for n in member.core.list_node().items
        if (n.metadata.labels or {}).get(GPU_PRODUCT_LABEL) == kind.product
    )
    name = unique(f"{kind.id}-low")
    product = {"gpuProducts": [kind.product], "topology": {"nvlink": "None"}}
    uid = hub.submit(name, kind.template(2), placement={**product, "priorityClassName": "e2e-low"})[
        "metadata"
    ]["uid"]
    st = _running_condition(hub, name) if kind.done is None else hub.wait_phase(name, "Running")
    assert st["cluster"] == kind.member
    _check_pods_made_by_the_operator_where_placed(e2e, st, uid, kind, 2)
    rest = total // kind.gpus - 2
    hub.submit(
        "fill",
        batch_job(kind.gpus, pods=rest),
        placement={**product, "priorityClassName": "e2e-mid"},
    )
    hub.wait_phase("fill", "Running", timeout_s=90)
    # the premise: the filler fitted beside the victim (had it not, e2e-mid would have
    # preempted e2e-low, and the preemptor could later run in the room without preempting)
    before = hub.status(name)
    premise = {n: {"status": hub.status(n), "events": hub.events(n)} for n in (name, "fill")}
    assert before.get("phase") == "Running", premise
    assert not before.get("preemptions"), premise
    victim = _objects(member, kind, name)
    print(f"{kind.id} victim in {kind.member}: {_summary(victim)}")

    t0 = time.monotonic()
    high = hub.submit(
        "high",
        batch_job(kind.gpus, pods=2),
        placement={**product, "priorityClassName": "e2e-high"},
    )["metadata"]["uid"]
    overlaps: list[str] = []

    def preemptor_running() -> dict[str, Any] | None:
        if member.pods_of(high):
            left = _objects(member, kind, name)
            overlaps.extend(f"{o} beside the preemptor's pods" for o in left)
        s = hub.status("high")
        return s if s.get("phase") == "Running" else None

    st = wait_until(preemptor_running, "the preemptor Running", 120)
    running_s = time.monotonic() - t0
    assert not overlaps, overlaps
    assert _objects(member, kind, name) == []
    assert st["cluster"] == kind.member
    why = {  # what the hub says of the three, when the preemptor ran without a preemption
        n: {"status": hub.status(n), "events": hub.events(n)} for n in (name, "fill", "high")
    }
    assert "preemption" in st, why
    assert [v["job"] for v in st["preemption"]["victims"]] == [f"{DRILL_NS}/{name}"]
    vs = hub.wait_phase(name, "Pending", timeout_s=30)
    assert _conditions(vs)["Preempted"][0] == "True"
    assert vs["preemptions"] == 1
    assert hub.status("fill")["phase"] == "Running"
    print(f"{kind.id} preemption submit->Running {running_s:.1f}s")


# --- infrastructure re-run -----------------------------------------------------------------------


@by_kind
def test_a_workload_whose_node_is_deleted_is_re_run_after_its_old_copy_is_gone(
    e2e: E2E,
    kind: Kind,
    restore_nodes: list[tuple[str, str]],  # noqa: F811 (the fixture imported above)
) -> None:
    hub = e2e.hub
    name = unique(f"{kind.id}-node")
    uid = hub.submit(
        name,
        kind.template(2, run_for="20s"),
        placement={"gpuProducts": [kind.product], "retry": {"onInfrastructureFailure": 2}},
    )["metadata"]["uid"]
    st = _running_condition(hub, name) if kind.done is None else hub.wait_phase(name, "Running")
    member = e2e.members[st["cluster"]]
    pods = _check_pods_made_by_the_operator_where_placed(e2e, st, uid, kind, 2)
    current = kind.get(member, name)
    assert current is not None
    old_uid = current["metadata"]["uid"]
    # the node of the last GPU pod by name (a worker's: never the PyTorchJob's Master, never
    # the Ray head, which holds no GPU)
    gpu_pods = [
        p for p in pods if "nvidia.com/gpu" in (p.spec.containers[0].resources.limits or {})
    ]
    node = max(gpu_pods, key=lambda p: p.metadata.name).spec.node_name
    member.core.delete_node(node)
    restore_nodes.append((st["cluster"], node))

    # Watch the member: everything owned (transitively) by the old copy is old; once a new copy
    # exists nothing old may be left but pods on the deleted node (no kubelet there to confirm
    # them gone; the hub fences that node and the member's pod GC removes them later), as for a
    # batch/v1 Job (test_9_failures.py).
    old = {old_uid}
    overlaps: list[str] = []
    seen: list[str] = []  # the member when the new copy first showed (printed)
    stranded: list[str] = []  # the old copy's objects on the deleted node at that moment

    def new_copy_running() -> dict[str, Any] | None:
        objs = _objects(member, kind, name)
        for _ in range(4):  # RayJob -> RayCluster -> pod, JobSet -> Job -> pod: 2 levels
            old.update(o.uid for o in objs if old.intersection(o.owners))
        new = [o for o in objs if o.kind == kind.id and o.uid not in old]
        if new and not seen:
            seen.append(f"{_summary(objs)}; pods {_pod_phases(member, name)}")
            stranded.extend(str(o) for o in objs if o.uid in old and o.node == node)
        if new:
            overlaps.extend(
                f"{o} of the old copy beside the new one"
                for o in objs
                if o.uid in old and o.node != node
            )
        s = hub.status(name)
        assert s.get("phase") != "Failed", f"shown Failed in between: {s}"
        running = s.get("phase") == "Running" and (s.get("restarts") or 0) >= 1
        if kind.done is None:
            running = running and _conditions(s).get("Running", ("",))[0] == "True"
        return s if running and new else None

    st = wait_until(new_copy_running, f"the {kind.id} running again", 120)
    print(f"{kind.id} re-run: deleted {node}; member when the new copy showed: {seen}")
    assert not overlaps, overlaps
    if kind.id == "pytorchjob":
        # its pods carry no finalizer: the agent's force delete removed the old Worker before
        # the new copy was made (a Job's pods wait a moment for the Job controller to drop its
        # job-tracking finalizer; their names are random, so nothing waits on them)
        assert not stranded, stranded
    assert node not in _placed(st)
    assert [e["reason"] for e in st["restartHistory"]] == ["NodeLost"]
    # the old copy's pods on the deleted node were force-deleted by the agent before it acked
    # the Delete (gpufed.agent.stranded), so the PyTorchJob's new <job>-worker-0 can be made at
    # once (docs/agent.md "Real workload operators")
    _check_pods_made_by_the_operator_where_placed(e2e, st, uid, kind, 2, timeout_s=180)
    if kind.done is not None:
        st = hub.wait_phase(name, "Succeeded", timeout_s=90)
        assert st["restarts"] == 1
        cond, want = kind.done
        assert _conditions(st)[cond] == want
