"""Admission at intake: a GPUJob whose pods break its namespace's Pod Security level, that sits
in a reserved namespace, exposes a Service, or carries metadata a member would refuse fails at
once (phase Failed, ``Valid=False`` naming the field and the rule) and nothing reaches a member;
an admitted job's work carries the level, so the agent labels the member namespace alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufed.api.errors import FieldError
from gpufed.api.gpujob import GPUJob
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.term import WorkState
from gpufed.hub.rules.admission import AdmissionPolicy, admit
from gpufed.sync.manifests import prepare_manifests
from gpufed.sync.podsecurity import Level
from tests.unit.hub.builders import (
    batch_job,
    gpujob_obj,
    hgx_node,
    jobset,
    manifest_list,
    pytorchjob,
)
from tests.unit.hub.term import Term, sent, settle

EXAMPLES = Path(__file__).resolve().parents[3] / "manifests" / "examples"
POLICY = AdmissionPolicy(reserved_namespaces=HubConfig(insecure=True).refused_namespaces)


def refusal(
    template: dict[str, Any],
    *,
    level: Level = "baseline",
    namespace: str = "team-a",
    policy: AdmissionPolicy = POLICY,
) -> tuple[str, str] | None:
    """(field, message) of the refusal of ``template``, or None when it is admitted."""
    prepared = prepare_manifests(
        template, job_uid="u1", job_name="job", namespace=namespace, origin="hub"
    )
    try:
        admit(template, prepared, namespace=namespace, level=level, policy=policy)
    except FieldError as exc:
        return exc.field, exc.message
    return None


def privileged(template: dict[str, Any], path: str) -> dict[str, Any]:
    """``template`` with the first container of the pod template at ``path`` privileged."""
    node: Any = template
    for part in path.split(".")[2:]:
        name, _, idx = part.partition("[")
        node = node[name]
        if idx:
            node = node[int(idx.rstrip("]"))]
    node["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return template


PRIV = "spec.containers[0].securityContext.privileged"


@pytest.mark.parametrize(
    ("template", "pod_path"),
    [
        (batch_job(), "spec.template.spec.template"),
        (jobset(("w", 2, 1, 8)), "spec.template.spec.replicatedJobs[0].template.spec.template"),
        (pytorchjob(workers=1), "spec.template.spec.pytorchReplicaSpecs.Master.template"),
        (manifest_list(batch_job(name="a")), "spec.template.items[0].spec.template"),
    ],
    ids=["Job", "JobSet", "PyTorchJob", "List"],
)
def test_a_privileged_pod_of_every_workload_kind_is_refused_naming_its_field(
    template: dict[str, Any], pod_path: str
) -> None:
    got = refusal(privileged(template, pod_path))
    assert got is not None
    field, message = got
    assert field == f"{pod_path}.{PRIV}"
    assert "'baseline'" in message
    assert "Privileged Containers" in message


def test_the_namespace_level_decides_privileged_passes_and_restricted_is_stricter() -> None:
    pod_path = "spec.template.spec.template"
    assert refusal(privileged(batch_job(), pod_path), level="privileged") is None
    assert refusal(batch_job()) is None
    got = refusal(batch_job(), level="restricted")
    assert got is not None
    assert "'restricted'" in got[1]


@pytest.mark.parametrize(
    "namespace", ["kube-system", "kube-public", "kube-node-lease", "gpufed-system", "ops"]
)
def test_reserved_namespaces_are_refused(namespace: str) -> None:
    policy = AdmissionPolicy(reserved_namespaces=POLICY.reserved_namespaces | {"ops"})
    assert refusal(batch_job(), namespace=namespace, policy=policy) == (
        "metadata.namespace",
        f"{namespace!r} is reserved (the control plane's or gpufed's own); submit GPUJobs in a "
        "team's namespace",
    )


def service(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}, "spec": spec}


@pytest.mark.parametrize(
    ("svc", "field"),
    [
        (service(type="NodePort"), "spec.template.items[1].spec.type"),
        (service(type="LoadBalancer"), "spec.template.items[1].spec.type"),
        (service(externalIPs=["1.2.3.4"]), "spec.template.items[1].spec.externalIPs"),
    ],
)
def test_exposed_services_are_refused_unless_the_hub_allows_them(
    svc: dict[str, Any], field: str
) -> None:
    template = manifest_list(batch_job(name="a"), svc)
    got = refusal(template)
    assert got is not None
    assert got[0] == field
    allowing = AdmissionPolicy(POLICY.reserved_namespaces, allow_exposed_services=True)
    assert refusal(template, policy=allowing) is None
    assert refusal(manifest_list(batch_job(name="a"), service(type="ClusterIP"))) is None


@pytest.mark.parametrize(
    ("template", "field"),
    [
        (batch_job(name="j" * 64), "spec.template.metadata.name"),
        (
            manifest_list(batch_job(name="a"), service() | {"metadata": {"name": "1svc"}}),
            "spec.template.items[1].metadata.name",
        ),
        (
            batch_job() | {"metadata": {"name": "train", "labels": {"team": "x" * 64}}},
            "spec.template.metadata.labels[team]",
        ),
        (
            batch_job() | {"metadata": {"name": "train", "annotations": {"a": "x" * 262_144}}},
            "spec.template.metadata.annotations",
        ),
    ],
    ids=["job-name-64", "service-dns1035", "label-value-64", "annotations-256KiB"],
)
def test_what_a_member_would_refuse_is_refused_naming_the_field(
    template: dict[str, Any], field: str
) -> None:
    got = refusal(template)
    assert got is not None
    assert got[0] == field


def test_pod_template_labels_are_checked_too() -> None:
    template = batch_job()
    template["spec"]["template"]["metadata"] = {"labels": {"bad key": "v"}}
    got = refusal(template)
    assert got is not None
    assert got[0] == "spec.template.spec.template.metadata.labels[bad key]"


def test_the_default_name_of_a_job_is_checked_as_the_member_sees_it() -> None:
    """A template without a name takes the GPUJob's (up to 253 characters on the hub)."""
    template = batch_job(name=None)
    prepared = prepare_manifests(
        template, job_uid="u1", job_name="g" * 70, namespace="team-a", origin="hub"
    )
    with pytest.raises(FieldError) as err:
        admit(template, prepared, namespace="team-a", level="baseline", policy=POLICY)
    assert err.value.field == "spec.template.metadata.name"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_demo_example_passes_baseline(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or doc.get("kind") != "GPUJob":
            continue
        obj = GPUJob.model_validate(doc | {"metadata": doc["metadata"] | {"uid": "u1"}})
        assert refusal(obj.spec.template, namespace=obj.metadata.namespace or "default") is None


# --- through intake ------------------------------------------------------------------------------


def namespace_obj(name: str, level: str | None = None) -> dict[str, Any]:
    labels = {"pod-security.kubernetes.io/enforce": level} if level else {}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def valid_condition(t: Term, uid: str) -> tuple[str, str]:
    job = t.ctrl.state.jobs[uid]
    cond = next(c for c in job.status.conditions if c.type == "Valid")
    return cond.status, cond.message


async def submit(t: Term, uid: str, template: dict[str, Any]) -> None:
    obj = gpujob_obj(uid, uid, template=template)
    t.kube.objects["gpujobs"].append(obj)
    t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()


async def test_a_privileged_job_fails_at_once_and_nothing_reaches_the_member() -> None:
    t = Term()
    t.member("m1", hgx_node("n1"))
    s = t.connect("m1")
    sent(s)
    await submit(t, "bad", privileged(batch_job(), "spec.template.spec.template"))
    await t.ctrl.scheduler.cycle()
    await settle()
    job = t.ctrl.state.jobs["bad"]
    assert job.status.phase == "Failed"
    status, message = valid_condition(t, "bad")
    assert status == "False"
    assert message.startswith(f"spec.template.spec.template.{PRIV}:")
    assert "PodSecurity 'baseline'" in message
    assert sent(s) == []
    assert t.store.calls.count("place") == 0
    assert ("bad", "InvalidSpec", message) in t.kube.events


async def test_an_admitted_job_carries_its_namespace_level_to_the_member() -> None:
    t = Term()
    t.ctrl.intake.namespaces.on_event("MODIFIED", namespace_obj("team-a", "privileged"))
    t.member("m1", hgx_node("n1"))
    await submit(t, "ok", privileged(batch_job(), "spec.template.spec.template"))
    await t.ctrl.scheduler.cycle()
    await settle()
    ((work, _),) = t.store.work.values()
    assert work.pod_security == "privileged"
    assert WorkState("m1", work, 1).item().pod_security == "privileged"


async def test_a_job_in_a_namespace_not_seen_yet_waits_for_one_read_of_it() -> None:
    t = Term()
    t.kube.objects["namespaces"].append(namespace_obj("team-b", "restricted"))
    for uid in ("b1", "b2"):
        obj = gpujob_obj(uid, uid)
        obj["metadata"]["namespace"] = "team-b"
        t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()
    assert t.kube.namespace_reads == ["team-b"]
    assert t.ctrl.intake.namespaces.level("team-b") == "restricted"
    assert {t.ctrl.state.jobs[u].status.phase for u in ("b1", "b2")} == {"Failed"}
    assert "PodSecurity 'restricted'" in valid_condition(t, "b1")[1]


async def test_the_hub_default_level_applies_to_unlabelled_namespaces() -> None:
    t = Term(config=HubConfig(insecure=True, default_pod_security="restricted"))
    t.ctrl.intake.namespaces.on_event("ADDED", namespace_obj("team-c"))
    obj = gpujob_obj("c1", "c1")
    obj["metadata"]["namespace"] = "team-c"
    t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()
    assert t.ctrl.state.jobs["c1"].status.phase == "Failed"
    assert "PodSecurity 'restricted'" in valid_condition(t, "c1")[1]


async def test_an_already_placed_job_is_not_admitted_again() -> None:
    """A later, stricter namespace label never fails a job that was placed before it."""
    from gpufed.hub.rules.records import JobRecord

    t = Term()
    t.ctrl.intake.namespaces.on_event("MODIFIED", namespace_obj("team-a", "restricted"))
    t.ctrl.lifecycle.restore(
        {"p1": JobRecord(uid="p1", job="team-a/p1", cluster="m1", attempt=1, gpus=8)}, {"p1": 3}
    )
    await submit(t, "p1", batch_job())
    job = t.ctrl.state.jobs["p1"]
    assert job.error is None
    assert job.status.phase != "Failed"


def test_pods_the_hub_cannot_stop_are_refused_naming_the_field() -> None:
    """A hostile victim kept its GPUs from its preemptor for good: pods with a finalizer, or a
    grace period of 1e9 s, never left, and the preemptor waited on them forever."""
    grace = batch_job(terminationGracePeriodSeconds=1_000_000_000)
    assert refusal(grace) == (
        "spec.template.spec.template.spec.terminationGracePeriodSeconds",
        "1000000000 is above the hub's limit of 600 s: a stopping job holds GPUs another job "
        "waits for; checkpoint within that time",
    )
    assert refusal(batch_job(terminationGracePeriodSeconds=600)) is None
    fin = batch_job()
    fin["spec"]["template"]["metadata"] = {"finalizers": ["example.com/keep"]}
    field, _ = refusal(fin) or ("", "")
    assert field == "spec.template.spec.template.metadata.finalizers"
