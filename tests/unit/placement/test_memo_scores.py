"""The pool memo's remembered plans and scores change no decision.

``place()`` remembers per pool version each plan and its scores (``Scored``: the weighted total
and each scorer's part) so that a remembered plan is scored once, not once per decision. The
reference here is the same sequence of decisions made on a twin snapshot whose memo is thrown
away before every decision (every plan made and scored afresh): both snapshots receive the same
reservations and releases, and every decision must be identical, over random fleets, job
shapes repeated so the memo is hit, both allocation modes and two policies with different
weights sharing one snapshot.

Without ``explain``, a decision's ``cluster_scores`` lists the members that were planned before
branch and bound stopped, and a remembered plan's exact score lets it stop earlier than a fresh
bound does (so far it was so before this memo too): there the winner's score is compared, not
the list. With ``explain`` every candidate is planned and the whole decision is compared.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from placement_builders import GB200, H100, job, member, node, nvl72_cluster

from gpufed.api.decision import Outcome
from gpufed.api.inventory import MemberClusterState
from gpufed.api.request import PlacementRequest
from gpufed.placement import FleetSnapshot, Policy, place
from gpufed.placement.memo import PlacementMemo
from gpufed.placement.policy import ScoreWeights

POLICIES = (
    Policy(),
    Policy(name="spread-cost", allocation="spread", weights=ScoreWeights(topology_cost=3.0)),
    Policy().without_topology_cost(),
)


@st.composite
def members(draw: Any, name: str) -> MemberClusterState:
    if draw(st.booleans()):
        frees = draw(st.lists(st.integers(0, 8), min_size=1, max_size=8))
        nodes = [
            node(f"{name}-n{i}", free=f, rack=f"{name}-r{i // 3}") for i, f in enumerate(frees)
        ]
        return member(name, nodes)
    cliques = draw(
        st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=5), min_size=1, max_size=3)
    )
    return nvl72_cluster(name, len(cliques), free=cliques)


@st.composite
def shapes(draw: Any) -> dict[str, Any]:
    return {
        "gpus": draw(st.sampled_from([1, 2, 4, 8])),
        "pods": draw(st.integers(1, 3)),
        "nvlink": draw(st.sampled_from(["Required", "Preferred", "None"])),
        "products": draw(st.sampled_from([(), (H100,), (GB200,)])),
        "rack": draw(st.sampled_from([None, "Preferred"])),
        "allocation": draw(st.sampled_from([None, "binpack", "spread"])),
    }


#: one step: (job shape index, policy index, explain, release the oldest live job first)
STEPS = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, len(POLICIES) - 1), st.booleans(), st.booleans()),
    min_size=1,
    max_size=14,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 3).flatmap(lambda n: st.tuples(*(members(f"m{i}") for i in range(n)))),
    st.lists(shapes(), min_size=1, max_size=4),
    STEPS,
)
def test_decisions_with_the_memo_equal_decisions_made_afresh(
    fleet: tuple[MemberClusterState, ...],
    kinds: list[dict[str, Any]],
    steps: list[tuple[int, int, bool, bool]],
) -> None:
    kept = FleetSnapshot(fleet)
    fresh = FleetSnapshot(fleet)
    live: list[str] = []
    for i, (k, p, explain, release) in enumerate(steps):
        if release and live:
            gone = live.pop(0)
            kept.release(gone)
            fresh.release(gone)
        req: PlacementRequest = job(f"j{i}", **kinds[k % len(kinds)])
        policy = POLICIES[p]
        fresh.memo = PlacementMemo()  # the reference remembers nothing
        got = place(req, kept, policy, float(i), explain=explain)
        want = place(req, fresh, policy, float(i), explain=explain)
        g, w = got.model_dump(), want.model_dump()
        if not explain:
            g_scores, w_scores = g.pop("cluster_scores"), w.pop("cluster_scores")
            if got.cluster is not None:
                assert g_scores[got.cluster] == w_scores[want.cluster]
        assert g == w
        if got.outcome == Outcome.PLACED:
            kept.reserve(got, float(i))
            fresh.reserve(want, float(i))
            live.append(got.uid)


def test_a_key_id_never_stands_for_two_keys_even_after_the_table_is_cleared() -> None:
    memo = PlacementMemo()
    given_out: dict[int, object] = {}
    for round_ in range(3):
        for i in range(5000):  # past the table's cap: it is cleared along the way
            key = ("shape", i % 4500)
            kid = memo.key_id(key)
            assert given_out.setdefault(kid, key) == key, round_
            assert memo.key_id(key) == kid
