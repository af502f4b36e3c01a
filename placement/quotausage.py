"""The quota usage ledger (pure): GPUs charged per job and queue, and what a job charges.

Split out of :mod:`.quota` (which re-exports both names and owns the admission rules that read
the ledger; docs/placement.md, "Queues and quotas"). :class:`QuotaUsage` is the one owner of
quota usage: the hub's scheduling cycle and the simulator charge and release through it.
:func:`demand_of` is the concrete keys a placed job charges. No I/O, no clock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufed.api.labels import GPU_RESOURCE, is_mig_resource
from gpufed.api.request import PlacementRequest
from gpufed.placement.queuetree import QueueTree


@dataclass
class QuotaUsage:
    """The quota usage ledger: per job UID, its queue and amounts per concrete key.

    ``charge`` on reservation, ``release`` when the job finishes (or its reservation is dropped);
    both are idempotent by job UID, so a ledger rebuilt from the hub's records (``rebuild``)
    after a restart never doubles or loses a job. Amounts are GPUs (MIG keys: slices).
    """

    _jobs: dict[str, tuple[str, dict[str, int]]] = field(default_factory=dict)
    _own: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    #: bumped on every change (caches of derived sums compare it)
    version: int = 0
    _keys: frozenset[str] = frozenset()
    _keys_at: int = -1

    def charge(self, job_uid: str, queue: str, key: str, gpus: int) -> None:
        """Record that ``job_uid`` of ``queue`` holds ``gpus`` of ``key`` (replacing any
        earlier amount of that key; a different queue moves the whole job). ``gpus`` >= 0."""
        if gpus < 0:
            raise ValueError(f"gpus: {gpus} is negative")
        prev = self._jobs.get(job_uid)
        if prev is not None and prev[0] != queue:
            self.release(job_uid)
            prev = None
        amounts = prev[1] if prev is not None else {}
        self._add(queue, key, gpus - amounts.get(key, 0))
        amounts[key] = gpus
        self._jobs[job_uid] = (queue, amounts)

    def charge_demand(self, job_uid: str, queue: str, demand: Mapping[str, int]) -> None:
        """``charge`` every key of ``demand`` (see :func:`demand_of`)."""
        for key, amount in demand.items():
            self.charge(job_uid, queue, key, amount)

    def release(self, job_uid: str) -> None:
        """Forget ``job_uid`` (no-op when unknown)."""
        prev = self._jobs.pop(job_uid, None)
        if prev is not None:
            for key, amount in prev[1].items():
                self._add(prev[0], key, -amount)

    def rebuild(self, jobs: Iterable[tuple[str, str, Mapping[str, int]]]) -> None:
        """Replace everything with ``(job_uid, queue, demand)`` rows (a uid twice: the last)."""
        self._jobs.clear()
        self._own.clear()
        self.version += 1
        for uid, queue, demand in jobs:
            self.release(uid)
            self.charge_demand(uid, queue, demand)

    def _add(self, queue: str, key: str, delta: int) -> None:
        if delta:
            self.version += 1
            own = self._own[queue]
            left = own.get(key, 0) + delta
            if left:
                own[key] = left
            else:
                own.pop(key, None)

    def keys(self) -> frozenset[str]:
        """Every concrete key some queue is charged for now."""
        if self._keys_at != self.version:
            self._keys = frozenset(k for own in self._own.values() for k in own)
            self._keys_at = self.version
        return self._keys

    def holds(self, job_uid: str) -> bool:
        """True when ``job_uid`` is charged."""
        return job_uid in self._jobs

    def charged(self, job_uid: str) -> tuple[str, dict[str, int]] | None:
        """(queue, key -> amount) ``job_uid`` is charged (a copy), or None."""
        prev = self._jobs.get(job_uid)
        return (prev[0], dict(prev[1])) if prev is not None else None

    def queue_of_job(self, job_uid: str) -> str | None:
        """The queue ``job_uid`` is charged to (None when not charged)."""
        prev = self._jobs.get(job_uid)
        return prev[0] if prev is not None else None

    def own(self, queue: str) -> Mapping[str, int]:
        """Concrete key -> amount charged by ``queue``'s own jobs."""
        return self._own.get(queue, {})

    def jobs(self) -> int:
        """Jobs charged."""
        return len(self._jobs)

    def subtree(self, tree: QueueTree, queue: str) -> dict[str, int]:
        """Concrete key -> amount charged by ``queue``, its descendants and the broken queues
        below it (``QueueTree.orphans``)."""
        out: dict[str, int] = {}
        stack = [queue]
        while stack:
            name = stack.pop()
            for owner in (name, *tree.orphans.get(name, ())):
                for key, amount in self.own(owner).items():
                    out[key] = out.get(key, 0) + amount
            node = tree.nodes.get(name)
            if node is not None:
                stack.extend(node.children)
        return out


def demand_of(request: PlacementRequest, product: str | None) -> dict[str, int]:
    """Concrete key -> amount ``request`` charges when placed on GPU ``product``.

    Whole GPUs under ``product`` (``nvidia.com/gpu`` on a pool of that product), MIG resources
    under their resource names; a job with neither charges nothing.
    """
    out: dict[str, int] = {}
    for ps in request.pod_sets:
        for res, amount in ps.requests.items():
            if amount <= 0:
                continue
            if res == GPU_RESOURCE and product is not None:
                out[product] = out.get(product, 0) + amount * ps.count
            elif is_mig_resource(res):
                out[res] = out.get(res, 0) + amount * ps.count
    return out
