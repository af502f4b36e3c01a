"""place(): member filters, outcomes, scores, ties, explanations and the Decision contract."""

from __future__ import annotations

import pytest
from placement_builders import (
    H100,
    gpus_on,
    hgx_cluster,
    job,
    member,
    node,
    nvl72_cluster,
)
from pydantic import ValidationError

from gpufed.api.decision import Decision, Outcome, Reservation
from gpufed.api.inventory import ClusterHealth, Taint, Toleration
from gpufed.api.request import LabelSelector, PlacementRequest, PodSet
from gpufed.placement import (
    FleetSnapshot,
    Hold,
    Policy,
    ScoreWeights,
    explain,
    place,
    render_explanation,
)

POLICY = Policy()


def fingerprint(s: FleetSnapshot) -> object:
    """Everything observable about a snapshot: free per node and resource, ledger, health."""
    out = []
    for c in s.cluster_names:
        st = s.member(c)
        for n in st.inventory.nodes:
            out.append((c, n.name, tuple(s.free(c, n.name, r) for r in sorted(n.allocatable))))
        out.append((c, st.health.ready))
    return (out, [r.model_dump() for r in s.reservations()])


def test_unready_member_is_skipped_and_the_job_waits_not_rejected() -> None:
    s = FleetSnapshot([hgx_cluster("a", ready=False)])
    d = place(job(gpus=8), s, POLICY, 0)
    assert d.outcome == Outcome.UNSCHEDULABLE
    assert d.rejections[0].plugin == "Health"
    assert "NotReady" in d.rejections[0].reason
    s.set_health("a", ClusterHealth(ready=True))
    assert place(job(gpus=8), s, POLICY, 0).cluster == "a"


def test_job_no_member_could_ever_hold_is_rejected_even_while_a_member_is_down() -> None:
    s = FleetSnapshot([hgx_cluster("a"), hgx_cluster("b-down", ready=False)])
    d = place(job(gpus=16), s, POLICY, 0)
    assert d.outcome == Outcome.REJECTED
    down = next(r for r in d.rejections if r.cluster == "b-down")
    assert down.plugin == "Health"
    assert down.code == "UnschedulableAndUnresolvable"
    assert "could never hold the job" in down.reason


def test_a_member_with_another_pool_that_could_fit_keeps_the_job_waiting() -> None:
    # one pool of small nodes (never), one pool of full 8-GPU nodes (not now)
    s = FleetSnapshot(
        [
            member(
                "a",
                [
                    node("a-small", gpus=4, product="NVIDIA-L40S"),
                    node("a-big", gpus=8, free=0),
                ],
            )
        ]
    )
    assert place(job(gpus=8), s, POLICY, 0).outcome == Outcome.UNSCHEDULABLE


def test_empty_fleet_waits_for_members() -> None:
    d = place(job(gpus=1), FleetSnapshot(), POLICY, 0)
    assert d.outcome == Outcome.UNSCHEDULABLE
    assert "no member clusters yet" in d.message


def test_member_without_reported_nodes_waits_rather_than_rejects() -> None:
    s = FleetSnapshot([member("a", [])])
    d = place(job(gpus=1), s, POLICY, 0)
    assert d.outcome == Outcome.UNSCHEDULABLE
    s.upsert_node("a", node("a-n0"))
    assert place(job(gpus=1), s, POLICY, 0).placed


def test_member_that_does_not_serve_the_workload_kind_is_filtered() -> None:
    s = FleetSnapshot(
        [
            hgx_cluster("a-jobs-only", free=[1]),
            hgx_cluster("b-jobset", kinds=frozenset({"Job.batch", "JobSet.jobset.x-k8s.io"})),
        ]
    )
    d = place(job(gpus=1, kind="JobSet.jobset.x-k8s.io"), s, POLICY, 0, explain=True)
    assert d.cluster == "b-jobset"
    [r] = d.rejections
    assert (r.cluster, r.plugin, r.code) == (
        "a-jobs-only",
        "WorkloadKind",
        "UnschedulableAndUnresolvable",
    )


