"""The quota guarantees of issue 23 held by the real hub, through GPUQueues, PriorityClasses and
GPUJobs only (docs/placement.md, "Quota arithmetic" and "Who may preempt whom, when"): each
test pins one defect the issue lists, on the example fleet's H100 member (us-east-hgx: 8 nodes
x 8 GPUs, one NVLink domain per node), with 8-GPU jobs so that a count of GPUs is a count of
jobs.

* priority never overrides another queue's nominal quota;
* a reclaim takes only what the victim's queue borrowed, and the reclaimer then gets that
  quota (its hold is charged to its queue: the requeued victims cannot take it back);
* a ``lendingLimit: 0`` protects a team from a cousin three levels away;
* a broken queue's running jobs stay charged to its parents;
* the default queue's jobs (namespaces no queue lists) are reclaimed, whatever their priority.

Each test creates its own queues (prefixed ``g<n>-``, over namespaces of the same names) and
removes them, their jobs and the PriorityClasses afterwards; the H100s are all free again at
the end (checked).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpufed.api.fleet import FleetSpec
from gpufed.api.labels import GROUP, VERSION
from tests.e2e.conftest import EXAMPLE_FLEET
from tests.e2e.harness import DRILL_NS, E2E, H100, batch_job, priority_classes, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

HGX = "us-east-hgx"


def _h100s(*, dra: bool) -> int:
    """H100s of the example fleet's us-east-hgx whose pools do (``dra``) or do not publish
    them through DRA: the member reports both as H100, and only the others take the plain
    ``nvidia.com/gpu`` pods of these tests."""
    fleet = FleetSpec.model_validate(yaml.safe_load(EXAMPLE_FLEET.read_text()))
    [member] = [c for c in fleet.clusters if c.name == HGX]
    return sum(p.nodes * p.gpu.count for p in member.node_pools if p.dra == dra)


#: H100s the tests' jobs can take (us-east-hgx's h100 pool: 8 nodes x 8), and those of its DRA
#: pool, which only claims take: counted free by the member all along.
H100_PLAIN = _h100s(dra=False)
H100_DRA = _h100s(dra=True)
H100_TOTAL = H100_PLAIN + H100_DRA
CLASSES = {"guar-low": 100, "guar-high": 100_000}
H100_ONLY = {"gpuProducts": [H100]}
#: Long enough for a placement, a preemption (graceful delete on the member) and a restart.
ACT_S = 120


def h100(nominal: int, **limits: int) -> dict[str, Any]:
    """A ``spec.quotas[]`` entry for H100s (``lendingLimit=``, ``borrowingLimit=``)."""
    return {"gpuProduct": H100, "nominal": nominal, **limits}


def condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


class Guarantees:
    """The session's :class:`E2E` plus the GPUQueues a test creates (removed afterwards with
    their namespaces' jobs) and the PriorityClasses ``guar-low`` / ``guar-high``."""

    def __init__(self, e2e: E2E) -> None:
        self.e2e = e2e
        self.hub = e2e.hub
        self.queues: list[str] = []
        self.namespaces: list[str] = []

    # --- GPUQueues --------------------------------------------------------------------------------

    def queue(
        self,
        name: str,
        *,
        parent: str | None = None,
        namespaces: tuple[str, ...] = (),
        quotas: tuple[dict[str, Any], ...] = (),
        preemption: dict[str, Any] | None = None,
    ) -> None:
        """Create GPUQueue ``name`` (its namespaces too); removed after the test."""
        spec: dict[str, Any] = {"namespaces": list(namespaces), "quotas": list(quotas)}
        if parent is not None:
            spec["parent"] = parent
        if preemption is not None:
            spec["preemption"] = preemption
        for ns in namespaces:
            self.hub.ensure_namespace(ns)
            if ns not in self.namespaces:
                self.namespaces.append(ns)
        self.queues.append(name)
        self.hub.custom.create_cluster_custom_object(
            GROUP,
            VERSION,
            "gpuqueues",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "GPUQueue",
                "metadata": {"name": name},
                "spec": spec,
            },
        )

    def queue_status(self, name: str) -> dict[str, Any]:
        obj = self.hub.custom.get_cluster_custom_object(GROUP, VERSION, "gpuqueues", name)
        return dict(obj.get("status") or {})

    def active(self, name: str) -> str | None:
        """The queue's ``Active`` condition status (``True`` / ``False``; None: not yet)."""
        cond = condition(self.queue_status(name), "Active")
        return None if cond is None else str(cond.get("status"))

    def wait_active(self, *names: str, want: str = "True") -> None:
        """Until the hub shows every queue of ``names`` with ``Active=want`` (a job submitted
        before the hub took its queue would be admitted by the default queue)."""
        wait_until(
            lambda: all(self.active(n) == want for n in names),
            f"queues {', '.join(names)} Active={want}",
            ACT_S,
        )

    def used(self, queue: str) -> tuple[int, int] | None:
        """(used, borrowed) H100s the hub shows for ``queue`` (None: no usage row yet)."""
        for row in self.queue_status(queue).get("usage") or []:
            if row.get("gpuProduct") == H100:
                return int(row.get("used", 0)), int(row.get("borrowed", 0))
        return None

    # --- GPUJobs ----------------------------------------------------------------------------------

    def submit(self, name: str, ns: str, cls: str, *, pods: int = 1) -> None:
        """A GPUJob of ``pods`` x 8 H100s (one node each) at PriorityClass ``cls``."""
        self.hub.submit(
            name,
            batch_job(8, pods=pods),
            namespace=ns,
            placement={**H100_ONLY, "priorityClassName": cls},
        )

    def phases(self, ns: str) -> dict[str, str]:
        return {
            j["metadata"]["name"]: str((j.get("status") or {}).get("phase", "Pending"))
            for j in self.hub.jobs(ns)
        }

    def all_running(self, ns: str, names: list[str]) -> None:
        for name in names:
            self.hub.wait_phase(name, "Running", namespace=ns, timeout_s=ACT_S)

    def judged(self, name: str, ns: str, *needles: str) -> dict[str, Any]:
        """Until the waiting job ``name`` shows that the hub planned a preemption for it and
        found none (its message ends ``preempting nothing: ...``) and names every one of
        ``needles``; asserts it is still Pending then. The hub has had its chance to act."""

        def check() -> dict[str, Any] | None:
            st = self.hub.status(name, ns)
            msg = str(st.get("message") or "")
            ok = "preempting nothing" in msg and all(n in msg for n in needles)
            return st if ok else None

        st = wait_until(check, f"{ns}/{name} waits, preempting nothing", ACT_S)
        assert st.get("phase", "Pending") == "Pending", st
        placed = condition(st, "Placed")
        assert placed is not None, st
        assert placed["status"] == "False", st
        return st

    def never_preempted(self, ns: str, names: list[str]) -> None:
        for name in names:
            st = self.hub.status(name, ns)
            assert st.get("phase") == "Running", (name, st)
            assert condition(st, "Preempted") is None, (name, st)
            assert not st.get("preemptions"), (name, st)
            assert "Preempted" not in self.hub.events(name, ns), name

    # --- clean-up ---------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """What the hub shows of the test's jobs and queues (printed at the end of each test:
        run with -s to see it)."""
        jobs: dict[str, Any] = {}
        for ns in [*self.namespaces, DRILL_NS]:
            for j in self.hub.jobs(ns):
                st = j.get("status") or {}
                jobs[f"{ns}/{j['metadata']['name']}"] = {
                    "phase": st.get("phase", "Pending"),
                    "message": st.get("message"),
                    "conditions": {
                        c["type"]: [c.get("status"), c.get("reason"), c.get("message")]
                        for c in st.get("conditions") or []
                        if c.get("type") in ("Placed", "Preempted")
                    },
                    "victims": [v["job"] for v in (st.get("preemption") or {}).get("victims", [])],
                }
        queues: dict[str, Any] = {}
        for name in self.queues:
            with contextlib.suppress(ApiException):
                qs = self.queue_status(name)
                active = condition(qs, "Active") or {}
                queues[name] = {
                    "active": [active.get("status"), active.get("message")],
                    "usage": qs.get("usage"),
                }
        return {"jobs": jobs, "queues": queues}

    def cleanup(self) -> None:
        """Every job of the test's namespaces, then its queues (children first); then wait
        until the H100s are all free again."""
        with contextlib.suppress(ApiException, OSError):
            print(json.dumps(self.snapshot(), indent=1))
        for ns in self.namespaces:
            self.hub.clear(ns, timeout_s=ACT_S)
        self.hub.clear(DRILL_NS, timeout_s=ACT_S)
        for name in reversed(self.queues):
            with contextlib.suppress(ApiException):
                self.hub.custom.delete_cluster_custom_object(GROUP, VERSION, "gpuqueues", name)
        wait_until(
            lambda: self.hub.gpus_free(HGX, H100) == H100_TOTAL, "every H100 free again", ACT_S
        )


@pytest.fixture
def guar(e2e: E2E) -> Iterator[Guarantees]:
    """PriorityClasses guar-low (100) and guar-high (100000), both PreemptLowerPriority, on the
    hub cluster; the test's queues, their jobs and the classes removed afterwards."""
    wait_until(
        lambda: e2e.hub.gpus_free(HGX, H100) == H100_TOTAL, "every H100 free at the start", ACT_S
    )
    # a suspect node counts as free but takes no job: an earlier drill's marks must end first
    wait_until(lambda: not e2e.hub.suspects(HGX), "no suspect H100 node at the start", ACT_S)
    with priority_classes(e2e.hub.api, CLASSES):
        g = Guarantees(e2e)
        try:
            yield g
        finally:
            g.cleanup()


