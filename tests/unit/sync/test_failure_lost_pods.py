"""Rule 4a of gpufed.sync.failure: a failed copy whose pods are gone, judged by the nodes its
own template pins it to and the words of its Failed condition; and template_pins read back
against gpufed.sync.manifests.pin_pod_template, which wrote the pins (an independent
writer, not the reader's own code)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpufed.api.work import Condition
from gpufed.sync.failure import NodeHealth, classify_failure
from gpufed.sync.manifests import PodSetPinning, pin_pod_template
from gpufed.sync.pins import Pins, template_pins

HEALTHY = {"n1": NodeHealth(ready=True, gpus=8), "n2": NodeHealth(ready=True, gpus=8)}


def failed(reason: str, message: str = "") -> Condition:
    return Condition(type="Failed", status="True", reason=reason, message=message)


BACKOFF = failed("BackoffLimitExceeded", "Job has reached the specified backoff limit")


def exited_pod(node: str, code: int) -> dict[str, Any]:
    """A pod that ran on ``node`` and exited ``code`` (not collected yet)."""
    return {
        "metadata": {"name": "p0"},
        "spec": {"nodeName": node},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "main", "state": {"terminated": {"exitCode": code, "reason": "Error"}}}
            ],
        },
    }


def cause_of(**kwargs: Any) -> tuple[str, str, tuple[str, ...]] | None:
    args: dict[str, Any] = {"phase": "Failed", "conditions": [BACKOFF], "pods": [], **kwargs}
    cause = classify_failure(**args)
    return None if cause is None else (cause.kind, cause.reason, cause.nodes)


def test_a_failed_copy_with_no_pod_left_and_its_pinned_node_gone_is_node_lost() -> None:
    """The backoffLimit-0 Job whose node was deleted while the agent was down: Failed
    (BackoffLimitExceeded), its pod collected, pinned to n9 which no longer exists."""
    cause = classify_failure(phase="Failed", conditions=[BACKOFF], nodes=HEALTHY, pinned=["n9"])
    assert cause is not None
    assert (cause.kind, cause.reason, cause.nodes) == ("Infrastructure", "NodeLost", ("n9",))
    assert "n9" in cause.message
    assert "no pod is left" in cause.message


@pytest.mark.parametrize(
    ("why", "kwargs", "expected"),
    [
        # the pinned node still exists: nothing says a node was lost
        ("node exists", {"nodes": HEALTHY, "pinned": ["n1"]}, "Application"),
        # the inventory is unknown: no verdict on nodes
        ("nodes unknown", {"nodes": None, "pinned": ["n9"]}, "Application"),
        # not pinned by name at all
        ("no pins", {"nodes": HEALTHY, "pinned": []}, "Application"),
        # a pod is still there: its exit code speaks (failed on its own, node deleted later,
        # the pod garbage collector not through yet)
        (
            "pod left with exit code",
            {"nodes": HEALTHY, "pinned": ["n9"], "pods": [exited_pod("n9", 1)]},
            "Application",
        ),
        # the Job's own words name the job's doing
        (
            "time limit",
            {"nodes": HEALTHY, "pinned": ["n9"], "conditions": [failed("DeadlineExceeded")]},
            "Application",
        ),
        (
            "policy on an exit code",
            {
                "nodes": HEALTHY,
                "pinned": ["n9"],
                "conditions": [
                    failed(
                        "PodFailurePolicy",
                        "Container main for pod team-a/train-x failed with exit code 42 "
                        "matching FailJob rule at index 0",
                    )
                ],
            },
            "Application",
        ),
        (
            "unknown reason",
            {"nodes": HEALTHY, "pinned": ["n9"], "conditions": [failed("Odd")]},
            "Application",
        ),
        (
            "no Failed condition",
            {"nodes": HEALTHY, "pinned": ["n9"], "conditions": []},
            "Application",
        ),
        # the Job's own words say a disrupted pod failed it
        (
            "policy on DisruptionTarget",
            {
                "nodes": HEALTHY,
                "pinned": ["n9"],
                "conditions": [
                    failed(
                        "PodFailurePolicy",
                        "Pod team-a/train-x has condition DisruptionTarget matching FailJob "
                        "rule at index 0",
                    )
                ],
            },
            "Infrastructure",
        ),
        (
            "per-index backoff",
            {"nodes": HEALTHY, "pinned": ["n9"], "conditions": [failed("FailedIndexes")]},
            "Infrastructure",
        ),
    ],
)
def test_only_a_lost_pod_the_member_cannot_explain_otherwise_is_node_lost(
    why: str, kwargs: dict[str, Any], expected: str
) -> None:
    got = cause_of(**kwargs)
    assert got is not None, why
    assert got[0] == expected, why


def test_a_running_copy_is_never_judged_by_its_template() -> None:
    assert classify_failure(phase="Running", conditions=[], nodes=HEALTHY, pinned=["n9"]) is None


def job(template_spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {"backoffLimit": 0, "template": {"metadata": {}, "spec": template_spec}},
    }


def pinned(
    obj: dict[str, Any], templates: list[dict[str, Any]], where: PodSetPinning
) -> dict[str, Any]:
    for t in templates:
        pin_pod_template(t, where)
    return obj


def test_template_pins_reads_what_pin_pod_template_wrote() -> None:
    # one node: by name
    one = job({"containers": [{"name": "main"}]})
    pin_pod_template(one["spec"]["template"], PodSetPinning(nodes=("n9",)))
    assert template_pins(one) == Pins(names=frozenset({"n9"}))
    # several nodes: by hostname label value
    many = job({"containers": [{"name": "main"}]})
    pin_pod_template(
        many["spec"]["template"],
        PodSetPinning(nodes=("n1", "n2"), hostnames={"n1": "h1", "n2": "h2"}),
    )
    assert template_pins(many) == Pins(hostnames=frozenset({"h1", "h2"}))
    # ANDed into the tenant's own terms (two ORed terms, both pinned)
    own = job(
        {
            "containers": [{"name": "main"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            },
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["b"]}
                                ]
                            },
                        ]
                    }
                }
            },
        }
    )
    pin_pod_template(own["spec"]["template"], PodSetPinning(nodes=("n9",)))
    assert template_pins(own).names == {"n9"}
    # a clique pin names no node; an unpinned template none either
    clique = job({"containers": [{"name": "main"}]})
    pin_pod_template(clique["spec"]["template"], PodSetPinning(nvlink_domains=("clique:c1",)))
    assert template_pins(clique) == Pins()
    assert template_pins(job({"containers": [{"name": "main"}]})) == Pins()


def test_template_pins_finds_nested_templates_of_any_kind() -> None:
    """A JobSet's replicated Jobs nest their pod templates two levels down."""
    template: dict[str, Any] = {"metadata": {}, "spec": {"containers": [{"name": "w"}]}}
    a, b = copy.deepcopy(template), copy.deepcopy(template)
    pin_pod_template(a, PodSetPinning(nodes=("n1",)))
    pin_pod_template(b, PodSetPinning(nodes=("n2",)))
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "spec": {
            "replicatedJobs": [
                {"name": "a", "template": {"spec": {"template": a}}},
                {"name": "b", "template": {"spec": {"template": b}}},
            ]
        },
    }
    assert template_pins(jobset).names == {"n1", "n2"}


def test_template_pins_never_raises_on_odd_input() -> None:
    odd: dict[str, Any] = {
        "spec": {"template": {"spec": {"affinity": {"nodeAffinity": ["x"]}}}, "x": [None, 3]}
    }
    assert template_pins(odd) == Pins()
    assert template_pins({"spec": None}) == Pins()
