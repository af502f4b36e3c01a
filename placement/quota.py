"""Queues and hierarchical quotas (pure): the queue tree, a job's queue, usage and admission.

Owns the quota *rules* (docs/placement.md, "Queues and quotas"); the hub's scheduling cycle and
the simulator call them, so a simulated result speaks for the hub (STYLE habit 15). No I/O, no
clock. Fair share (decayed usage, queue order) is in :mod:`.fairshare`.

- :func:`build_tree` (in :mod:`.queuetree`, re-exported here) turns GPUQueue specs into a :class:`QueueTree`. Broken queues (a cycle of
  parents, an unknown or broken parent, a namespace listed by two queues, a key listed twice,
  a spec that does not validate) are reported per queue in ``QueueTree.broken`` with a message
  naming the field; the rest of the tree keeps working.
- :func:`queue_of`: the queue of a job (its namespace's queue, an explicit
  ``spec.placement.queue`` that lists the namespace, else the configured default queue).
- :class:`QuotaUsage` (in :mod:`.quotausage`, re-exported here): the one owner of quota usage, per queue and concrete key (GPUs of reserved
  and running jobs), idempotent by job UID (``charge`` / ``release`` / ``rebuild``).
- :func:`admit`: whether ``gpus`` more of one key fit a queue and every ancestor.
- :class:`QuotaGate` / :class:`JobQuota`: what ``place()`` asks per candidate GPU product (the
  ``Quota`` filter).

**Keys.** A job on GPU product ``P`` charges the concrete key ``P`` for its whole GPUs
(``nvidia.com/gpu``) and the resource name for each MIG resource it asks for
(``nvidia.com/mig-1g.10gb``). At each queue the key resolves to an *entry*: the entry for ``P``
if the queue lists it, else ``*`` (whole GPUs only, never MIG), else none. Each queue resolves on
its own, so a team may list ``NVIDIA-H100-80GB-HBM3`` under an organisation that lists only ``*``.

**Nominal** of queue ``n`` for key ``k``: its entry's ``nominal``; with no entry, the sum of its
children's (a grouping queue: its subtree pools its children's quota); a leaf with no entry has
0, or no limit at all when it lists no quotas (the default queue). **Used** ``U(n, k)``: GPUs
charged, by ``n``, its descendants and the broken queues below it (their running jobs stay
charged until they end), to concrete keys that resolve to the same entry at ``n`` (for a
grouping queue, its own plus its children's used). **Cap** ``C(n)``: ``nominal`` at a root,
``nominal + borrowingLimit`` elsewhere (no limit without ``borrowingLimit``).

**Lending limits hold on every edge at every level.** What a subtree does not lend is usable
only inside it, however deep the tree: ``Y(c) = max(X(c), nominal(c) - lendingLimit(c) -
U(c), 0)`` for a queue whose entry has a lending limit, else ``X(c)``, where ``X(n) = Σ Y(c)``
over ``n``'s children: the unused quota ``n``'s subtree keeps back from its parent. The
invariant at every queue with a cap: ``U(n) + X(n) <= C(n)``.

**Admission** of ``g`` GPUs of ``k`` at queue ``q``, whose path to the root is ``q = a0, a1,
…, an``: for every ``ai`` with a cap, ``U(ai) + g + Σ Y(c)`` over the children ``c`` of ``a0 …
ai`` off the path must be at most ``C(ai)``. Off-path reserves count at every ancestor (so a
team's ``lendingLimit: 0`` protects it from a cousin three levels away); the path's own
reserves do not (they are the admitted job's to use). From a state that meets the invariant,
a job is admitted exactly when the state after it still meets it; from one that does not (a
quota lowered below usage), admission never raises any queue's load above its cap. Reserves are
judged per concrete key. Worked example (docs/placement.md, "Quota arithmetic"): ``org``
(nominal 16) over ``div`` (no entry) over ``team-a`` (8, ``lendingLimit: 0``) and ``team-b``
(8): team-b is admitted 8 while team-a uses nothing (8 + 8 kept back for team-a = 16).

:func:`ceiling`: the most of a key a queue could ever be admitted (empty fleet, every other
queue keeping back its non-lendable quota): a job above it never fits and is told so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

from gpufed.api.labels import is_mig_resource
from gpufed.api.queue import ANY_GPU
from gpufed.api.request import PlacementRequest
from gpufed.placement.plugins import Code, Status
from gpufed.placement.queuetree import (
    DEFAULT_QUEUE,
    QueueChoice,
    QueueNode,
    QueueTree,
    build_tree,
    queue_of,
)
from gpufed.placement.quotausage import QuotaUsage, demand_of

__all__ = [  # the tree's names live in .queuetree; quota is the one entry point
    "DEFAULT_QUEUE",
    "QUOTA_PLUGIN",
    "UNLIMITED",
    "Admission",
    "JobQuota",
    "KeyCache",
    "KeyView",
    "QueueChoice",
    "QueueNode",
    "QueueTree",
    "QuotaGate",
    "QuotaUsage",
    "admit",
    "build_tree",
    "ceiling",
    "demand_of",
    "over_limit",
    "pool_keys",
    "queue_of",
]

#: The plugin name of the quota filter in decisions (``gpufed explain``).
QUOTA_PLUGIN: Final = "Quota"
#: Stands for "no limit" in the arithmetic; rendered as ``unlimited``.
UNLIMITED: Final = 1 << 60


def _text(amount: int) -> str:
    return "unlimited" if amount >= UNLIMITED else str(amount)


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer of :func:`admit`: ``ok``; ``borrowed``: how much of the queue's usage would
    be above its nominal with the job; ``reason``: why not (empty when ``ok``)."""

    ok: bool
    borrowed: int = 0
    reason: str = ""


