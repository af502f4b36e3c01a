"""Hypothesis: the victim set is the cheapest, checked against a brute-force optimum.

Random small fleets (one or two members; per member one or two 8-GPU HGX nodes and at most one
NVLink clique of four 4-GPU trays), 2-8 running jobs of random sizes (some spanning two trays),
priorities and work since their last checkpoint, and a random preemptor. The brute force knows
nothing of the search: for every member and every subset of its eligible jobs (priority below
the preemptor's) it rebuilds that member from the drawn description *without* those jobs and
asks ``place()`` on a fleet of that member alone whether the job fits. ``place()`` is kept
because it *is* the definition of "fits" (NVLink domains, pods per node, CPU and memory); the
search's own parts (the block filing and estimates, the what-if that frees jobs in place on
the live snapshot, ``OnlyMember``, the enumeration and its arithmetic shortcuts) are not used.
The cost (GPUs x seconds since the last checkpoint) and the order (highest priority, work lost,
victims, member, UIDs) are recomputed here. Asserted: the plan's key equals the optimum's, the
plan is minimal (no victim can be put back), and no plan is made when no set fits or the job
fits already.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st
from placement_builders import GB200, H100, job, member
from preemption_builders import busy_node, running

from gpufed.api.decision import Outcome
from gpufed.placement import FleetSnapshot, Policy, place
from gpufed.placement.preemption import NoPreemption, PreemptionPlan, Preemptor
from gpufed.placement.victims import plan_preemption

NOW = 50_000.0
POLICY = Policy()
SETTINGS = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Node:
    member: str
    name: str
    gpus: int
    clique: str | None  # None: an HGX node (its own NVLink domain)


@dataclass(frozen=True)
class Job:
    uid: str
    member: str
    gpus: dict[str, int]  # node -> GPUs
    priority: int
    lost_s: float  # seconds since its last checkpoint

    @property
    def cost(self) -> float:
        return sum(self.gpus.values()) * self.lost_s


@dataclass(frozen=True)
class Fleet:
    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...]

    def member_without(self, name: str, gone: set[str]) -> Any:
        """Member ``name`` rebuilt from the description, ``gone`` jobs never started."""
        invs = []
        for n in self.nodes:
            if n.member != name:
                continue
            here = [(j.uid, j.gpus[n.name]) for j in self.jobs if n.name in j.gpus]
            kw: dict[str, Any] = (
                {"product": GB200, "clique": n.clique} if n.clique else {"product": H100}
            )
            invs.append(
                busy_node(n.name, [(u, g) for u, g in here if u not in gone], gpus=n.gpus, **kw)
            )
        return member(name, invs)

    def members(self) -> list[str]:
        return sorted({n.member for n in self.nodes})


LOST_S = [50.0, 100.0, 150.0, 200.0, 300.0]  # few values: ties in work lost are common


@st.composite
def fleets(draw: Any) -> Fleet:
    nodes: list[Node] = []
    for m in range(draw(st.integers(1, 2))):
        name = f"m{m}"
        for i in range(draw(st.integers(1, 2))):
            nodes.append(Node(name, f"{name}-n{i}", 8, None))
        if draw(st.booleans()):
            nodes += [Node(name, f"{name}-c-t{t}", 4, f"{name}-fab") for t in range(4)]
    free = {n.name: n.gpus for n in nodes}
    jobs: list[Job] = []
    for n in nodes:  # fill each node, mostly to the brim, with at most 8 jobs in all
        while free[n.name] and len(jobs) < 8 and draw(st.integers(0, 5)):
            pair = [x for x in nodes if n.clique and x.clique == n.clique and free[x.name] == 4]
            if len(pair) >= 2 and free[n.name] == 4 and draw(st.booleans()):
                gpus = {x.name: 4 for x in [n, next(x for x in pair if x != n)]}
            else:  # one node: its free GPUs or a smaller power of two
                sizes = [g for g in (8, 4, 2, 1) if g <= free[n.name]]
                gpus = {n.name: draw(st.sampled_from(sizes))}
            for x, g in gpus.items():
                free[x] -= g
            prio, lost = draw(st.integers(0, 3)), draw(st.sampled_from(LOST_S))
            jobs.append(Job(f"j{len(jobs)}", n.member, gpus, prio, lost))
    assume(len(jobs) >= 2)
    return Fleet(tuple(nodes), tuple(jobs))


preemptors = st.tuples(
    st.sampled_from([(1, 1), (2, 1), (4, 1), (8, 1), (4, 2), (2, 4), (4, 3), (8, 2)]),
    st.sampled_from(["Required", "Preferred"]),
    st.integers(1, 4),
)

Key = tuple[int, float, int, str, tuple[str, ...]]


def key_of(member_name: str, jobs: Sequence[Job]) -> Key:
    return (
        max(j.priority for j in jobs),
        round(sum(j.cost for j in jobs), 6),
        len(jobs),
        member_name,
        tuple(sorted(j.uid for j in jobs)),
    )


def brute_force(f: Fleet, req: Any) -> dict[tuple[str, frozenset[str]], bool]:
    """Every (member, non-empty subset of its eligible jobs) -> whether the job fits there."""
    fits: dict[tuple[str, frozenset[str]], bool] = {}
    for m in f.members():
        eligible = [j for j in f.jobs if j.member == m and j.priority < req.priority]
        for r in range(1, len(eligible) + 1):
            for subset in itertools.combinations(eligible, r):
                gone = frozenset(j.uid for j in subset)
                snap = FleetSnapshot([f.member_without(m, set(gone))])
                fits[(m, gone)] = place(req, snap, POLICY, NOW).outcome == Outcome.PLACED
    return fits


# Found by CI's random search (stop 39): a one-pod 8-GPU job, an HGX node and a GB200 clique
# of 4-GPU trays with 5 eligible jobs. The clique can never hold the pod, but its 31 sets spent
# the exact search's what-ifs, so the (right) plan came from the bounded search.
_TRAYS_THAT_CANNOT_HOLD_THE_POD = Fleet(
    nodes=(
        Node("m0", "m0-n0", 8, None),
        *(Node("m0", f"m0-c-t{t}", 4, "m0-fab") for t in range(4)),
    ),
    jobs=(
        Job("j0", "m0", {"m0-n0": 8}, 0, 100.0),
        Job("j1", "m0", {"m0-c-t0": 2}, 0, 50.0),
        Job("j2", "m0", {"m0-c-t0": 1}, 0, 50.0),
        Job("j3", "m0", {"m0-c-t0": 1}, 0, 50.0),
        Job("j4", "m0", {"m0-c-t1": 2}, 0, 50.0),
        Job("j5", "m0", {"m0-c-t1": 2}, 0, 50.0),
    ),
)


@SETTINGS
@given(fleets(), preemptors)
@example(_TRAYS_THAT_CANNOT_HOLD_THE_POD, ((8, 1), "Required", 1))
def test_the_plan_is_the_brute_force_optimum_and_minimal(f: Fleet, wanted: Any) -> None:
    (gpus, pods), nvl, prio = wanted
    req = job("p", gpus=gpus, pods=pods, nvlink=nvl, priority=prio)
    snap = FleetSnapshot([f.member_without(m, set()) for m in f.members()])
    runs = [
        running(j.uid, j.member, dict(j.gpus), priority=j.priority, last_checkpoint=NOW - j.lost_s)
        for j in f.jobs
    ]
    out = plan_preemption(Preemptor(req), runs, snap, POLICY, NOW)
    if place(req, snap, POLICY, NOW).outcome == Outcome.PLACED:
        event("fits without preemption")
        assert isinstance(out, NoPreemption)
        assert out.reason.startswith("fits without preemption")
        return
    fits = brute_force(f, req)
    by_uid = {j.uid: j for j in f.jobs}
    fitting = [key_of(m, [by_uid[u] for u in gone]) for (m, gone), ok in fits.items() if ok]
    if not fitting:
        event("no set fits")
        assert isinstance(out, NoPreemption), out
        return
    best = min(fitting)
    event(f"optimum of {best[2]} victim(s)")
    assert isinstance(out, PreemptionPlan), (out, best)
    assert out.whatifs <= 64
    got = key_of(out.cluster, [by_uid[u] for u in out.victim_uids])
    assert got == best, f"plan {got} is not the optimum {best}"
    assert out.search == "exact search"  # at most 8 candidates a block, within the budget
    gone = frozenset(out.victim_uids)
    for u in gone:
        rest = gone - {u}
        assert not rest or not fits[(out.cluster, rest)], f"{u} can be put back"
