"""Stranded pods (gpufed.agent.stranded): a deleted copy's pods bound to a Node that no longer
exists are force-deleted before ``Deleted`` is acked, so a re-run in the same member can create
pods of the same names (the training-operator's ``<job>-worker-0``); nothing else is touched."""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Mapping
from typing import Any

import pytest

from gpufed.agent.stranded import made_for, stranded_pods
from gpufed.agent.work import WorkManager
from gpufed.api.labels import DEFAULT_ORIGIN, JOB_UID_LABEL
from gpufed.api.work import WorkAck
from gpufed.sync.ownership import Owner

from .builders import apply_item, delete_item, gpu_job, gpu_pod, owned_by
from .fakes import FakeApiError, MemoryCluster, RecordingStatus

OWNER = Owner(DEFAULT_ORIGIN, "u1")


def operator_pod(
    name: str,
    node: str | None,
    *,
    labels: Mapping[str, str] | None = None,
    controller: bool = True,
    terminating: bool = False,
) -> dict[str, Any]:
    """A pod as an operator makes it from the copy's pod template: the template's labels (job
    u1 of this hub unless ``labels``) and a controller ownerReference (none if not
    ``controller``: a bare pod someone made)."""
    pod = gpu_pod(name, node, terminating=terminating)
    pod["metadata"]["labels"] = dict(owned_by("u1") if labels is None else labels)
    if controller:
        pod["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": "train",
                "uid": "ptj-1",
                "controller": True,
            }
        ]
    return pod


class Member(MemoryCluster):
    """The in-memory member plus pods and nodes, as :class:`gpufed.agent.stranded.PodClient`:
    a pod's delete with grace 0 removes it; the uid precondition is honoured (409)."""

    def __init__(self) -> None:
        super().__init__()
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: set[str] = set()
        self.pod_deletes: list[tuple[str, str]] = []
        self.fail_pod_deletes: FakeApiError | None = None
        self._uids = itertools.count(1)

    def add_pod(self, pod: dict[str, Any]) -> None:
        """Create a pod (409 when one of that name exists, as the API server answers)."""
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        if key in self.pods:
            raise FakeApiError(409, f'object is being deleted: pods "{key[1]}" already exists')
        stored = copy.deepcopy(pod)
        stored["metadata"]["uid"] = f"pod-uid-{next(self._uids)}"
        self.pods[key] = stored

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        self.calls.append(("list_pods", label_selector))
        needs = dict(r.split("=", 1) for r in label_selector.split(","))
        return [
            copy.deepcopy(p)
            for (ns, _), p in sorted(self.pods.items())
            if ns == namespace
            and all(p["metadata"].get("labels", {}).get(k) == v for k, v in needs.items())
        ]

    async def node_exists(self, name: str) -> bool:
        self.calls.append(("get_node", name))
        return name in self.nodes

    async def force_delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        if self.fail_pod_deletes is not None:
            raise self.fail_pod_deletes
        current = self.pods.get((namespace, name))
        if current is None:
            return False
        if current["metadata"]["uid"] != uid:
            return False  # 409: the uid precondition failed, another pod of that name
        self.pod_deletes.append((namespace, name))
        del self.pods[(namespace, name)]
        return True


class Harness:
    def __init__(self) -> None:
        self.api = Member()
        self.api.nodes = {"h100-001", "h100-002"}
        self.acks: list[WorkAck] = []
        self.pods_at_ack: list[set[str]] = []
        self.status = RecordingStatus()
        self.work = WorkManager(self.api, ack=self.ack, status=self.status, pods=self.api)

    def ack(self, ack: WorkAck) -> None:
        self.acks.append(ack)
        self.pods_at_ack.append({name for _, name in self.api.pods})


