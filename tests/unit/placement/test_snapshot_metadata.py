"""A member's metadata written again unchanged (every MemberCluster watch event, the hub's own
status writes included, and every full inventory snapshot) keeps the fleet generation, so the
fleet-level memo survives it; a real change still moves it, and placement follows the change.

Reference: every decision on the long-lived snapshot equals the one made on a snapshot built
afresh from the same member states (no memo at all)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from placement_builders import hgx_cluster, job

from gpufed.api.inventory import Taint, Toleration
from gpufed.api.request import LabelSelector
from gpufed.placement import FleetSnapshot, Policy, place

POLICY = Policy()
MEMBERS = ("a", "b", "c")
LABELS = st.sampled_from([{}, {"zone": "x"}, {"zone": "y"}, {"zone": "x", "tier": "gold"}])
TAINTS = st.sampled_from([(), (Taint(key="drain", effect="NoSchedule"),)])
KINDS = st.sampled_from([frozenset({"Job.batch"}), frozenset({"Job.batch", "JobSet.jobset"})])
JOBS = [
    job("plain", gpus=8),
    job("zone-x", gpus=8, selector=LabelSelector(matchLabels={"zone": "x"})),
    job("gold", gpus=4, selector=LabelSelector(matchLabels={"tier": "gold"})),
    job("tolerant", gpus=8, tolerations=(Toleration(key="drain", operator="Exists"),)),
    job("jobset", gpus=8, kind="JobSet.jobset"),
]

updates = st.lists(
    st.tuples(
        st.sampled_from(MEMBERS),
        st.one_of(st.none(), LABELS),
        st.one_of(st.none(), TAINTS),
        st.one_of(st.none(), KINDS),
    ),
    max_size=25,
)


def _fresh(meta: dict[str, dict[str, object]]) -> FleetSnapshot:
    return FleetSnapshot(
        [
            hgx_cluster(
                name,
                nodes=2,
                labels=meta[name]["labels"],
                taints=meta[name]["taints"],
                kinds=meta[name]["kinds"],
            )
            for name in MEMBERS
        ]
    )


@settings(max_examples=120, deadline=None)
@given(updates)
def test_unchanged_metadata_keeps_the_generation_and_decisions_follow_real_changes(
    plan: list[tuple[str, object, object, object]],
) -> None:
    meta: dict[str, dict[str, object]] = {
        n: {"labels": {}, "taints": (), "kinds": frozenset({"Job.batch"})} for n in MEMBERS
    }
    snap = _fresh(meta)
    for name, labels, taints, kinds in plan:
        before = dict(meta[name])
        for field, value in (("labels", labels), ("taints", taints), ("kinds", kinds)):
            if value is not None:
                meta[name][field] = value
        generation = snap.generation
        snap.set_metadata(
            name,
            labels=labels,  # type: ignore[arg-type]
            taints=taints,  # type: ignore[arg-type]
            served_kinds=kinds,  # type: ignore[arg-type]
        )
        assert (snap.generation != generation) == (meta[name] != before)
        reference = _fresh(meta)
        for j in JOBS:
            got, want = place(j, snap, POLICY, 0), place(j, reference, POLICY, 0)
            assert (got.placed, got.cluster) == (want.placed, want.cluster), j.job


def test_the_same_metadata_again_keeps_the_fleet_memo() -> None:
    snap = FleetSnapshot([hgx_cluster("a", labels={"zone": "x"})])
    generation = snap.generation
    snap.set_metadata("a", labels={"zone": "x"}, taints=(), served_kinds=frozenset({"Job.batch"}))
    assert snap.generation == generation
    snap.set_metadata("a", labels={"zone": "y"})
    assert snap.generation == generation + 1