def test_priority_never_overrides_another_teams_nominal(guar: Guarantees) -> None:
    """g1-org (16 H100) over g1-team-a (nominal 0) and g1-team-b (nominal 16). team-b's two
    low-priority jobs fill its nominal; team-a's high-priority job waits and preempts nothing:
    team-b is within its nominal, so none of its jobs is a candidate. team-a's queue allows
    borrowing preemptions of lower priorities (``borrowWithinParent: LowerPriority``), so only
    the nominal guarantee stands between it and team-b's jobs (before issue 23 they were
    preempted)."""
    guar.queue("g1-org", quotas=(h100(16),))
    guar.queue(
        "g1-team-a",
        parent="g1-org",
        namespaces=("g1-team-a",),
        quotas=(h100(0),),
        preemption={"borrowWithinParent": {"policy": "LowerPriority"}},
    )
    guar.queue("g1-team-b", parent="g1-org", namespaces=("g1-team-b",), quotas=(h100(16),))
    guar.wait_active("g1-org", "g1-team-a", "g1-team-b")

    low = ["b0", "b1"]
    for name in low:
        guar.submit(name, "g1-team-b", "guar-low")
    guar.all_running("g1-team-b", low)
    wait_until(lambda: guar.used("g1-team-b") == (16, 0), "g1-team-b uses 16 of 16")

    guar.submit("a0", "g1-team-a", "guar-high")
    guar.judged("a0", "g1-team-a", "g1-team-a uses 0 of 0", "8 more needed")
    guar.never_preempted("g1-team-b", low)
    assert "Preempting" not in guar.hub.events("a0", "g1-team-a")
    assert guar.used("g1-team-b") == (16, 0)