@dataclass
class KeyCache:
    """What :func:`admit` may keep between calls for one key: ``nominal`` and ``lends`` (some
    queue of the subtree has a lending limit) per queue, which depend on the tree only, and
    ``used`` per queue (valid while the ledger has not changed behind the keeper;
    :class:`QuotaGate` drops the entries a charge changes)."""

    nominal: dict[str, int] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)
    lends: dict[str, bool] = field(default_factory=dict)
    #: queue -> :func:`ceiling` of the key (tree only)
    ceiling: dict[str, int] = field(default_factory=dict)
    #: other key -> every queue resolves it to the same entry as this key (tree only)
    same: dict[str, bool] = field(default_factory=dict)
    #: the queues with no entry for the key (tree only)
    bare: tuple[str, ...] | None = None


class KeyView:
    """Nominal, used, cap and reserves per queue for one key, over one ledger state (the
    arithmetic of the module docstring). ``cache`` keeps sums between calls."""

    def __init__(
        self, tree: QueueTree, usage: QuotaUsage, key: str, cache: KeyCache | None = None
    ) -> None:
        self.tree = tree
        self.usage = usage
        self.key = key
        cache = cache if cache is not None else KeyCache()
        self._nominal = cache.nominal
        self._used = cache.used
        self._lends = cache.lends
        self._reserve: dict[str, int] = {}

    def nominal(self, name: str) -> int:
        """``nominal`` of ``name`` for the key (:data:`UNLIMITED` for a queue without limit)."""
        hit = self._nominal.get(name)
        if hit is None:
            node = self.tree.nodes[name]
            e = node.entry(self.key)
            if e is not None:
                hit = e.nominal
            elif node.children:
                hit = min(UNLIMITED, sum(self.nominal(c) for c in node.children))
            else:
                hit = 0 if node.quotas else UNLIMITED
            self._nominal[name] = hit
        return hit

    def guaranteed(self, name: str) -> int:
        """What preemption protects: the nominal, 0 for a queue without any limit (the default
        queue: best effort, so it can be reclaimed from)."""
        n = self.nominal(name)
        return 0 if n >= UNLIMITED else n

    def used(self, name: str) -> int:
        """``U(name)``: its subtree's charges (broken queues below it included) that resolve
        to the same entry at ``name``."""
        hit = self._used.get(name)
        if hit is None:
            node = self.tree.nodes[name]
            e = node.entry(self.key)
            if e is not None:
                sub = self.usage.subtree(self.tree, name)
                hit = sum(a for k, a in sub.items() if node.entry(k) is e)
            else:
                hit = (
                    self.usage.own(name).get(self.key, 0)
                    + sum(self.used(c) for c in node.children)
                    + sum(
                        self.usage.own(o).get(self.key, 0) for o in self.tree.orphans.get(name, ())
                    )
                )
            self._used[name] = hit
        return hit

    def reserve(self, name: str) -> int:
        """``Y(name)``: unused quota ``name``'s subtree keeps back from its parent (its own
        non-lendable part, or more kept below it)."""
        if not self.lends(name):
            return 0
        hit = self._reserve.get(name)
        if hit is None:
            node = self.tree.nodes[name]
            inner = sum(self.reserve(c) for c in node.children)
            e = node.entry(self.key)
            if e is not None and e.lending_limit is not None:
                inner = max(inner, e.nominal - e.lending_limit - self.used(name))
            hit = self._reserve[name] = inner
        return hit

    def lends(self, name: str) -> bool:
        """Whether some queue of ``name``'s subtree has a lending limit for the key (else its
        reserve is 0 whatever the usage)."""
        hit = self._lends.get(name)
        if hit is None:
            node = self.tree.nodes[name]
            e = node.entry(self.key)
            hit = (e is not None and e.lending_limit is not None) or any(
                self.lends(c) for c in node.children
            )
            self._lends[name] = hit
        return hit

    def cap(self, node: QueueNode) -> int:
        """``C(node)``: nominal at a root, nominal + borrowingLimit elsewhere, else no limit."""
        if node.parent is None:
            return self.nominal(node.name)
        e = node.entry(self.key)
        borrow = e.borrowing_limit if e is not None and e.borrowing_limit is not None else None
        if borrow is None:
            return UNLIMITED
        return min(UNLIMITED, self.nominal(node.name) + borrow)