def test_cluster_selector_and_member_taints() -> None:
    s = FleetSnapshot(
        [
            hgx_cluster("a-eu", labels={"region": "eu"}, free=[1]),
            hgx_cluster("b-us", labels={"region": "us"}),
            hgx_cluster(
                "c-us-tainted",
                labels={"region": "us"},
                free=[1],
                taints=[Taint(key="maint", effect="NoSchedule")],
            ),
        ]
    )
    sel = LabelSelector(matchLabels={"region": "us"})
    d = place(job(gpus=1, selector=sel), s, POLICY, 0, explain=True)
    assert d.cluster == "b-us"
    reasons = {r.cluster: r.plugin for r in d.rejections}
    assert reasons == {"a-eu": "ClusterSelector", "c-us-tainted": "ClusterTaints"}
    tol = [Toleration(key="maint", operator="Exists")]
    assert place(job(gpus=1, selector=sel, tolerations=tol), s, POLICY, 0).cluster == "c-us-tainted"


def test_ties_break_by_member_name() -> None:
    s = FleetSnapshot([hgx_cluster(n, free=[8, 0]) for n in ("c", "a", "b")])
    d = place(job(gpus=8), s, POLICY, 0, explain=True)
    assert d.cluster == "a"
    assert d.cluster_scores == {"a": d.score, "b": d.score, "c": d.score}


def test_binpack_prefers_the_fuller_member_and_spread_the_emptier() -> None:
    fleet = [hgx_cluster("a-empty", free=[8, 8, 8, 8]), hgx_cluster("b-full", free=[8, 0, 0, 0])]
    s = FleetSnapshot(fleet)
    assert place(job(gpus=8), s, POLICY, 0).cluster == "b-full"
    assert place(job(gpus=8), s, Policy(allocation="spread"), 0).cluster == "a-empty"


def test_weights_are_configurable() -> None:
    # a-holes has a tight 1-GPU hole but is emptier; b-fuller has only an idle node left
    s = FleetSnapshot(
        [hgx_cluster("a-holes", free=[1, 8, 8, 8]), hgx_cluster("b-fuller", free=[8, 0, 0, 0])]
    )
    assert place(job(gpus=1), s, POLICY, 0).cluster == "a-holes"
    pack_only = Policy(
        weights=ScoreWeights(nvlink_fit=0, allocation=1, topology=0, topology_cost=0)
    )
    assert place(job(gpus=1), s, pack_only, 0).cluster == "b-fuller"


def test_weights_must_not_all_be_zero() -> None:
    with pytest.raises(ValidationError, match="at least one"):
        ScoreWeights(nvlink_fit=0, allocation=0, topology=0, topology_cost=0)


def test_preferred_nvlink_scores_one_domain_above_several() -> None:
    # both members are an exact fit (no stranded GPUs, full after placement); only the NVL72
    # clique keeps all four pods in one NVLink domain
    s = FleetSnapshot(
        [hgx_cluster("a-hgx", free=[4, 4, 4, 4]), nvl72_cluster("b-nvl", free=[[4] * 4 + [0] * 14])]
    )
    d = place(job(gpus=4, pods=4, nvlink="Preferred"), s, POLICY, 0, explain=True)
    assert d.cluster == "b-nvl"
    parts = {c.cluster: c.parts["TopologyLocality"] for c in d.scores}
    assert parts == {"a-hgx": 0.0, "b-nvl": 100.0}


def test_explanation_lists_every_member_with_plugin_and_reason() -> None:
    s = FleetSnapshot(
        [
            hgx_cluster("a", free=[8]),
            hgx_cluster("b", free=[1, 1]),
            hgx_cluster("c", product="NVIDIA-H200"),
            hgx_cluster("d", ready=False),
        ]
    )
    d = explain(job(gpus=8, products=[H100]), s, POLICY, 5.0)
    assert d.explained
    assert d.cluster == "a"
    assert d.decided_at == 5.0
    assert {r.cluster: r.plugin for r in d.rejections} == {
        "b": "ResourceFit",
        "c": "GPUProduct",
        "d": "Health",
    }
    text = render_explanation(d)
    for word in ("Placed on a", "ResourceFit", "GPUProduct", "Health", "NotReady", "NVLinkBestFit"):
        assert word in text