def _team_b_borrows_16(guar: Guarantees, p: str) -> list[str]:
    """``<p>-org`` (24 H100) over ``<p>-team-a`` (nominal 16) and ``<p>-team-b`` (nominal 8);
    team-b runs three high-priority 8-GPU jobs (24: 16 of them borrowed from team-a).
    Returns their names."""
    guar.queue(f"{p}-org", quotas=(h100(24),))
    guar.queue(f"{p}-team-a", parent=f"{p}-org", namespaces=(f"{p}-team-a",), quotas=(h100(16),))
    guar.queue(f"{p}-team-b", parent=f"{p}-org", namespaces=(f"{p}-team-b",), quotas=(h100(8),))
    guar.wait_active(f"{p}-org", f"{p}-team-a", f"{p}-team-b")
    bs = ["b0", "b1", "b2"]
    for name in bs:
        guar.submit(name, f"{p}-team-b", "guar-high")
    guar.all_running(f"{p}-team-b", bs)
    wait_until(lambda: guar.used(f"{p}-team-b") == (24, 16), f"{p}-team-b borrows 16")
    return bs


def _reclaim_plan(guar: Guarantees, p: str) -> list[str]:
    """Until team-a's job ``a0`` has committed its reclaim (``status.preemption``); returns
    its victims (``ns/name``)."""

    def plan() -> list[str] | None:
        pre = guar.hub.status("a0", f"{p}-team-a").get("preemption") or {}
        return sorted(v["job"] for v in pre.get("victims") or []) or None

    return wait_until(plan, f"{p}-team-a/a0 reclaims", ACT_S)