#: Stands for a GPU product no queue lists (it resolves to ``*`` wherever ``*`` is listed) when
#: :func:`admit` judges the pools a charge shares with other keys.
_UNLISTED: Final = "\x00unlisted"


def pool_keys(tree: QueueTree, usage: QuotaUsage, key: str) -> tuple[str, ...]:
    """The concrete keys whose pools a charge of ``key`` may count in somewhere in ``tree``:
    ``key`` first; for a whole-GPU product also every product some queue lists or the ledger
    holds, and one that neither does (``*`` pools); a MIG resource shares no pool with
    another key."""
    if is_mig_resource(key):
        return (key,)
    listed = tree.listed_keys | usage.keys()
    others = sorted(k for k in listed if k not in (ANY_GPU, key) and not is_mig_resource(k))
    return (key, *others, _UNLISTED)


def _shares(path: tuple[QueueNode, ...], key: str, other: str) -> list[bool]:
    """Per node of ``path``: whether a charge of ``key`` at ``path[0]`` counts in ``other``'s
    pool there (the same entry; at a node without one, through its own charges or the child
    on the path)."""
    out: list[bool] = []
    for j, node in enumerate(path):
        e = node.entry(other)
        if e is not None:
            out.append(node.entry(key) is e)
        else:
            out.append(key == other if j == 0 else out[-1])
    return out


def _loads(
    view: KeyView, path: tuple[QueueNode, ...], shares: list[bool]
) -> Iterator[tuple[int, int, int, int]]:
    """(path index, cap, load, reserves kept by others) of each node of ``path`` with a cap
    that a charge counts in (``shares``), queue first.

    The load of a node is its used plus the reserves of every subtree off the path below it
    (module docstring); a path node the charge counts in drops its own reserve term (the job
    uses that reserve), one it does not count in keeps it."""
    inner = 0
    below: str | None = None
    for j, node in enumerate(path):
        inner += sum(view.reserve(c) for c in node.children if c != below)
        if shares[j]:
            cap = view.cap(node)
            if cap < UNLIMITED:
                yield j, cap, view.used(node.name) + inner, inner
        else:
            e = node.entry(view.key)
            if e is not None and e.lending_limit is not None:
                inner = max(inner, e.nominal - e.lending_limit - view.used(node.name))
        below = node.name