def test_fast_path_explanation_is_lazy() -> None:
    s = FleetSnapshot([hgx_cluster("a"), hgx_cluster("b", product="NVIDIA-H200")])
    d = place(job(gpus=8, products=[H100]), s, POLICY, 0)
    assert d.placed
    assert not d.explained
    assert d.rejections == ()
    assert "explain" in render_explanation(d)


def test_unschedulable_decision_always_carries_its_reasons() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[1, 1, 0, 0])])
    d = place(job(gpus=8), s, POLICY, 0)
    assert d.outcome == Outcome.UNSCHEDULABLE
    assert d.explained
    assert d.rejections[0].code == "Unschedulable"


def test_decision_round_trips_through_json_and_reserves() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8, 8])])
    d = place(job(gpus=8, pods=2), s, POLICY, 1.0)
    again = Decision.model_validate_json(d.model_dump_json())
    assert again == d
    res = Reservation.from_decision(again, now=1.0, ttl_s=60)
    assert res.totals()["nvidia.com/gpu"] == 16


def test_placed_decision_requires_cluster_and_pod_sets() -> None:
    with pytest.raises(ValidationError, match="Placed decision needs"):
        Decision(job="j", uid="u", outcome=Outcome.PLACED)


def test_place_does_not_mutate_the_snapshot() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8, 3, 1]), nvl72_cluster("b")])
    before = fingerprint(s)
    for j in (job(gpus=1), job(gpus=4, pods=4, nvlink="Required"), job(gpus=16)):
        place(j, s, POLICY, 0)
        explain(j, s, POLICY, 0)
    assert fingerprint(s) == before
    assert s.verify_indexes() == []


def test_same_input_same_output_whatever_the_build_order() -> None:
    fleet = [
        hgx_cluster("a", free=[3, 8, 1, 5]),
        nvl72_cluster("b", cliques=2),
        hgx_cluster("c", free=[2, 2]),
    ]
    forward = FleetSnapshot(fleet)
    backward = FleetSnapshot()
    for st in reversed(fleet):
        backward.set_member(
            st.model_copy(
                update={
                    "inventory": st.inventory.model_copy(
                        update={"nodes": tuple(reversed(st.inventory.nodes))}
                    )
                }
            )
        )
    for j in (
        job(gpus=1),
        job(gpus=2, pods=3, nvlink="None"),
        job(gpus=4, pods=5, nvlink="Required"),
    ):
        a, b = place(j, forward, POLICY, 0), place(j, backward, POLICY, 0)
        assert a.model_dump() == b.model_dump()
        assert a.model_dump() == place(j, forward, POLICY, 0).model_dump()


