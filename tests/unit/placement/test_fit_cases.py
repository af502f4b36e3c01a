"""Where jobs go: fragmentation, NVLink best fit, NVL72 cliques, MIG, node state (table-driven).

Each case names a fleet built from shape-named builders, a job, and the member (and where it
matters the nodes or NVLink domain) the job must land on, or the outcome it must get.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from placement_builders import (
    A100,
    GB200,
    GPU,
    H100,
    H200,
    MIG_1G5,
    gpus_on,
    hgx_cluster,
    job,
    member,
    mig_mixed_node,
    mig_single_node,
    node,
    nvl72_cluster,
)

from gpufed.api.decision import Outcome
from gpufed.api.inventory import MemberClusterState, Taint, Toleration
from gpufed.api.request import PlacementRequest
from gpufed.placement import FleetSnapshot, Policy, place

NO_SCHEDULE = Taint(key="dedicated", value="inference", effect="NoSchedule")


@dataclass
class Case:
    name: str
    members: list[MemberClusterState]
    request: PlacementRequest
    outcome: Outcome = Outcome.PLACED
    cluster: str | None = None
    nodes: dict[str, int] | None = None  # node -> GPUs
    domains: tuple[str, ...] | None = None
    reason: str | None = None  # substring of the message
    policy: Policy = field(default_factory=Policy)


CASES = [
    Case(
        "8-GPU pod never goes where free GPUs are scattered one per node",
        [hgx_cluster("a-scattered", free=[1] * 16), hgx_cluster("b-whole", free=[8, 0, 0, 0])],
        job(gpus=8),
        cluster="b-whole",
        nodes={"b-whole-n000": 8},
    ),
    Case(
        "8-GPU pod waits rather than go to scattered GPUs (more free GPUs in sum)",
        [hgx_cluster("a-scattered", free=[1] * 16), hgx_cluster("b-busy", free=[0, 4, 0, 0])],
        job(gpus=8),
        outcome=Outcome.UNSCHEDULABLE,
        reason="node has 8 free GPUs (at most 1; free GPUs by node: 1:16)",
    ),
    Case(
        "1-GPU pod fills a hole instead of breaking an idle node (across members)",
        [hgx_cluster("a-idle", free=[8, 8]), hgx_cluster("b-holes", free=[1, 0, 3])],
        job(gpus=1),
        cluster="b-holes",
        nodes={"b-holes-n000": 1},
    ),
    Case(
        "2-GPU pod takes the tightest node that fits (3 free, not 8, not 1)",
        [hgx_cluster("a", free=[8, 1, 3, 6])],
        job(gpus=2),
        nodes={"a-n002": 2},
    ),
    Case(
        "partly used node wins over an idle node of the same free size",
        [
            member(
                "a",
                [
                    node("a-idle-4gpu", gpus=4, free=4),
                    node("b-half-8gpu", gpus=8, free=4),
                ],
            )
        ],
        job(gpus=4),
        nodes={"b-half-8gpu": 4},
    ),
    Case(
        "gang of 3x8 takes three idle nodes in one member, all or nothing",
        [hgx_cluster("a", free=[8, 8, 0, 8]), hgx_cluster("b", free=[8, 8, 0, 0])],
        job(gpus=8, pods=3),
        cluster="a",
        nodes={"a-n000": 8, "a-n001": 8, "a-n003": 8},
    ),
    Case(
        "gang never splits across members even when their sum would do",
        [hgx_cluster("a", free=[8, 8, 0, 0]), hgx_cluster("b", free=[8, 8, 0, 0])],
        job(gpus=8, pods=3),
        outcome=Outcome.UNSCHEDULABLE,
    ),
    Case(
        "NVLink Required 2x4 on HGX packs both pods on one node",
        [hgx_cluster("a", free=[4, 4, 8])],
        job(gpus=4, pods=2, nvlink="Required"),
        nodes={"a-n002": 8},
        domains=("node:a-n002",),
    ),
    Case(
        "NVLink Required 2x4 cannot use two half nodes: waits",
        [hgx_cluster("a", free=[4, 4, 4])],
        job(gpus=4, pods=2, nvlink="Required"),
        outcome=Outcome.UNSCHEDULABLE,
        reason="NVLink domain",
    ),
    Case(
        "NVLink None 2x4 may use two half nodes (fills holes)",
        [hgx_cluster("a", free=[4, 4, 8])],
        job(gpus=4, pods=2, nvlink="None"),
        nodes={"a-n002": 8},
    ),
    Case(
        "NVL72: 4 trays Required go to the partly used clique that fits, not the idle one",
        [nvl72_cluster("nvl", cliques=2, free=[[4] * 18, [4] * 5 + [0] * 13])],
        job(gpus=4, pods=4, nvlink="Required", products=[GB200]),
        domains=("clique:nvl-fabric.1",),
    ),
    Case(
        "NVL72: best-fit clique across members (fewest stranded GPUs)",
        [
            nvl72_cluster("x-roomy", free=[[4] * 10 + [0] * 8]),
            nvl72_cluster("y-tight", free=[[4] * 4 + [0] * 14]),
        ],
        job(gpus=4, pods=4, nvlink="Required", products=[GB200]),
        cluster="y-tight",
        domains=("clique:y-tight-fabric.0",),
    ),
    Case(
        "NVL72: free GPUs spread over trays do not make free trays",
        [nvl72_cluster("nvl", free=[[2] * 18])],
        job(gpus=4, pods=2, nvlink="Required", products=[GB200]),
        outcome=Outcome.UNSCHEDULABLE,
    ),
    Case(
        "NVL72: Required job larger than any clique is rejected at once",
        [nvl72_cluster("nvl", cliques=2)],
        job(gpus=4, pods=19, nvlink="Required", products=[GB200]),
        outcome=Outcome.REJECTED,
        reason="could ever hold",
    ),
    Case(
        "NVL72: Preferred job larger than a clique spans cliques",
        [nvl72_cluster("nvl", cliques=2)],
        job(gpus=4, pods=20, nvlink="Preferred", products=[GB200]),
        domains=("clique:nvl-fabric.0", "clique:nvl-fabric.1"),
    ),
    Case(
        "16 GPUs in one pod when nodes have 8: rejected, never queued",
        [hgx_cluster("a"), nvl72_cluster("b")],
        job(gpus=16),
        outcome=Outcome.REJECTED,
        reason="largest",
    ),
    Case(
        "NVLink Required across several HGX nodes can never fit: rejected",
        [hgx_cluster("a", nodes=8)],
        job(gpus=8, pods=2, nvlink="Required"),
        outcome=Outcome.REJECTED,
    ),
    Case(
        "GPU product: only allowed products are used",
        [hgx_cluster("a-h100", product=H100), hgx_cluster("b-h200", product=H200, free=[1, 8])],
        job(gpus=8, products=[H200]),
        cluster="b-h200",
    ),
    Case(
        "GPU product nobody has: rejected naming the product",
        [hgx_cluster("a", product=H100)],
        job(gpus=1, products=[A100]),
        outcome=Outcome.REJECTED,
        reason="not in gpuProducts",
    ),
    Case(
        "NotReady and cordoned nodes offer nothing",
        [
            member(
                "a",
                [
                    node("a-notready", ready=False),
                    node("a-cordoned", unschedulable=True),
                    node("a-ok", free=2),
                ],
            )
        ],
        job(gpus=4),
        outcome=Outcome.UNSCHEDULABLE,
    ),
    Case(
        "a degraded node (agent could not read it) offers nothing",
        [member("a", [node("a-ok", free=2), node("a-bad").model_copy(update={"degraded": "x"})])],
        job(gpus=4),
        outcome=Outcome.UNSCHEDULABLE,
    ),
    Case(
        "untolerated node taint: the pool offers nothing",
        [hgx_cluster("a", node_kw={"taints": [NO_SCHEDULE]})],
        job(gpus=4),
        outcome=Outcome.REJECTED,
        reason="taint dedicated=inference:NoSchedule",
    ),
    Case(
        "tolerated node taint: the pool is used",
        [hgx_cluster("a", node_kw={"taints": [NO_SCHEDULE]})],
        job(gpus=4, tolerations=[Toleration(key="dedicated", operator="Exists")]),
        cluster="a",
    ),
    Case(
        "PreferNoSchedule never blocks",
        [hgx_cluster("a", node_kw={"taints": [Taint(key="x", effect="PreferNoSchedule")]})],
        job(gpus=4),
        cluster="a",
    ),
    Case(
        "Terminating pods still hold their GPUs (the agent counts them as requested)",
        [member("a", [node("a-n0", free=0)])],
        job(gpus=1),
        outcome=Outcome.UNSCHEDULABLE,
    ),
    Case(
        "unhealthy GPU (allocatable below requested) leaves 0 free, never negative",
        [member("a", [node("a-n0", free=0, alloc_gpus=6), node("a-n1", free=1)])],
        job(gpus=1),
        nodes={"a-n1": 1},
    ),
    Case(
        "MIG single strategy: slices under nvidia.com/gpu are never taken for whole GPUs",
        [member("mig", [mig_single_node("mig-n0")])],
        job(gpus=8),
        outcome=Outcome.REJECTED,
        reason="MIG slices, not whole GPUs",
    ),
    Case(
        "MIG single strategy: a job that names the MIG product gets slices",
        [member("mig", [mig_single_node("mig-n0")])],
        job(gpus=7, products=[MIG_1G5]),
        nodes={"mig-n0": 7},
    ),
    Case(
        "MIG single strategy: a nodeSelector naming the MIG product also gets slices",
        [member("mig", [mig_single_node("mig-n0")]), hgx_cluster("whole", free=[8])],
        job(gpus=2, node_selector={"nvidia.com/gpu.product": MIG_1G5}),
        cluster="mig",
        nodes={"mig-n0": 2},
    ),
    Case(
        "MIG mixed: only the whole GPUs left count as GPUs",
        [member("mixed", [mig_mixed_node("mixed-n0")])],
        job(gpus=8),
        outcome=Outcome.REJECTED,
    ),
    Case(
        "MIG mixed: a MIG profile request goes to a node with that profile",
        [
            hgx_cluster("a-plain"),
            member("b-mixed", [mig_mixed_node("b-n0")]),
        ],
        job(requests={"nvidia.com/mig-1g.10gb": 2, "cpu": 1000}, pods=3),
        cluster="b-mixed",
    ),
    Case(
        "CPU and memory count: a node with GPUs but no CPU left is skipped",
        [
            member(
                "a",
                [
                    node("a-n0", free=8, extra_req={"cpu": 8 * 16_000 + 8000}),
                    node("a-n1", free=8),
                ],
            )
        ],
        job(gpus=2, pods=1),
        nodes={"a-n1": 2},
    ),
    Case(
        "rack Required keeps 4x8 in one rack",
        [hgx_cluster("a", free=[8, 0, 8, 8, 8, 8, 0, 8, 8, 8, 8, 8], rack_size=4)],
        job(gpus=8, pods=4, rack="Required"),
        nodes={"a-n008": 8, "a-n009": 8, "a-n010": 8, "a-n011": 8},
    ),
    Case(
        "rack Required that no rack can ever hold is rejected",
        [hgx_cluster("a", nodes=8, rack_size=4)],
        job(gpus=8, pods=5, rack="Required"),
        outcome=Outcome.REJECTED,
        reason="rack is Required",
    ),
    Case(
        "rack Preferred climbs to the whole member when no rack has room",
        [hgx_cluster("a", free=[8, 8, 0, 0, 8, 8, 0, 0], rack_size=4)],
        job(gpus=8, pods=4, rack="Preferred"),
        nodes={"a-n000": 8, "a-n001": 8, "a-n004": 8, "a-n005": 8},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_placement_case(case: Case) -> None:
    snapshot = FleetSnapshot(case.members)
    d = place(case.request, snapshot, case.policy, now=0.0)
    assert d.outcome == case.outcome, d.message
    if case.cluster is not None:
        assert d.cluster == case.cluster, d.message
    if case.nodes is not None:
        assert gpus_on(d) == case.nodes
    if case.domains is not None:
        assert d.nvlink_domains == case.domains
    if case.reason is not None:
        assert case.reason in d.message or any(case.reason in r.reason for r in d.rejections)
    if d.outcome == Outcome.PLACED:
        pods = {ps.name: sum(ps.nodes.values()) for ps in d.pod_sets}
        assert pods == {ps.name: ps.count for ps in case.request.pod_sets}


def _three_domain_fleet() -> list[MemberClusterState]:
    return [nvl72_cluster("n", cliques=3, free=[[4] * 18, [4] * 8 + [0] * 10, [4] * 3 + [1] * 15])]


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        (1, "clique:n-fabric.2"),  # 27 free: the tightest clique with a free tray
        (3, "clique:n-fabric.2"),  # exactly 3 free trays there
        (4, "clique:n-fabric.1"),  # 4..8 trays: the 32-GPU clique, not the idle one
        (8, "clique:n-fabric.1"),
        (9, "clique:n-fabric.0"),  # only the idle clique has 9 free trays
    ],
)
def test_nvl72_required_picks_tightest_clique_that_fits(pods: int, expected: str) -> None:
    snapshot = FleetSnapshot(_three_domain_fleet())
    d = place(job(gpus=4, pods=pods, nvlink="Required", products=[GB200]), snapshot, Policy(), 0)
    assert d.nvlink_domains == (expected,)


def test_launcher_pod_without_gpus_goes_to_the_same_member_as_the_workers() -> None:
    from gpufed.api.request import PodSet

    cpu_node = node("b-cpu", gpus=0, free=0, extra_alloc={GPU: 0})
    snapshot = FleetSnapshot(
        [
            hgx_cluster("a", free=[8]),
            member("b", [*hgx_cluster("b", free=[8, 8]).inventory.nodes, cpu_node]),
        ]
    )
    launcher = PodSet(name="launcher", count=1, requests={"cpu": 2000, "memory": 2**30})
    d = place(job(gpus=8, pods=2, extra_sets=[launcher]), snapshot, Policy(), 0)
    assert d.cluster == "b"
    assert {ps.name: sum(ps.nodes.values()) for ps in d.pod_sets} == {"main": 2, "launcher": 1}