def _implied(
    tree: QueueTree, usage: QuotaUsage, key: str, other: str, cache: KeyCache | None
) -> bool:
    """Whether ``other``'s pools are judged by ``key``'s check already: every queue resolves
    both to the same entry (so nominal, caps and reserves agree) and no queue without an entry
    (or broken queue, charged to one) holds charges of ``other`` itself (the one way its used
    could differ)."""
    cache = cache if cache is not None else KeyCache()
    same = cache.same.get(other)
    if same is None:
        same = cache.same[other] = all(n.entry(key) is n.entry(other) for n in tree.nodes.values())
    if not same:
        return False
    if cache.bare is None:
        cache.bare = tuple(n.name for n in tree.nodes.values() if n.entry(key) is None)
    if other == _UNLISTED:
        return True
    broken = (o for names in tree.orphans.values() for o in names)
    return not any(usage.own(b).get(other) for b in (*cache.bare, *broken))


def admit(
    tree: QueueTree,
    usage: QuotaUsage,
    queue: str,
    key: str,
    gpus: int,
    *,
    cache: KeyCache | None = None,
    caches: Callable[[str], KeyCache] | None = None,
) -> Admission:
    """Whether ``gpus`` more of concrete ``key`` fit ``queue`` and every ancestor (module doc).

    Every pool the charge counts in is judged: ``key``'s own at each ancestor and, in a tree
    that lists several products, the pools of the other keys it shares an entry with (a ``*``
    entry pools every product it covers). ``cache``: sums for ``key`` kept between calls
    (:class:`KeyCache`, by :class:`QuotaGate`); ``caches``: the same for any key (``cache``
    defaults to ``caches(key)``).

    A broken queue admits nothing (its message is the reason); an unknown queue neither.
    Example reason: ``team-a uses 60 of 64 NVIDIA-H100-80GB-HBM3; 8 more needed; nothing to
    borrow: research lends 0 (research uses 128 of 128)``.
    """
    if queue in tree.broken:
        return Admission(False, reason=f"queue {queue} is not active: {tree.broken[queue]}")
    path = tree.path(queue)
    if not path:
        return Admission(False, reason=f"queue {queue} does not exist")
    if cache is None and caches is not None:
        cache = caches(key)
    view = KeyView(tree, usage, key, cache)
    for other in pool_keys(tree, usage, key):
        if other != key and _implied(tree, usage, key, other, cache):
            continue
        shares = _shares(path, key, other)
        if not any(shares):
            continue
        v = view if other == key else KeyView(tree, usage, other, caches and caches(other))
        hit = next((x for x in _loads(v, path, shares) if x[2] + gpus > x[1]), None)
        if hit is None:
            continue
        i, cap, load, kept = hit
        reason = _refusal(v, path, i, gpus, cap, load, kept)
        top = cache.ceiling.get(queue) if cache is not None else None
        if top is None:
            top = ceiling(tree, queue, key)
            if cache is not None:
                cache.ceiling[queue] = top
        if gpus > top:
            reason += f"; {queue} can never be admitted more than {top} (its ceiling)"
        return Admission(False, reason=reason)
    q = path[0].name
    borrowed = max(0, view.used(q) + gpus - view.nominal(q))
    return Admission(True, borrowed=borrowed)