def test_reclaim_takes_only_what_was_borrowed(guar: Guarantees) -> None:
    """team-b borrows 16 (``_team_b_borrows_16``); team-a's low-priority 16-GPU job (2 pods x
    8), within its nominal, reclaims: exactly two of team-b's three jobs are preempted (the
    16 borrowed; condition Preempted naming team-a's job), the third is never touched, so
    team-b is left at its nominal (8), not below. Reclaim ignores the victims' higher
    priority (``reclaimWithinParent: Any``, the default)."""
    bs = _team_b_borrows_16(guar, "g2")
    guar.submit("a0", "g2-team-a", "guar-low", pods=2)
    victims = _reclaim_plan(guar, "g2")
    assert len(victims) == 2, victims
    assert all(v.startswith("g2-team-b/") for v in victims), victims
    for v in victims:

        def preempted(name: str = v.split("/")[1]) -> dict[str, Any] | None:
            st = guar.hub.status(name, "g2-team-b")
            return st if condition(st, "Preempted") else None

        cond = condition(wait_until(preempted, f"{v} Preempted", ACT_S), "Preempted")
        assert cond is not None
        assert cond["status"] == "True", cond
        assert "g2-team-a/a0" in cond["message"], cond
    [kept] = [n for n in bs if f"g2-team-b/{n}" not in victims]
    guar.never_preempted("g2-team-b", [kept])
    assert "Preempting" in guar.hub.events("a0", "g2-team-a")


def test_the_reclaimed_quota_goes_to_the_reclaimer(guar: Guarantees) -> None:
    """The same reclaim (``_team_b_borrows_16``, 40 H100s still free in the fleet): team-a's
    job runs and team-b ends at its nominal, 8 (its victims wait: at g6-org 8 + 16 = 24 of
    24, and borrowing preempts nothing, ``borrowWithinParent: Never``). In the real hub the
    victims are placed again on other free nodes within a second of their member copies
    going, taking back the 16 of g6-org, and team-a's job waits with "nothing to borrow"."""
    bs = _team_b_borrows_16(guar, "g6")
    guar.submit("a0", "g6-team-a", "guar-low", pods=2)
    victims = [v.split("/")[1] for v in _reclaim_plan(guar, "g6")]

    def settled() -> str | None:
        if guar.hub.phase("a0", "g6-team-a") == "Running":
            return "reclaimer runs"
        back = all(
            guar.hub.status(n, "g6-team-b").get("preemptions")
            and guar.hub.phase(n, "g6-team-b") == "Running"
            for n in victims
        )
        return "victims run again" if back else None

    assert wait_until(settled, "the reclaimer or its victims run", ACT_S) == "reclaimer runs"
    wait_until(lambda: guar.used("g6-team-b") == (8, 0), "g6-team-b back at its nominal, 8")
    wait_until(lambda: guar.used("g6-team-a") == (16, 0), "g6-team-a uses its nominal, 16")
    for name in victims:
        guar.judged(name, "g6-team-b", "g6-team-b uses 8 of 8")
    assert sorted(guar.phases("g6-team-b").values()) == ["Pending", "Pending", "Running"], bs


def test_a_lending_limit_holds_three_levels_deep(guar: Guarantees) -> None:
    """g3-org (16 H100) -> g3-div (no quota) -> g3-team-a (8, ``lendingLimit: 0``) and
    g3-team-b (8). team-b's second 8-GPU job waits although team-a runs nothing (team-a's 8
    are kept back for it at g3-org, two levels up); team-a's job then runs at once. Before
    issue 23 only g3-org's direct child g3-div was read and team-b got all 16."""
    guar.queue("g3-org", quotas=(h100(16),))
    guar.queue("g3-div", parent="g3-org")
    guar.queue(
        "g3-team-a",
        parent="g3-div",
        namespaces=("g3-team-a",),
        quotas=(h100(8, lendingLimit=0),),
    )
    guar.queue("g3-team-b", parent="g3-div", namespaces=("g3-team-b",), quotas=(h100(8),))
    guar.wait_active("g3-org", "g3-div", "g3-team-a", "g3-team-b")

    # b0 first, alone: it must run; then b1, which must wait.
    guar.submit("b0", "g3-team-b", "guar-low")
    guar.all_running("g3-team-b", ["b0"])
    guar.submit("b1", "g3-team-b", "guar-low")
    guar.judged("b1", "g3-team-b", "g3-team-b uses 8 of 8", "nothing to borrow")
    assert guar.phases("g3-team-a") == {}
    guar.never_preempted("g3-team-b", ["b0"])

    guar.submit("a0", "g3-team-a", "guar-low")
    guar.all_running("g3-team-a", ["a0"])
    wait_until(lambda: guar.used("g3-org") == (16, 0), "g3-org uses 16 of 16")
    assert guar.phases("g3-team-b") == {"b0": "Running", "b1": "Pending"}


