"""Per-job packing: ``spec.placement.allocation`` (``PlacementRequest.allocation``) overrides
the hub's ``--allocation`` for one job, on the same fleet and the same policy."""

from __future__ import annotations

import pytest
from placement_builders import hgx_cluster, job

from gpufed.placement import FleetSnapshot, Policy, place


def two_members() -> FleetSnapshot:
    """``a-empty``: four idle HGX nodes; ``b-full``: one idle node, three busy."""
    return FleetSnapshot(
        [hgx_cluster("a-empty", free=[8, 8, 8, 8]), hgx_cluster("b-full", free=[8, 0, 0, 0])]
    )


@pytest.mark.parametrize("hub_default", ["binpack", "spread"])
def test_the_same_fleet_packs_one_job_and_spreads_another(hub_default: str) -> None:
    s = two_members()
    policy = Policy(allocation=hub_default)  # type: ignore[arg-type]
    training = place(job("train", gpus=8, allocation="binpack"), s, policy, 0)
    inference = place(job("serve", gpus=8, allocation="spread"), s, policy, 0)
    assert training.cluster == "b-full"
    assert inference.cluster == "a-empty"


@pytest.mark.parametrize(
    ("hub_default", "expected"), [("binpack", "b-full"), ("spread", "a-empty")]
)
def test_a_job_that_does_not_choose_follows_the_hub(hub_default: str, expected: str) -> None:
    policy = Policy(allocation=hub_default)  # type: ignore[arg-type]
    assert place(job(gpus=8), two_members(), policy, 0).cluster == expected


def test_the_remembered_bound_of_one_mode_does_not_prune_the_other() -> None:
    """Two jobs of the same shape share the snapshot's memo; the second, in the other mode,
    must still find its member (the bound is remembered per allocation mode)."""
    # b-half: 8 nodes, 4 idle (binpack 62.5, spread 37.5); a-empty: 4 idle nodes (binpack 25,
    # spread 75). The binpack job plans b-half and prunes a-empty at its bound of 25; were that
    # bound reused for the spread job, a-empty would be pruned again, below b-half's 37.5.
    s = FleetSnapshot(
        [hgx_cluster("a-empty", free=[8] * 4), hgx_cluster("b-half", free=[8] * 4 + [0] * 4)]
    )
    policy = Policy()
    for _ in range(2):  # twice: the second round reads only remembered plans and bounds
        assert place(job("a", gpus=8, allocation="binpack"), s, policy, 0).cluster == "b-half"
        assert place(job("b", gpus=8, allocation="spread"), s, policy, 0).cluster == "a-empty"


def test_the_score_shows_the_jobs_own_mode() -> None:
    s = two_members()
    d = place(job(gpus=8, allocation="spread"), s, Policy(), 0, explain=True)
    by_member = {sc.cluster: sc.parts["ResourceAllocation"] for sc in d.scores}
    # spread: the free part left after placement (a: 24/32 free, b: 0/32)
    assert by_member == {"a-empty": 75.0, "b-full": 0.0}