def test_holds_keep_a_job_off_held_nodes_or_members() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8, 8]), hgx_cluster("b", free=[8, 8, 8])])
    d = place(job(gpus=8), s, POLICY, 0, hold={"a": Hold("a", frozenset({"a-n000"}), "x")})
    assert gpus_on(d) == {"a-n001": 8}
    whole = {"a": Hold("a", frozenset(), "held for ns/big"), "b": Hold("b", frozenset(), "held")}
    d = place(job(gpus=8), s, POLICY, 0, hold=whole)
    assert d.outcome == Outcome.UNSCHEDULABLE
    assert {r.plugin for r in d.rejections} == {"Backfill"}
    nodes = {"a": Hold("a", frozenset({"a-n000", "a-n001"}), "x")}
    d = place(job(gpus=8, selector=LabelSelector(matchLabels={"x": "y"})), s, POLICY, 0, hold=nodes)
    assert d.outcome == Outcome.REJECTED


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"job": "j", "uid": "u", "pod_sets": []}, "pod_sets"),
        ({"job": "j", "uid": "u", "pod_sets": [{"count": 0}]}, "pod_sets.0.count"),
        (
            {
                "job": "j",
                "uid": "u",
                "pod_sets": [{"count": 1, "requests": {"nvidia.com/gpu": -1}}],
            },
            "pod_sets.0.requests",
        ),
        (
            {"job": "j", "uid": "u", "pod_sets": [{"count": 1}], "topology": {"nvlink": "Always"}},
            "topology.nvlink",
        ),
        (
            {"job": "j", "uid": "u", "pod_sets": [{"count": 1}, {"count": 1}]},
            "pod_sets",
        ),
    ],
)
def test_malformed_requests_fail_validation_naming_the_field(
    payload: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError) as err:
        PlacementRequest.model_validate(payload)
    locs = {".".join(str(p) for p in e["loc"]) for e in err.value.errors()}
    assert any(loc.startswith(field) for loc in locs), locs


def test_pod_set_shape_is_unchanged_by_unknown_resources_but_they_must_exist_on_nodes() -> None:
    s = FleetSnapshot([hgx_cluster("a")])
    d = place(job(requests={"nvidia.com/gpu": 1, "example.com/fpga": 1}), s, POLICY, 0)
    assert d.outcome == Outcome.REJECTED
    assert "example.com/fpga" in d.message


def test_pod_sets_of_one_job_share_the_member() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8, 0]), hgx_cluster("b", free=[8, 4])])
    two = job(gpus=8, extra_sets=[PodSet(name="helper", count=1, requests={"nvidia.com/gpu": 4})])
    d = place(two, s, POLICY, 0)
    assert d.cluster == "b"
    assert {ps.name: ps.nodes for ps in d.pod_sets} == {
        "main": {"b-n000": 1},
        "helper": {"b-n001": 1},
    }


def test_gpu_pod_sets_that_only_fit_apart_are_rejected_not_queued_forever() -> None:
    # each pod set fits the member's 16 GPUs alone (2 x 8, 1 x 8), together they need 24
    s = FleetSnapshot([hgx_cluster("a", nodes=2)])
    both = job(
        gpus=8, pods=2, extra_sets=[PodSet(name="ps", count=1, requests={"nvidia.com/gpu": 8})]
    )
    d = place(both, s, POLICY, 0)
    assert d.outcome == Outcome.REJECTED
    assert "need 24 GPUs together" in d.message
    assert "have 16" in d.message


def test_single_pod_with_a_required_rack_on_nodes_without_rack_labels_is_rejected() -> None:
    s = FleetSnapshot([hgx_cluster("a", nodes=2)])  # no rack labels
    d = place(job(gpus=8, rack="Required"), s, POLICY, 0)
    assert d.outcome == Outcome.REJECTED
    assert "rack" in d.message
    # with rack labels it is placed
    s = FleetSnapshot([hgx_cluster("a", nodes=2, rack_size=2)])
    assert place(job(gpus=8, rack="Required"), s, POLICY, 0).placed


def test_single_pod_with_a_required_rack_names_the_rack_when_labelled_nodes_are_full() -> None:
    unlabelled = node("a-free", free=8)
    labelled = node("a-busy", free=0, rack="r1")
    s = FleetSnapshot([member("a", [unlabelled, labelled])])
    d = place(job(gpus=8, rack="Required"), s, POLICY, 0)
    assert d.outcome == Outcome.UNSCHEDULABLE
    assert "no rack of" in d.message, d.message


