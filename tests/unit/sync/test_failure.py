"""Failure classification (gpufed.sync.failure) over recorded pod and Job statuses: which
failures are infrastructure (re-runnable) and which are the application's (final)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.api.work import Condition, FailureCause
from gpufed.sync.failure import (
    NodeHealth,
    classify_failure,
    exit_codes,
    suspicions,
    with_declared_exit_codes,
)

JOB_FAILED = Condition(
    type="Failed",
    status="True",
    reason="BackoffLimitExceeded",
    message="Job has reached the specified backoff limit",
)


def pod(
    name: str,
    phase: str,
    *,
    node: str = "n1",
    disruption: str | None = None,
    exit_code: int | None = None,
    last_exit_code: int | None = None,
) -> dict[str, Any]:
    """A pod as the API server returns it (the fields classification reads)."""
    status: dict[str, Any] = {"phase": phase, "conditions": []}
    if disruption:
        status["conditions"].append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": disruption,
                "message": f"{disruption} message",
            }
        )
    cs: dict[str, Any] = {"name": "trainer", "state": {"running": {}}}
    if exit_code is not None:
        cs["state"] = {"terminated": {"exitCode": exit_code, "reason": "Error"}}
    if last_exit_code is not None:
        cs["lastState"] = {"terminated": {"exitCode": last_exit_code}}
    status["containerStatuses"] = [cs]
    return {"metadata": {"name": name}, "spec": {"nodeName": node}, "status": status}


HEALTHY = {"n1": NodeHealth(ready=True, gpus=8), "n2": NodeHealth(ready=True, gpus=8)}

# (case, phase, conditions, pods, nodes, gpus_seen) -> (kind, reason, nodes) or None
CASES: list[tuple[str, str, list[Condition], list[dict[str, Any]], Any, Any, Any]] = [
    (
        "pod GC after the node was deleted",
        "Running",
        [],
        [pod("p0", "Failed", disruption="DeletionByPodGC"), pod("p1", "Running", node="n2")],
        HEALTHY,
        None,
        ("Infrastructure", "DeletionByPodGC", ("n1",)),
    ),
    (
        "kubelet graceful node shutdown",
        "Failed",
        [JOB_FAILED],
        [pod("p0", "Failed", disruption="TerminationByKubelet", exit_code=137)],
        HEALTHY,
        None,
        ("Infrastructure", "TerminationByKubelet", ("n1",)),
    ),
    (
        "NoExecute taint eviction (node unreachable)",
        "Running",
        [],
        [pod("p0", "Running", disruption="DeletionByTaintManager")],
        None,
        None,
        ("Infrastructure", "DeletionByTaintManager", ("n1",)),
    ),
    (
        "drain through the Eviction API",
        "Running",
        [],
        [pod("p0", "Running", disruption="EvictionByEvictionAPI")],
        None,
        None,
        ("Infrastructure", "EvictionByEvictionAPI", ("n1",)),
    ),
    (
        "the node of a running pod vanished",
        "Running",
        [],
        [pod("p0", "Running"), pod("p1", "Running", node="n2")],
        {"n2": NodeHealth(ready=True, gpus=8)},
        None,
        ("Infrastructure", "NodeLost", ("n1",)),
    ),
    (
        "the node of a running pod is NotReady",
        "Running",
        [],
        [pod("p0", "Running")],
        {"n1": NodeHealth(ready=False, gpus=8)},
        None,
        ("Infrastructure", "NodeNotReady", ("n1",)),
    ),
    (
        "a GPU dropped out of allocatable under a running pod",
        "Running",
        [],
        [pod("p0", "Running")],
        {"n1": NodeHealth(ready=True, gpus=7)},
        {"n1": 8},
        ("Infrastructure", "GPUUnavailable", ("n1",)),
    ),
    (
        "ordinary non-zero exit",
        "Failed",
        [JOB_FAILED],
        [pod("p0", "Failed", exit_code=1)],
        HEALTHY,
        {"n1": 8},
        ("Application", "BackoffLimitExceeded", ("n1",)),
    ),
    (
        "a finished pod on a node deleted afterwards is not an infrastructure failure",
        "Failed",
        [JOB_FAILED],
        [pod("p0", "Failed", exit_code=1)],
        {},
        {"n1": 8},
        ("Application", "BackoffLimitExceeded", ("n1",)),
    ),
    (
        "running well",
        "Running",
        [],
        [pod("p0", "Running"), pod("p1", "Running", node="n2")],
        HEALTHY,
        {"n1": 8, "n2": 8},
        None,
    ),
    (
        "succeeded is never a failure, even with a node gone",
        "Succeeded",
        [],
        [pod("p0", "Running")],
        {},
        None,
        None,
    ),
    (
        "pending pods, not bound yet",
        "Pending",
        [],
        [{"metadata": {"name": "p0"}, "spec": {}, "status": {"phase": "Pending"}}],
        {},
        None,
        None,
    ),
]


@pytest.mark.parametrize(
    ("phase", "conditions", "pods", "nodes", "seen", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_failure_cause_table(
    phase: str,
    conditions: list[Condition],
    pods: list[dict[str, Any]],
    nodes: Any,
    seen: Any,
    expected: Any,
) -> None:
    cause = classify_failure(
        phase=phase,  # type: ignore[arg-type]
        conditions=conditions,
        pods=pods,
        nodes=nodes,
        gpus_seen=seen,
    )
    got = None if cause is None else (cause.kind, cause.reason, cause.nodes)
    assert got == expected


def test_one_lost_pod_breaks_the_whole_gang_while_the_rest_still_run() -> None:
    """A 4-pod NVLink gang with one pod GC'd is broken as a whole: the cause comes while the
    member Job still says Running, naming only the node involved."""
    pods = [pod(f"p{i}", "Running", node=f"n{i}") for i in range(3)]
    pods.append(pod("p3", "Failed", node="n3", disruption="DeletionByPodGC"))
    cause = classify_failure(phase="Running", pods=pods, nodes=None)
    assert cause is not None
    assert (cause.kind, cause.nodes) == ("Infrastructure", ("n3",))


def test_exit_codes_read_state_then_last_state_skipping_zero() -> None:
    pods = [pod("a", "Failed", exit_code=0, last_exit_code=134), pod("b", "Failed", exit_code=3)]
    # a zero final state is no failure; lastState is only read when state is not terminated
    assert exit_codes(pods) == [3]
    assert exit_codes([pod("c", "Running", last_exit_code=134)]) == [134]


@pytest.mark.parametrize(
    ("codes", "declared", "kind"),
    [
        ((134,), (134, 139), "Infrastructure"),
        ((134, 1), (134,), "Application"),  # one ordinary exit keeps it the application's
        ((), (134,), "Application"),  # no exit code at all is never promoted
        ((134,), (), "Application"),
    ],
)
def test_declared_infrastructure_exit_codes(
    codes: tuple[int, ...], declared: tuple[int, ...], kind: str
) -> None:
    cause = FailureCause(kind="Application", reason="BackoffLimitExceeded", exit_codes=codes)
    out = with_declared_exit_codes(cause, declared)
    assert out.kind == kind
    if kind == "Infrastructure":
        assert out.reason == "InfrastructureExitCode"
        assert "infrastructureExitCodes" in out.message


def test_odd_input_never_raises() -> None:
    weird: list[dict[str, Any]] = [
        {"metadata": None, "spec": None, "status": {"conditions": ["x", None]}},
        {"status": {"containerStatuses": [None, {"state": {"terminated": {"exitCode": "9"}}}]}},
    ]
    assert classify_failure(phase="Failed", pods=weird, nodes={}) is not None


def test_node_evidence_is_only_what_kubernetes_saw_of_the_node() -> None:
    """The reasons that mark nodes suspect (hub and agent share them) are the node's own
    failures; what a tenant can cause (declared exit codes, a pressure eviction, a drain, a
    member-side preemption) re-runs the job but marks nothing. The constants spell the reasons
    Kubernetes writes into DisruptionTarget."""
    from gpufed.sync import failure as f

    assert {
        "NodeLost",
        "NodeNotReady",
        "GPUUnavailable",
        "DeletionByPodGC",
        "DeletionByTaintManager",
    } == f.NODE_EVIDENCE
    tenant_caused = {
        f.INFRASTRUCTURE_EXIT_CODE,
        f.TERMINATION_BY_KUBELET,
        f.EVICTION_BY_EVICTION_API,
        f.PREEMPTION_BY_SCHEDULER,
    }
    assert tenant_caused == {
        "InfrastructureExitCode",
        "TerminationByKubelet",
        "EvictionByEvictionAPI",
        "PreemptionByScheduler",
    }
    assert not tenant_caused & f.NODE_EVIDENCE


# --- Kubernetes' timing: a not-Ready node or a GPU drop is a suspicion for the grace period ---

T0 = 1_800_000_000.0  # when the trouble began (seconds since the epoch)
GRACE = 300.0


def not_ready_since(since: float) -> dict[str, NodeHealth]:
    return {"n1": NodeHealth(ready=False, gpus=8, not_ready_since=since)}


def test_a_20s_not_ready_blip_is_no_failure() -> None:
    """20 s into a NotReady spell, the job has no cause, only a suspicion with its deadline."""
    args: dict[str, Any] = {
        "pods": [pod("p0", "Running")],
        "nodes": not_ready_since(T0),
        "gpus_seen": {"n1": 8},
        "now": T0 + 20,
        "grace_s": GRACE,
    }
    assert classify_failure(phase="Running", **args) is None
    (s,) = suspicions(**args)
    assert (s.node, s.reason, s.since, s.deadline) == ("n1", "NodeNotReady", T0, T0 + GRACE)


def test_not_ready_past_the_grace_period_fails_with_node_not_ready() -> None:
    cause = classify_failure(
        phase="Running",
        pods=[pod("p0", "Running")],
        nodes=not_ready_since(T0),
        now=T0 + GRACE,
        grace_s=GRACE,
    )
    assert cause is not None
    assert (cause.kind, cause.reason, cause.nodes) == ("Infrastructure", "NodeNotReady", ("n1",))
    assert (
        suspicions(
            pods=[pod("p0", "Running")],
            nodes=not_ready_since(T0),
            gpus_seen={},
            now=T0 + GRACE,
            grace_s=GRACE,
        )
        == ()
    )


def test_a_10s_gpu_drop_is_no_failure_until_the_grace_period_passes() -> None:
    args: dict[str, Any] = {
        "pods": [pod("p0", "Running")],
        "nodes": {"n1": NodeHealth(ready=True, gpus=7)},
        "gpus_seen": {"n1": 8},
        "gpus_dropped_since": {"n1": T0},
        "grace_s": GRACE,
    }
    assert classify_failure(phase="Running", now=T0 + 10, **args) is None
    (s,) = suspicions(now=T0 + 10, **args)
    assert (s.node, s.reason) == ("n1", "GPUUnavailable")
    cause = classify_failure(phase="Running", now=T0 + GRACE + 1, **args)
    assert cause is not None
    assert cause.reason == "GPUUnavailable"


def test_disruption_target_fails_at_once_within_the_grace_period() -> None:
    cause = classify_failure(
        phase="Running",
        pods=[pod("p0", "Running", disruption="DeletionByTaintManager")],
        nodes=not_ready_since(T0),
        now=T0 + 1,
        grace_s=GRACE,
    )
    assert cause is not None
    assert cause.reason == "DeletionByTaintManager"


def test_a_pod_deleted_on_a_not_ready_node_fails_at_once() -> None:
    """The member gave up on the pod (it is being deleted): no need to wait."""
    deleting = pod("p0", "Running")
    deleting["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:05Z"
    cause = classify_failure(
        phase="Running", pods=[deleting], nodes=not_ready_since(T0), now=T0 + 5, grace_s=GRACE
    )
    assert cause is not None
    assert cause.reason == "NodeNotReady"


def test_grace_zero_keeps_the_immediate_verdict() -> None:
    cause = classify_failure(
        phase="Running",
        pods=[pod("p0", "Running")],
        nodes=not_ready_since(T0),
        now=T0 + 1,
        grace_s=0,
    )
    assert cause is not None
    assert cause.reason == "NodeNotReady"
    assert (
        suspicions(
            pods=[pod("p0", "Running")],
            nodes=not_ready_since(T0),
            gpus_seen={},
            now=T0 + 1,
            grace_s=0,
        )
        == ()
    )


def _pinned_pending(name: str, *terms: list[str] | None) -> dict[str, Any]:
    """A Pending pod not bound yet whose required node affinity has one term per entry: a
    ``metadata.name In`` pin to those nodes, or (None) a term that pins nothing by name."""
    p = pod(name, "Pending", node="")
    p["spec"] = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": t}]}
                        if t is not None
                        else {
                            "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]
                        }
                        for t in terms
                    ]
                }
            }
        }
    }
    return p


def test_new_pods_pinned_to_a_deleted_node_are_node_lost() -> None:
    # issue 24 item 3: an agent restarted after the pods of a deleted node were collected
    # sees only their replacements, pinned to the gone node and Pending forever.
    cause = classify_failure(phase="Running", pods=[_pinned_pending("p0", ["n9"])], nodes=HEALTHY)
    assert cause is not None
    assert (cause.kind, cause.reason, cause.nodes) == ("Infrastructure", "NodeLost", ("n9",))
    # pinned to a node that exists (it is just busy): no failure
    assert (
        classify_failure(phase="Running", pods=[_pinned_pending("p0", ["n1"])], nodes=HEALTHY)
        is None
    )
    # another term lets it go elsewhere: no failure
    assert (
        classify_failure(phase="Running", pods=[_pinned_pending("p0", ["n9"], None)], nodes=HEALTHY)
        is None
    )
    # the nodes unknown (inventory not synced): no verdict
    assert classify_failure(phase="Running", pods=[_pinned_pending("p0", ["n9"])]) is None
