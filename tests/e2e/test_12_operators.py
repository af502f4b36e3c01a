"""Real workload operators in the members (issue 28): a JobSet, a PyTorchJob and a RayJob
submitted as GPUJobs, run by the JobSet controller, the Kubeflow training-operator and KubeRay
that the example fleet runs as sandbox processes (``clusters[].operators``).

For each kind: placed, created in the member, its pods made by the operator (not by gpufed),
all in the placed member and each on a node the hub chose; the operator's own conditions and
the right phase mirrored on the hub; deleting the GPUJob leaves none of the operator's children
(Jobs, pods, Services, RayClusters). A JobSet whose node is deleted is re-run, the old copy and
everything it made gone before the new copy starts. A RayJob cannot finish here (nothing answers
the Ray dashboard): its RayCluster's head and GPU workers run in one member and the hub shows it
Running.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client as k8s

from gpufed.api.labels import SIM_DURATION_ANNOTATION
from tests.e2e.harness import DRILL_NS, E2E, H100, Member, unique, wait_until
from tests.e2e.test_9_failures import restore_nodes  # noqa: F401 (the fixture, shared)

# 420 s: run alone, the first test also waits for the session sandbox (with three operators,
# several minutes on a loaded 2-core machine)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

#: Where the example fleet runs each operator.
OPERATOR_MEMBER = {
    "jobset": "us-east-hgx",
    "training-operator": "us-east-hgx",
    "kuberay": "eu-nvl72",
}
H100_ONLY = {"gpuProducts": [H100]}


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


def _custom(member: Member) -> Any:
    return k8s.CustomObjectsApi(member.api)


def _get(member: Member, group: str, version: str, plural: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = _custom(member).get_namespaced_custom_object(
        group, version, DRILL_NS, plural, name
    )
    return obj


def _children(member: Member, label: str) -> dict[str, list[str]]:
    """Jobs, pods and Services of the drill namespace labelled ``label`` (a selector), by kind
    (kinds with none left out)."""
    found = {
        "Job": member.batch.list_namespaced_job(DRILL_NS, label_selector=label).items,
        "Pod": member.core.list_namespaced_pod(DRILL_NS, label_selector=label).items,
        "Service": member.core.list_namespaced_service(DRILL_NS, label_selector=label).items,
    }
    return {k: sorted(o.metadata.name for o in v) for k, v in found.items() if v}


def _placed(status: dict[str, Any]) -> set[str]:
    return {n for ps in status["placement"]["podSets"] for n in ps["nodes"]}


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c.get("reason", "")) for c in status.get("conditions") or []}


def _check_pods_made_by_the_operator_where_placed(
    e2e: E2E, st: dict[str, Any], uid: str, owner_kind: str, count: int
) -> list[Any]:
    """Every pod of the job is in the placed member, on a node the hub chose, made by the
    operator (owned by ``owner_kind``, never by gpufed directly); returns them."""
    member = e2e.members[st["cluster"]]
    pods = wait_until(
        lambda: p if len(p := member.pods_of(uid, running=True)) == count else None,
        f"{count} pods running",
        60,
    )
    for other, m in e2e.members.items():
        if other != st["cluster"]:
            assert m.pods_of(uid) == [], f"pods of one gang in two members ({other})"
    for p in pods:
        assert p.spec.node_name in _placed(st), (p.metadata.name, p.spec.node_name, _placed(st))
        assert [o.kind for o in p.metadata.owner_references or []] == [owner_kind]
    return pods


# --- JobSet --------------------------------------------------------------------------------------


def test_a_jobset_runs_under_the_jobset_controller_and_its_status_comes_back(e2e: E2E) -> None:
    hub = e2e.hub
    name = unique("js")
    submitted = time.monotonic()
    uid = hub.submit(name, jobset(2, 8, run_for="10s"), placement=H100_ONLY)["metadata"]["uid"]
    st = hub.wait_phase(name, "Running", timeout_s=60)
    running_s = time.monotonic() - submitted
    assert st["cluster"] == OPERATOR_MEMBER["jobset"]
    member = e2e.members[st["cluster"]]
    pods = _check_pods_made_by_the_operator_where_placed(e2e, st, uid, "Job", 2)
    # the Job the JobSet controller made, owned by the JobSet (not by gpufed)
    (job,) = member.batch.list_namespaced_job(
        DRILL_NS, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}"
    ).items
    assert [o.kind for o in job.metadata.owner_references] == ["JobSet"]
    assert {p.metadata.labels["jobset.sigs.k8s.io/jobset-name"] for p in pods} == {name}

    st = hub.wait_phase(name, "Succeeded", timeout_s=60)
    # the controller's own condition, mirrored as it wrote it
    assert _conditions(st)["Completed"] == ("True", "AllJobsCompleted")
    own = _get(member, "jobset.x-k8s.io", "v1alpha2", "jobsets", name)
    assert own["status"]["terminalState"] == "Completed"
    print(
        f"jobset submit->Running {running_s:.1f}s; member objects "
        f"{_children(member, f'jobset.sigs.k8s.io/jobset-name={name}')}; hub conditions "
        f"{_conditions(st)}; counts {[st.get(k) for k in ('active', 'succeeded', 'failed')]}"
    )


def test_deleting_a_jobset_gpujob_leaves_none_of_its_children(e2e: E2E) -> None:
    hub = e2e.hub
    name = unique("js-del")
    uid = hub.submit(name, jobset(2, 8), placement=H100_ONLY)["metadata"]["uid"]
    st = hub.wait_phase(name, "Running", timeout_s=60)
    member = e2e.members[st["cluster"]]
    _check_pods_made_by_the_operator_where_placed(e2e, st, uid, "Job", 2)
    label = f"jobset.sigs.k8s.io/jobset-name={name}"
    assert set(_children(member, label)) >= {"Job", "Pod"}

    def services() -> list[str]:
        # its headless Service is named after the JobSet and carries no JobSet label
        items = member.core.list_namespaced_service(DRILL_NS).items
        return [s.metadata.name for s in items if s.metadata.name == name]

    assert services() == [name]

    hub.delete(name)
    wait_until(lambda: hub.job(name) is None, "the GPUJob gone")
    wait_until(
        lambda: not _children(member, label) and not services(),
        "the JobSet's Jobs, pods and headless Service gone",
    )
    with pytest.raises(k8s.ApiException) as gone:
        _get(member, "jobset.x-k8s.io", "v1alpha2", "jobsets", name)
    assert gone.value.status == 404


def test_a_jobset_whose_node_is_deleted_is_re_run_after_its_old_copy_is_gone(
    e2e: E2E,
    restore_nodes: list[tuple[str, str]],  # noqa: F811 (the fixture imported above)
) -> None:
    hub = e2e.hub
    name = unique("js-node")
    uid = hub.submit(
        name,
        jobset(2, 8, run_for="20s"),
        placement={**H100_ONLY, "retry": {"onInfrastructureFailure": 2}},
    )["metadata"]["uid"]
    st = hub.wait_phase(name, "Running", timeout_s=60)
    member = e2e.members[st["cluster"]]
    pods = _check_pods_made_by_the_operator_where_placed(e2e, st, uid, "Job", 2)
    old_uid = _get(member, "jobset.x-k8s.io", "v1alpha2", "jobsets", name)["metadata"]["uid"]
    old_pods = {p.metadata.uid for p in pods}
    node = pods[0].spec.node_name
    member.core.delete_node(node)
    restore_nodes.append((st["cluster"], node))

    # Watch the member: once a new JobSet exists, nothing of the old one may be left but pods
    # on the deleted node (no kubelet there to confirm them gone; the hub fences that node and
    # the member's pod GC removes them later), as for a batch/v1 Job (test_9_failures.py).
    overlaps: list[str] = []

    def new_copy_running() -> dict[str, Any] | None:
        try:
            cur = _get(member, "jobset.x-k8s.io", "v1alpha2", "jobsets", name)
        except k8s.ApiException:
            cur = None
        if cur is not None and cur["metadata"]["uid"] != old_uid:
            jobs = member.batch.list_namespaced_job(
                DRILL_NS, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}"
            ).items
            owners = {j.metadata.owner_references[0].uid for j in jobs}
            if owners - {cur["metadata"]["uid"]}:
                overlaps.append("a Job of the old JobSet beside the new one")
            for p in member.pods_of(uid):
                if p.metadata.uid in old_pods and p.spec.node_name != node:
                    overlaps.append(f"old pod {p.metadata.name} on {p.spec.node_name}")
        s = hub.status(name)
        assert s.get("phase") != "Failed", f"shown Failed in between: {s}"
        return s if s.get("phase") == "Running" and (s.get("restarts") or 0) >= 1 else None

    st = wait_until(new_copy_running, "the JobSet running again", 90)
    assert not overlaps, overlaps
    assert node not in _placed(st)
    assert [e["reason"] for e in st["restartHistory"]] == ["NodeLost"]
    _check_pods_made_by_the_operator_where_placed(e2e, st, uid, "Job", 2)
    st = hub.wait_phase(name, "Succeeded", timeout_s=90)
    assert st["restarts"] == 1
    assert _conditions(st)["Completed"][0] == "True"


# --- PyTorchJob ----------------------------------------------------------------------------------


def test_a_pytorchjob_runs_under_the_training_operator_and_its_status_comes_back(
    e2e: E2E,
) -> None:
    hub = e2e.hub
    name = unique("ptj")
    submitted = time.monotonic()
    uid = hub.submit(name, pytorchjob(1, 8, run_for="10s"), placement=H100_ONLY)["metadata"]["uid"]
    st = hub.wait_phase(name, "Running", timeout_s=60)
    running_s = time.monotonic() - submitted
    assert st["cluster"] == OPERATOR_MEMBER["training-operator"]
    member = e2e.members[st["cluster"]]
    pods = _check_pods_made_by_the_operator_where_placed(e2e, st, uid, "PyTorchJob", 2)
    roles = sorted(p.metadata.labels["training.kubeflow.org/replica-type"] for p in pods)
    assert roles == ["master", "worker"]
    # the operator's Services (one per pod) exist while it runs
    label = f"training.kubeflow.org/job-name={name}"
    assert len(_children(member, label).get("Service", [])) == 2

    st = wait_until(
        lambda: (
            s if _conditions(s := hub.status(name)).get("Running", ("",))[0] == "True" else None
        ),
        "the operator's Running condition on the hub",
        30,
    )
    assert _conditions(st)["Created"][1] == "PyTorchJobCreated"
    st = hub.wait_phase(name, "Succeeded", timeout_s=60)
    assert _conditions(st)["Succeeded"] == ("True", "PyTorchJobSucceeded")
    print(
        f"pytorchjob submit->Running {running_s:.1f}s; member objects {_children(member, label)}; "
        f"hub conditions {_conditions(st)}; "
        f"counts {[st.get(k) for k in ('active', 'succeeded', 'failed')]}"
    )


def test_deleting_a_pytorchjob_gpujob_leaves_none_of_its_children(e2e: E2E) -> None:
    hub = e2e.hub
    name = unique("ptj-del")
    uid = hub.submit(name, pytorchjob(2, 8), placement=H100_ONLY)["metadata"]["uid"]
    st = hub.wait_phase(name, "Running", timeout_s=60)
    member = e2e.members[st["cluster"]]
    _check_pods_made_by_the_operator_where_placed(e2e, st, uid, "PyTorchJob", 3)
    label = f"training.kubeflow.org/job-name={name}"
    assert set(_children(member, label)) == {"Pod", "Service"}

    hub.delete(name)
    wait_until(lambda: hub.job(name) is None, "the GPUJob gone")
    wait_until(lambda: not _children(member, label), "the PyTorchJob's pods and Services gone")


def test_a_pytorchjob_whose_node_is_deleted_is_re_run_after_its_old_copy_is_gone(
    e2e: E2E,
    restore_nodes: list[tuple[str, str]],  # noqa: F811 (the fixture imported above)
) -> None:
    hub = e2e.hub
    name = unique("ptj-node")
    uid = hub.submit(
        name,
        pytorchjob(1, 8, run_for="20s"),
        placement={**H100_ONLY, "retry": {"onInfrastructureFailure": 2}},
    )["metadata"]["uid"]
    st = hub.wait_phase(name, "Running", timeout_s=60)
    member = e2e.members[st["cluster"]]
    pods = _check_pods_made_by_the_operator_where_placed(e2e, st, uid, "PyTorchJob", 2)
    old_uid = _get(member, "kubeflow.org", "v1", "pytorchjobs", name)["metadata"]["uid"]
    old_pods = {p.metadata.uid for p in pods}
    worker = next(p for p in pods if p.metadata.name.endswith("worker-0"))
    node = worker.spec.node_name
    member.core.delete_node(node)
    restore_nodes.append((st["cluster"], node))
    label = f"training.kubeflow.org/job-name={name}"
    overlaps: list[str] = []

    def new_copy_running() -> dict[str, Any] | None:
        try:
            cur = _get(member, "kubeflow.org", "v1", "pytorchjobs", name)
        except k8s.ApiException:
            cur = None
        if cur is not None and cur["metadata"]["uid"] != old_uid:
            services = member.core.list_namespaced_service(DRILL_NS, label_selector=label).items
            if any(s.metadata.owner_references[0].uid == old_uid for s in services):
                overlaps.append("a Service of the old PyTorchJob beside the new one")
            for p in member.pods_of(uid):
                if p.metadata.uid in old_pods and p.spec.node_name != node:
                    overlaps.append(f"old pod {p.metadata.name} on {p.spec.node_name}")
        s = hub.status(name)
        assert s.get("phase") != "Failed", f"shown Failed in between: {s}"
        return s if s.get("phase") == "Running" and (s.get("restarts") or 0) >= 1 else None

    st = wait_until(new_copy_running, "the PyTorchJob running again", 90)
    assert not overlaps, overlaps
    assert node not in _placed(st)
    assert [e["reason"] for e in st["restartHistory"]] == ["NodeLost"]
    st = hub.wait_phase(name, "Succeeded", timeout_s=90)
    assert st["restarts"] == 1
    assert _conditions(st)["Succeeded"] == ("True", "PyTorchJobSucceeded")


# --- RayJob --------------------------------------------------------------------------------------


def rayjob(workers: int, gpus: int) -> dict[str, Any]:
    """A RayJob whose RayCluster has a head (no GPU) and ``workers`` GPU workers."""

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


def _ray_objects(member: Member, name: str) -> dict[str, list[str]]:
    """What KubeRay made for RayJob ``name`` in the drill namespace: RayClusters, pods,
    Services and (submitter) Jobs whose names start with it (kinds with none left out)."""
    clusters = _custom(member).list_namespaced_custom_object(
        "ray.io", "v1", DRILL_NS, "rayclusters"
    )["items"]
    found = {
        "RayCluster": [c["metadata"]["name"] for c in clusters],
        "Pod": [p.metadata.name for p in member.core.list_namespaced_pod(DRILL_NS).items],
        "Service": [s.metadata.name for s in member.core.list_namespaced_service(DRILL_NS).items],
        "Job": [j.metadata.name for j in member.batch.list_namespaced_job(DRILL_NS).items],
    }
    out = {k: sorted(n for n in v if n.startswith(name)) for k, v in found.items()}
    return {k: v for k, v in out.items() if v}


def test_a_rayjob_runs_its_raycluster_in_one_member_and_deletes_cleanly(e2e: E2E) -> None:
    hub = e2e.hub
    name = unique("ray")
    submitted = time.monotonic()
    uid = hub.submit(name, rayjob(2, 4))["metadata"]["uid"]
    st = wait_until(
        lambda: (
            s if _conditions(s := hub.status(name)).get("Running", ("",))[0] == "True" else None
        ),
        "the RayJob Running on the hub (jobDeploymentStatus Running)",
        90,
    )
    running_s = time.monotonic() - submitted
    assert st["phase"] == "Running"
    assert st["cluster"] == OPERATOR_MEMBER["kuberay"]
    member = e2e.members[st["cluster"]]
    pods = _check_pods_made_by_the_operator_where_placed(e2e, st, uid, "RayCluster", 3)
    kinds = sorted(p.metadata.labels["ray.io/node-type"] for p in pods)
    assert kinds == ["head", "worker", "worker"]
    own = _get(member, "ray.io", "v1", "rayjobs", name)
    assert own["status"]["jobDeploymentStatus"] == "Running"
    (cluster,) = _ray_objects(member, name)["RayCluster"]
    rc = _get(member, "ray.io", "v1", "rayclusters", cluster)
    assert [o["kind"] for o in rc["metadata"]["ownerReferences"]] == ["RayJob"]
    assert rc["status"]["state"] == "ready"
    print(
        f"rayjob submit->Running {running_s:.1f}s; member objects {_ray_objects(member, name)}; "
        f"hub conditions {_conditions(st)}"
    )

    hub.delete(name)
    wait_until(lambda: hub.job(name) is None, "the GPUJob gone")
    wait_until(
        lambda: not any(_ray_objects(member, name).values()),
        "the RayCluster, its pods, Services and the submitter Job gone",
    )