def test_a_broken_queue_stays_charged_to_its_parents(guar: Guarantees) -> None:
    """g4-org (16 H100) over g4-team-a (16) and g4-team-b (0). team-a runs 16; a queue
    g4-dup that also lists team-a's namespace breaks both (``Active=False``); team-a's jobs
    run on and stay charged to g4-org, so team-b's 8-GPU job waits (before issue 23 the
    broken queue's 16 vanished from g4-org and team-b borrowed them)."""
    guar.queue("g4-org", quotas=(h100(16),))
    guar.queue("g4-team-a", parent="g4-org", namespaces=("g4-team-a",), quotas=(h100(16),))
    guar.queue("g4-team-b", parent="g4-org", namespaces=("g4-team-b",), quotas=(h100(0),))
    guar.wait_active("g4-org", "g4-team-a", "g4-team-b")

    aa = ["a0", "a1"]
    for name in aa:
        guar.submit(name, "g4-team-a", "guar-low")
    guar.all_running("g4-team-a", aa)
    wait_until(lambda: guar.used("g4-org") == (16, 0), "g4-org uses 16 of 16")

    guar.queue("g4-dup", namespaces=("g4-team-a",))
    guar.wait_active("g4-team-a", "g4-dup", want="False")
    cond = condition(guar.queue_status("g4-team-a"), "Active")
    assert cond is not None
    assert "g4-team-a" in cond["message"], cond
    assert guar.active("g4-org") == "True"

    guar.submit("b0", "g4-team-b", "guar-high")
    guar.judged("b0", "g4-team-b", "g4-team-b uses 0 of 0", "g4-org uses 16 of 16")
    guar.never_preempted("g4-team-a", aa)
    assert guar.used("g4-org") == (16, 0)


def test_the_default_queue_is_reclaimed_whatever_its_priority(guar: Guarantees) -> None:
    """Eight high-priority 8-GPU jobs in the drill namespace, which no queue lists (the default
    queue, no GPUQueue of its name: no limit, a guaranteed 0), fill every H100. g5-team-a
    (nominal 8) submits a low-priority 8-GPU job within its nominal: exactly one default-queue
    job is preempted (condition Preempted) and team-a's job runs; the victim waits."""
    guar.queue("g5-team-a", namespaces=("g5-team-a",), quotas=(h100(8),))
    guar.wait_active("g5-team-a")

    fill = [f"d{i}" for i in range(H100_PLAIN // 8)]
    for name in fill:
        guar.submit(name, DRILL_NS, "guar-high")
    guar.all_running(DRILL_NS, fill)
    wait_until(lambda: guar.hub.gpus_free(HGX, H100) == H100_DRA, "every H100 taken", ACT_S)

    guar.submit("a0", "g5-team-a", "guar-low")
    st = guar.hub.wait_phase("a0", "Running", namespace="g5-team-a", timeout_s=ACT_S)
    [victim] = [v["job"] for v in (st.get("preemption") or {}).get("victims") or []]
    ns, name = victim.split("/")
    assert ns == DRILL_NS, victim
    assert name in fill, victim
    vs = guar.hub.wait_phase(name, "Pending", timeout_s=30)
    cond = condition(vs, "Preempted")
    assert cond is not None, vs
    assert cond["status"] == "True", vs
    assert "g5-team-a/a0" in cond["message"], cond
    assert vs.get("preemptions") == 1, vs
    guar.never_preempted(DRILL_NS, [n for n in fill if n != name])
    wait_until(lambda: guar.used("g5-team-a") == (8, 0), "g5-team-a uses its nominal, 8")