def ceiling(tree: QueueTree, queue: str, key: str) -> int:
    """The most GPUs of concrete ``key`` a job of ``queue`` could ever be admitted: what
    :func:`admit` allows on an empty ledger (every other queue keeping back its non-lendable
    quota). :data:`UNLIMITED` when nothing limits it; 0 for a broken or unknown queue."""
    if queue in tree.broken:
        return 0
    path = tree.path(queue)
    if not path:
        return 0
    empty = QuotaUsage()
    top = min(
        (
            cap - load
            for other in pool_keys(tree, empty, key)
            for _, cap, load, _ in _loads(
                KeyView(tree, empty, other), path, _shares(path, key, other)
            )
        ),
        default=UNLIMITED,
    )
    return max(0, top)


def _refusal(
    view: KeyView, path: tuple[QueueNode, ...], i: int, gpus: int, cap: int, load: int, held: int
) -> str:
    q = path[0]
    e = q.entry(view.key)
    label = e.gpu_product if e is not None and e.gpu_product != ANY_GPU else view.key
    if label == _UNLISTED:
        label = "GPUs of its * entry"
    text = (
        f"{q.name} uses {view.used(q.name)} of {_text(view.nominal(q.name))} {label}; "
        f"{gpus} more needed"
    )
    if i == 0:
        if q.parent is None:
            return f"{text}; {q.name} has no parent queue to borrow from"
        limit = e.borrowing_limit if e is not None else None
        return f"{text}; borrowing limit {limit} of {q.name} reached ({_text(cap)} at most)"
    a = path[i]
    lends = max(0, cap - load)
    extra = f", {held} kept by queues that lend less" if held else ""
    detail = f"{a.name} uses {view.used(a.name)} of {_text(cap)}{extra}"
    if lends == 0:
        return f"{text}; nothing to borrow: {a.name} lends 0 ({detail})"
    return f"{text}; only {lends} to borrow: {a.name} lends {lends} ({detail})"


@dataclass(frozen=True)
class JobQuota:
    """The ``Quota`` filter for one job: which GPU products its queue can admit now.

    Built by :meth:`QuotaGate.for_request`; ``place()`` calls :meth:`status` per candidate
    pool (memoised per product within the job).
    """

    tree: QueueTree
    usage: QuotaUsage
    queue: str
    request: PlacementRequest
    gate_cache: Callable[[str], KeyCache] | None = None
    _seen: dict[str | None, Status] = field(default_factory=dict)

    name = QUOTA_PLUGIN

    def status(self, product: str | None) -> Status:
        """``SUCCESS``, or ``Unschedulable`` with the admission's reason, for ``product``."""
        hit = self._seen.get(product)
        if hit is None:
            hit = Status(Code.SUCCESS)
            for key, amount in sorted(demand_of(self.request, product).items()):
                a = admit(self.tree, self.usage, self.queue, key, amount, caches=self.gate_cache)
                if not a.ok:
                    hit = Status(Code.UNSCHEDULABLE, a.reason)
                    break
            self._seen[product] = hit
        return hit