@pytest.mark.parametrize(
    ("expression", "field"),
    [
        ({"key": "region", "operator": "In", "values": []}, "values"),
        ({"key": "region", "operator": "NotIn"}, "values"),
        ({"key": "region", "operator": "Exists", "values": ["eu"]}, "values"),
        ({"key": "region", "operator": "DoesNotExist", "values": ["eu"]}, "values"),
        ({"key": "", "operator": "Exists"}, "key"),
    ],
)
def test_malformed_cluster_selector_expressions_fail_validation(
    expression: dict[str, object], field: str
) -> None:
    payload = {
        "job": "ns/j",
        "uid": "u",
        "pod_sets": [{"count": 1}],
        "cluster_selector": {"matchExpressions": [expression]},
    }
    with pytest.raises(ValidationError, match=field):
        PlacementRequest.model_validate(payload)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"job": "ns/j", "uid": "", "pod_sets": [{"count": 1}]}, "uid"),
        ({"job": "", "uid": "u", "pod_sets": [{"count": 1}]}, "job"),
        ({"job": "ns/j", "uid": "u", "pod_sets": [{"name": "", "count": 1}]}, "pod_sets.0.name"),
    ],
)
def test_empty_job_uid_and_pod_set_names_fail_validation(
    payload: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError) as err:
        PlacementRequest.model_validate(payload)
    locs = {".".join(str(p) for p in e["loc"]) for e in err.value.errors()}
    assert field in locs, locs


def test_equal_scores_in_two_pools_of_one_member_tie_the_same_way_whatever_ran_before() -> None:
    # H100 pool: 3 x 1 GPU on a node with 6 free; H200 pool: on the idle node; both score the
    # same. The winner must not depend on which plans earlier calls left in the memo: ties go
    # by member name, then pool (product, MIG mode, taints)
    nodes = [
        node("a1", free=6),
        node("a2", free=6),
        node("b1", free=0, product="NVIDIA-H200"),
        node("b2", free=8, product="NVIDIA-H200"),
    ]
    req = job(gpus=1, pods=3, nvlink="None")
    fresh = explain(req, FleetSnapshot([member("m", nodes)]), POLICY, 0)
    s = FleetSnapshot([member("m", nodes)])
    answers = [place(req, s, POLICY, 0), explain(req, s, POLICY, 0), place(req, s, POLICY, 0)]
    for d in [fresh, *answers]:
        assert d.gpu_product == H100
        assert gpus_on(d) == {"a1": 3}


def test_a_rejection_headline_says_which_filters_turned_every_member_away() -> None:
    # From a user's report: a short product name ("GB200") matched no member, and the headline
    # read like a capacity problem of the first member alone.
    s = FleetSnapshot([hgx_cluster("a"), hgx_cluster("b"), hgx_cluster("c")])
    d = place(job(gpus=4, pods=2, products=["GB200"]), s, POLICY, 0)
    assert d.outcome == Outcome.REJECTED
    plugins = {r.plugin for r in d.rejections}
    assert len(plugins) == 1
    assert f"(all 3 members rejected: {plugins.pop()} 3)" in d.message


def test_a_fleet_whose_nodes_are_all_not_ready_tainted_makes_the_job_wait_not_fail() -> None:
    # the chaos soak (issue 26, kwok-stop): every node of the fleet turned NotReady, the node
    # lifecycle controller tainted them node.kubernetes.io/not-ready:NoSchedule, and the hub
    # failed new jobs for ever ("no member cluster can ever hold this job"). The taint goes
    # when the node is Ready again: the job must wait.
    not_ready = Taint(key="node.kubernetes.io/not-ready", effect="NoSchedule")
    s = FleetSnapshot([hgx_cluster("a", node_kw={"taints": [not_ready]})])
    d = place(job(gpus=8), s, POLICY, 0)
    assert d.outcome == Outcome.UNSCHEDULABLE
    assert "node.kubernetes.io/not-ready" in d.rejections[0].reason
    # a taint of the operator's own still rejects: no state of the fleet would tolerate it
    own = Taint(key="dedicated", value="inference", effect="NoSchedule")
    s = FleetSnapshot([hgx_cluster("a", node_kw={"taints": [own]})])
    assert place(job(gpus=8), s, POLICY, 0).outcome == Outcome.REJECTED
