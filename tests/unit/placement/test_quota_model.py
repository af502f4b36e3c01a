"""Model-based test of quota admission against an independent reference (Hypothesis stateful).

Random GPUQueue trees of 2-4 levels with random nominal / borrowing / lending limits on ``*``
and product entries; random steps: submissions at random queues and products, completions,
quota edits (which may leave usage above a new limit), and breaking and fixing a queue (a
second queue listing its namespace). After every admission the state is checked against
:mod:`quota_reference` (its own arithmetic, never ``admit`` / ``over_limit``):

1. from a state within every limit, ``admit`` says yes exactly when the state after the job
   is still within every limit, at every queue, for every product (the reference's ``load <=
   cap``: usage plus what subtrees keep back under their lending limits);
2. from any state, an admitted job never raises any queue's load or usage above both its cap
   and what it was before (a quota lowered below usage is not made worse);
3. ``ceiling`` is the largest job the queue is admitted on an empty fleet.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from quota_builders import A100, H100
from quota_reference import ANY, INF, Entry, Job, Reference, Spec

from gpufed.api.gpujob import ObjectMeta
from gpufed.api.queue import GPUQueue, GPUQueueSpec, QueueQuota
from gpufed.placement.quota import UNLIMITED, QuotaUsage, admit, build_tree, ceiling

PRODUCTS = (H100, A100)  # A100 is never listed: it resolves to "*" (or nothing)
MAX_QUEUES = 7


def _entries() -> st.SearchStrategy[dict[str, Entry]]:
    entry = st.builds(
        Entry,
        nominal=st.integers(0, 24),
        borrowing=st.none() | st.integers(0, 12),
        lending=st.none() | st.integers(0, 12),
    )
    return st.dictionaries(st.sampled_from((ANY, H100)), entry, max_size=2)


@st.composite
def trees(draw: Any) -> dict[str, Spec]:
    """1-2 roots and up to 7 queues, at most 4 levels; parents come before children."""
    specs: dict[str, Spec] = {}
    depth: dict[str, int] = {}
    n = draw(st.integers(2, MAX_QUEUES))
    for i in range(n):
        name = f"q{i}"
        parents = [p for p in specs if depth[p] < 3]
        parent = None
        if i > 0 and parents and draw(st.integers(0, 4)) > 0:
            parent = draw(st.sampled_from(parents))
        specs[name] = Spec(parent, draw(_entries()), (name,))
        depth[name] = 0 if parent is None else depth[parent] + 1
    return specs


def _gpu_queues(specs: dict[str, Spec]) -> list[GPUQueue]:
    return [
        GPUQueue(
            metadata=ObjectMeta(name=name),
            spec=GPUQueueSpec(
                parent=s.parent,
                namespaces=list(s.namespaces),
                quotas=[
                    QueueQuota(
                        gpu_product=k,
                        nominal=e.nominal,
                        borrowing_limit=e.borrowing,
                        lending_limit=e.lending,
                    )
                    for k, e in sorted(s.quotas.items())
                ],
            ),
        )
        for name, s in sorted(specs.items())
    ]


class QuotaModel(RuleBasedStateMachine):
    """Admission as the hub does it (``admit``, then ``charge``) against the reference."""

    def __init__(self) -> None:
        super().__init__()
        self.specs: dict[str, Spec] = {}
        self.jobs: list[Job] = []
        self.usage = QuotaUsage()
        self.serial = 0
        self.admitted = 0

    def _tree(self) -> Any:
        return build_tree(_gpu_queues(self.specs))

    def _ref(self, jobs: list[Job] | None = None) -> Reference:
        return Reference(self.specs, self.jobs if jobs is None else jobs)

    @initialize(specs=trees())
    def start(self, specs: dict[str, Spec]) -> None:
        self.specs = specs

    @rule(data=st.data(), key=st.sampled_from(PRODUCTS), gpus=st.integers(1, 16))
    def submit(self, data: Any, key: str, gpus: int) -> None:
        queue = data.draw(st.sampled_from([*sorted(self.specs), "default"]))
        tree = self._tree()
        ok = admit(tree, self.usage, queue, key, gpus).ok
        before = self._ref()
        job = Job(f"j{self.serial}", queue, key, gpus)
        self.serial += 1
        after = self._ref([*self.jobs, job])
        if queue in before.broken:
            assert not ok, f"broken queue {queue} admitted a job"
            return
        if not before.violations(PRODUCTS):
            assert ok == (not after.violations(PRODUCTS)), (
                f"admit said {ok} for {gpus} {key} at {queue}; reference after: "
                f"{after.violations(PRODUCTS)}"
            )
        if ok:
            for n in after.accepted():
                for k in PRODUCTS:
                    cap = after.cap(n, k)
                    assert after.load(n, k) <= max(before.load(n, k), cap), (n, k)
                    assert after.used(n, k) <= max(before.used(n, k), cap), (n, k)
            self.jobs.append(job)
            self.usage.charge(job.uid, queue, key, gpus)
            self.admitted += 1

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def complete(self, data: Any) -> None:
        job = data.draw(st.sampled_from(self.jobs))
        self.jobs.remove(job)
        self.usage.release(job.uid)

    @rule(data=st.data(), entries=_entries())
    def edit_quota(self, data: Any, entries: dict[str, Entry]) -> None:
        name = data.draw(st.sampled_from(sorted(self.specs)))
        self.specs[name] = Spec(self.specs[name].parent, entries, self.specs[name].namespaces)

    @rule(data=st.data())
    def break_or_fix(self, data: Any) -> None:
        """A thief queue lists a victim queue's namespace (both break), or goes away."""
        if "thief" in self.specs:
            del self.specs["thief"]
            return
        victim = data.draw(st.sampled_from(sorted(self.specs)))
        parent = data.draw(st.sampled_from([None, *sorted(n for n in self.specs if n != victim)]))
        self.specs["thief"] = Spec(parent, {}, (victim,))

    @invariant()
    def ceiling_is_the_largest_job_an_empty_fleet_admits(self) -> None:
        if not self.specs:
            return
        tree = self._tree()
        for queue in sorted(self.specs)[:3]:
            if queue in tree.broken:
                assert ceiling(tree, queue, H100) == 0
                continue
            empty = self._ref([])
            if empty.violations(PRODUCTS):
                continue  # reserves alone exceed a cap: no ceiling is meaningful
            top = ceiling(tree, queue, H100)
            for g in (top, top + 1) if top < UNLIMITED else (10**6,):
                fits = not self._ref([Job("x", queue, H100, g)]).violations(PRODUCTS)
                assert fits == (g <= top), (queue, g, top)

    def teardown(self) -> None:
        # the reference agrees with the ledger's raw usage (a check of the harness itself)
        ref = self._ref()
        for job in self.jobs:
            assert self.usage.holds(job.uid)
        assert INF not in (ref.used(n, H100) for n in ref.accepted())


TestQuotaModel = QuotaModel.TestCase
TestQuotaModel.settings = settings(
    max_examples=100,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