@dataclass
class QuotaGate:
    """Quota admission for a scheduling pass: the tree and the ledger, and the enforce switch.

    ``enforce=False`` (the simulator's ``--quota-mode none``): usage is only accounted.
    """

    tree: QueueTree
    usage: QuotaUsage = field(default_factory=QuotaUsage)
    enforce: bool = True
    # key -> queue -> used, valid at ledger version _cached_at (only the gate's own charges
    # and releases keep it: they drop the entries on the job's path)
    _keys: dict[str, KeyCache] = field(default_factory=dict)
    _cached_at: int = -1
    _unlimited: dict[str, bool] = field(default_factory=dict)

    def _cache(self, key: str) -> KeyCache:
        if self._cached_at != self.usage.version:
            for stale in self._keys.values():
                stale.used.clear()
            self._cached_at = self.usage.version
        hit = self._keys.get(key)
        if hit is None:
            hit = self._keys[key] = KeyCache()
        return hit

    def _changed(self, queue: str, before: int) -> None:
        if self._cached_at == before:
            path = [queue, *(n.name for n in self.tree.charged_path(queue))]
            for kc in self._keys.values():
                for name in path:
                    kc.used.pop(name, None)
            self._cached_at = self.usage.version

    def queue(self, request: PlacementRequest) -> str:
        """The queue a request is charged to (``request.queue``, else the default queue)."""
        return request.queue if request.queue is not None else self.tree.default_queue

    def for_request(self, request: PlacementRequest) -> JobQuota | None:
        """The filter ``place()`` runs for ``request``, or None when nothing limits it."""
        q = self.queue(request)
        if not self.enforce:
            return None
        free = self._unlimited.get(q)
        if free is None:
            free = self._unlimited[q] = q not in self.tree.broken and self.tree.unlimited(q)
        if free:
            return None
        return JobQuota(self.tree, self.usage, q, request, self._cache)

    def charge(self, request: PlacementRequest, product: str | None) -> None:
        """Charge a placed ``request`` (on GPU ``product``) to its queue."""
        before, q = self.usage.version, self.queue(request)
        prev = self.usage.queue_of_job(request.uid)
        self.usage.charge_demand(request.uid, q, demand_of(request, product))
        if prev is not None and prev != q:
            self._changed(prev, before)
            before = self._cached_at
        self._changed(q, before)

    def release(self, job_uid: str) -> None:
        """Release a job that finished or lost its reservation."""
        before, q = self.usage.version, self.usage.queue_of_job(job_uid)
        self.usage.release(job_uid)
        if q is not None:
            self._changed(q, before)

    @contextmanager
    def lifted(self, job_uid: str) -> Iterator[None]:
        """Within the block ``job_uid``'s own charge (a preemptor's hold) does not count
        against it; on exit it is back unless the block charged the job again (it was placed
        and charged for its placement)."""
        prev = self.usage.charged(job_uid)
        if prev is None:
            yield
            return
        self.release(job_uid)
        try:
            yield
        finally:
            if not self.usage.holds(job_uid):
                before = self.usage.version
                self.usage.charge_demand(job_uid, prev[0], prev[1])
                self._changed(prev[0], before)


def over_limit(tree: QueueTree, usage: QuotaUsage) -> list[str]:
    """Every quota entry used above its limit now, as ``queue key: used > limit``.

    The limit is ``nominal + borrowingLimit`` (``nominal`` at a root; no limit for a non-root
    entry without ``borrowingLimit``). Under admission by :func:`admit` this stays empty; a
    quota lowered below usage, or ``--quota-mode none`` in the simulator, shows here.
    """
    out: list[str] = []
    for name in sorted(tree.nodes):
        node = tree.nodes[name]
        for key, e in sorted(node.quotas.items()):
            if node.parent is None:
                cap = e.nominal
            elif e.borrowing_limit is None:
                continue
            else:
                cap = e.nominal + e.borrowing_limit
            used = KeyView(tree, usage, key).used(name)
            if used > cap:
                out.append(f"{name} {key}: {used} > {cap}")
    return out


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One quota key of a queue as ``GPUQueue.status.usage`` shows it (GPUs or MIG slices):
    ``nominal``, ``used`` (its subtree's reserved and running jobs) and ``borrowed`` (the part
    of ``used`` above ``nominal``)."""

    key: str
    nominal: int
    used: int
    borrowed: int


def usage_rows(tree: QueueTree, usage: QuotaUsage, queue: str) -> list[UsageRow]:
    """The usage of ``queue`` per quota key, sorted by key: its own entries; for a grouping
    queue (no entry of its own), the keys its descendants list (nominal: their sum). Keys
    with no limit are left out (the default queue has no rows); so is a broken or unknown
    queue. Same arithmetic as :func:`admit`."""
    node = tree.nodes.get(queue)
    if node is None:
        return []
    keys = set(node.quotas)
    if not keys:
        stack = list(node.children)
        while stack:
            child = tree.nodes[stack.pop()]
            keys.update(child.quotas)
            stack.extend(child.children)
    out = []
    for key in sorted(keys):
        view = KeyView(tree, usage, key)
        nominal = view.nominal(queue)
        if nominal >= UNLIMITED:
            continue
        used = view.used(queue)
        out.append(UsageRow(key, nominal, used, max(0, used - nominal)))
    return out