def test_only_the_copys_controller_made_pods_on_gone_nodes_are_stranded() -> None:
    """Each pod that differs from a stranded one in one respect is left: live node, not
    scheduled, another job, another hub, no origin label, no controller (a bare pod)."""
    pods = {
        "stranded": operator_pod("stranded", "gone-1"),
        "terminating": operator_pod("terminating", "gone-2", terminating=True),
        "live-node": operator_pod("live-node", "h100-001"),
        "unscheduled": operator_pod("unscheduled", None),
        "other-job": operator_pod("other-job", "gone-1", labels=owned_by("u2")),
        "other-hub": operator_pod("other-hub", "gone-1", labels=owned_by("u1", "hub-b")),
        "uid-only": operator_pod("uid-only", "gone-1", labels={JOB_UID_LABEL: "u1"}),
        "no-labels": operator_pod("no-labels", "gone-1", labels={}),
        "bare": operator_pod("bare", "gone-1", controller=False),
    }
    found = stranded_pods(pods.values(), OWNER, gone_nodes=["gone-1", "gone-2"])
    assert [p["metadata"]["name"] for p in found] == ["stranded", "terminating"]
    assert {n for n, p in pods.items() if made_for(p, OWNER)} == {
        "stranded",
        "terminating",
        "live-node",
        "unscheduled",
    }
    not_controller = operator_pod("x", "gone-1")
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    assert not made_for(not_controller, OWNER)


async def test_a_deleted_copys_pod_on_a_deleted_node_is_gone_before_deleted_is_acked() -> None:
    """The PyTorchJob re-run: the old copy's Worker is on a node deleted from the member; the
    Delete removes it (grace 0) before the ack, so the re-run's operator can create its pod of
    the same name at once; the Master on a live node and others' pods are left to the garbage
    collector and their owners."""
    h = Harness()
    h.work.submit(apply_item("u1", 1, gpu_job("u1", "train")))
    await h.work.idle()
    h.api.add_pod(operator_pod("train-master-0", "h100-001"))
    h.api.add_pod(operator_pod("train-worker-0", "h100-003", terminating=True))
    h.api.add_pod(operator_pod("other-worker-0", "h100-003", labels=owned_by("u2")))
    h.api.add_pod(operator_pod("bare-0", "h100-003", controller=False))
    h.work.submit(delete_item("u1", 2))
    await h.work.idle()
    assert h.acks[-1] == WorkAck(job_uid="u1", revision=2, result="Deleted")
    assert h.pods_at_ack[-1] == {"train-master-0", "other-worker-0", "bare-0"}
    assert h.api.pod_deletes == [("team-a", "train-worker-0")]
    assert sorted(n for op, n in h.api.calls if op == "get_node") == ["h100-001", "h100-003"]
    h.api.add_pod(operator_pod("train-worker-0", "h100-002"))  # the re-run's Worker: no 409


async def test_a_pod_replaced_under_the_same_name_is_not_deleted() -> None:
    """The uid precondition: a pod listed as stranded but replaced by a newer one of the same
    name before the delete is not deleted."""
    h = Harness()
    h.api.add_pod(operator_pod("train-worker-0", "h100-003"))
    real_list = h.api.list_pods

    async def list_then_replace(namespace: str, label_selector: str) -> list[dict[str, Any]]:
        listed = await real_list(namespace, label_selector)
        del h.api.pods[("team-a", "train-worker-0")]
        h.api.add_pod(operator_pod("train-worker-0", "h100-003"))
        return listed

    h.api.list_pods = list_then_replace  # type: ignore[method-assign]
    h.work.submit(delete_item("u1", 1))
    await h.work.idle()
    assert h.acks[-1].result == "Deleted"
    assert h.api.pod_deletes == []
    assert ("team-a", "train-worker-0") in h.api.pods


async def test_a_forbidden_pod_delete_still_acks_deleted_and_logs_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Best effort: an agent whose role lacks pod delete (an older RBAC) acks the Delete as
    before and says what to grant; the member's pod GC removes the pod later."""
    caplog.set_level(logging.WARNING)
    h = Harness()
    h.api.add_pod(operator_pod("train-worker-0", "h100-003"))
    h.api.fail_pod_deletes = FakeApiError(403, 'pods "train-worker-0" is forbidden')
    h.work.submit(delete_item("u1", 1))
    await h.work.idle()
    assert h.acks == [WorkAck(job_uid="u1", revision=1, result="Deleted")]
    [line] = [r.getMessage() for r in caplog.records if "work.stranded.failed" in r.getMessage()]
    assert "delete on pods" in line


async def test_without_a_pod_client_nothing_is_listed() -> None:
    h = Harness()
    h.work = WorkManager(h.api, ack=h.ack, status=h.status)
    h.api.add_pod(operator_pod("train-worker-0", "h100-003"))
    h.work.submit(delete_item("u1", 1))
    await h.work.idle()
    assert h.acks[-1].result == "Deleted"
    assert not any(op == "list_pods" for op, _ in h.api.calls)
