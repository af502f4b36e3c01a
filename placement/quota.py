"""Queues and hierarchical quotas (pure): the queue tree, a job's queue, usage and admission.

Owns the quota *rules* (docs/placement.md, "Queues and quotas"); the hub's scheduling cycle and
the simulator call them, so a simulated result speaks for the hub (STYLE habit 15). No I/O, no
clock. Fair share (decayed usage, queue order) is in :mod:`.fairshare`.

- :func:`build_tree` turns GPUQueue specs into a :class:`QueueTree`. Broken queues (a cycle of
  parents, an unknown or broken parent, a namespace listed by two queues, a key listed twice,
  a spec that does not validate) are reported per queue in ``QueueTree.broken`` with a message
  naming the field; the rest of the tree keeps working.
- :func:`queue_of`: the queue of a job (its namespace's queue, an explicit
  ``spec.placement.queue`` that lists the namespace, else the configured default queue).
- :class:`QuotaUsage`: the one owner of quota usage, per queue and concrete key (GPUs of reserved
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
charged, by ``n`` and its descendants, to concrete keys that resolve to the same entry at ``n``
(for a grouping queue, its own plus its children's used). **Reserved** ``R(c, k) = max(0,
nominal - lendingLimit - U)``: the unused part of ``c``'s nominal that others may not borrow.

**Admission** of ``g`` GPUs of ``k`` at queue ``q``, whose path to the root is
``q = a0, a1, …, an``: for every ``ai``, ``U(ai) + g + Σ R(c)`` over the children ``c`` of ``ai``
off the path must be at most ``nominal(ai) + borrowingLimit(ai)``; the borrowing limit is
unlimited when absent (a grouping queue's too), and 0 at the root (there is nothing above it to
borrow from). So a queue goes above its nominal only with room its ancestors still have, i.e.
unused quota of its siblings and of the rest of its tree, within their lending limits: Kueue's
cohort semantics, with an ancestor's nominal as an organisation-wide cap over its teams.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from gpufed.api.labels import GPU_RESOURCE, is_mig_resource
from gpufed.api.queue import ANY_GPU, GPUQueue, QueueQuota
from gpufed.api.request import PlacementRequest
from gpufed.placement.plugins import Code, Status

#: The plugin name of the quota filter in decisions (``gpufed explain``).
QUOTA_PLUGIN: Final = "Quota"
#: Stands for "no limit" in the arithmetic; rendered as ``unlimited``.
UNLIMITED: Final = 1 << 60
#: The hub's default queue name (``--default-queue``).
DEFAULT_QUEUE: Final = "default"


def _text(amount: int) -> str:
    return "unlimited" if amount >= UNLIMITED else str(amount)


@dataclass(frozen=True, slots=True)
class QueueNode:
    """One queue of the tree.

    ``quotas``: key -> entry (``*``, products, MIG resources); ``limited``: the queue lists at
    least one quota (a leaf with none is unlimited). ``children``: names, sorted.
    """

    name: str
    parent: str | None
    namespaces: tuple[str, ...]
    quotas: Mapping[str, QueueQuota]
    weight: int
    children: tuple[str, ...] = ()

    def entry(self, key: str) -> QueueQuota | None:
        """The entry ``key`` resolves to here: exact, else ``*`` for a whole-GPU product."""
        hit = self.quotas.get(key)
        if hit is None and not is_mig_resource(key):
            hit = self.quotas.get(ANY_GPU)
        return hit


@dataclass(frozen=True)
class QueueTree:
    """The accepted queues, the broken ones with their message, and the namespace map.

    ``nodes``: every queue that admits (broken ones are left out; the default queue is always
    present, unlimited unless a GPUQueue of that name says otherwise). ``broken``: queue name
    -> message naming the field (for its ``Active=False`` condition and its jobs' reason).
    ``namespaces``: hub namespace -> queue name (a namespace two queues list maps to the first
    of them by name, which is broken).
    """

    nodes: Mapping[str, QueueNode]
    broken: Mapping[str, str]
    namespaces: Mapping[str, str]
    default_queue: str = DEFAULT_QUEUE

    def path(self, queue: str) -> tuple[QueueNode, ...]:
        """``queue`` and its ancestors, the queue first, the root last (empty if unknown)."""
        out: list[QueueNode] = []
        node = self.nodes.get(queue)
        while node is not None:
            out.append(node)
            node = self.nodes.get(node.parent) if node.parent is not None else None
        return tuple(out)

    def known(self, queue: str) -> bool:
        """True for an accepted or a broken queue."""
        return queue in self.nodes or queue in self.broken

    def unlimited(self, queue: str) -> bool:
        """True when no queue on ``queue``'s path lists any quota (admission always passes)."""
        p = self.path(queue)
        return bool(p) and not any(n.quotas for n in p) and not any(n.children for n in p)


def build_tree(
    queues: Iterable[GPUQueue],
    *,
    invalid: Mapping[str, str] | None = None,
    default_queue: str = DEFAULT_QUEUE,
) -> QueueTree:
    """Build the tree from validated GPUQueues; report each broken queue with its field.

    ``invalid``: queue name -> message, for objects whose spec did not validate (the hub parses
    them; such a queue is broken and so is every queue under it). Deterministic: the order of
    ``queues`` does not matter. Raises nothing for bad specs.
    """
    broken: dict[str, str] = dict(invalid or {})
    specs = {q.metadata.name: q.spec for q in queues if q.metadata.name not in broken}
    # 1. keys listed twice
    for name, spec in specs.items():
        seen: dict[str, int] = {}
        for i, qq in enumerate(spec.quotas):
            if qq.gpu_product in seen:
                broken[name] = (
                    f"spec.quotas[{i}].gpuProduct: {qq.gpu_product} is listed twice (also "
                    f"spec.quotas[{seen[qq.gpu_product]}]); list each key once"
                )
                break
            seen[qq.gpu_product] = i
    # 2. namespaces listed by two queues: every queue that lists one is broken
    owners: dict[str, list[str]] = defaultdict(list)
    for name in sorted(specs):
        for ns in specs[name].namespaces:
            owners[ns].append(name)
    for ns, names in sorted(owners.items()):
        if len(names) > 1:
            for name in names:
                others = ", ".join(n for n in names if n != name)
                broken.setdefault(
                    name,
                    f"spec.namespaces: namespace {ns} is also listed by queue {others}; "
                    "list each namespace in one queue",
                )
    # 3. parents: unknown, cycles, broken ancestors (iterative walk; no recursion)
    for name in sorted(specs):
        spec = specs[name]
        if spec.parent is not None and spec.parent not in specs and spec.parent not in broken:
            broken.setdefault(
                name,
                f"spec.parent: queue {spec.parent} does not exist; create it or remove spec.parent",
            )
    for name in sorted(specs):
        chain = [name]
        cur = specs[name].parent
        while cur is not None and cur in specs and cur not in chain:
            chain.append(cur)
            cur = specs[cur].parent
        if cur is not None and cur in chain:
            cycle = [*chain[chain.index(cur) :], cur]
            if name in cycle[:-1]:
                broken.setdefault(
                    name,
                    f"spec.parent: cycle {' -> '.join(cycle)}; a queue may not be its own ancestor",
                )
    changed = True
    while changed:
        changed = False
        for name in sorted(specs):
            parent = specs[name].parent
            if name not in broken and parent is not None and parent in broken:
                broken[name] = (
                    f"spec.parent: parent queue {parent} is not active ({broken[parent]})"
                )
                changed = True
    # 4. nodes
    good = {n: s for n, s in specs.items() if n not in broken}
    children: dict[str, list[str]] = defaultdict(list)
    for name, spec in good.items():
        if spec.parent is not None:
            children[spec.parent].append(name)
    nodes = {
        name: QueueNode(
            name=name,
            parent=spec.parent,
            namespaces=tuple(spec.namespaces),
            quotas={qq.gpu_product: qq for qq in spec.quotas},
            weight=spec.fair_share.weight,
            children=tuple(sorted(children.get(name, ()))),
        )
        for name, spec in good.items()
    }
    if default_queue not in nodes and default_queue not in broken:
        nodes[default_queue] = QueueNode(default_queue, None, (), {}, 1)
    return QueueTree(
        nodes=nodes,
        broken=broken,
        namespaces={ns: names[0] for ns, names in owners.items()},
        default_queue=default_queue,
    )


@dataclass(frozen=True, slots=True)
class QueueChoice:
    """The queue of a job, or why it has none (``error`` names ``spec.placement.queue``)."""

    queue: str
    error: str | None = None


def queue_of(tree: QueueTree, namespace: str, explicit: str | None = None) -> QueueChoice:
    """The queue of a job in hub namespace ``namespace``.

    The queue that lists the namespace; else the default queue. An ``explicit``
    ``spec.placement.queue`` must name that same queue (or the default queue, for a namespace
    no queue lists); otherwise ``error`` says so, and the job waits with it.
    """
    listed = tree.namespaces.get(namespace)
    home = listed if listed is not None else tree.default_queue
    if explicit is None or explicit == home:
        return QueueChoice(home)
    if not tree.known(explicit):
        return QueueChoice(
            home,
            f"spec.placement.queue: queue {explicit} does not exist; leave it unset "
            f"(namespace {namespace} belongs to {home})",
        )
    return QueueChoice(
        home,
        f"spec.placement.queue: queue {explicit} does not list namespace {namespace}; leave "
        f"it unset or name {home}",
    )


@dataclass
class QuotaUsage:
    """The quota usage ledger: per job UID, its queue and amounts per concrete key.

    ``charge`` on reservation, ``release`` when the job finishes (or its reservation is dropped);
    both are idempotent by job UID, so a ledger rebuilt from the hub's records (``rebuild``)
    after a restart never doubles or loses a job. Amounts are GPUs (MIG keys: slices).
    """

    _jobs: dict[str, tuple[str, dict[str, int]]] = field(default_factory=dict)
    _own: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))

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
        for uid, queue, demand in jobs:
            self.release(uid)
            self.charge_demand(uid, queue, demand)

    def _add(self, queue: str, key: str, delta: int) -> None:
        if delta:
            own = self._own[queue]
            left = own.get(key, 0) + delta
            if left:
                own[key] = left
            else:
                own.pop(key, None)

    def holds(self, job_uid: str) -> bool:
        """True when ``job_uid`` is charged."""
        return job_uid in self._jobs

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
        """Concrete key -> amount charged by ``queue`` and its descendants."""
        out: dict[str, int] = {}
        stack = [queue]
        while stack:
            name = stack.pop()
            for key, amount in self.own(name).items():
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


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer of :func:`admit`: ``ok``; ``borrowed``: how much of the queue's usage would
    be above its nominal with the job; ``reason``: why not (empty when ``ok``)."""

    ok: bool
    borrowed: int = 0
    reason: str = ""


class _View:
    """Nominal, used and reserved per queue for one key, over one ledger state."""

    def __init__(self, tree: QueueTree, usage: QuotaUsage, key: str) -> None:
        self.tree = tree
        self.usage = usage
        self.key = key
        self._nominal: dict[str, int] = {}
        self._used: dict[str, int] = {}

    def nominal(self, name: str) -> int:
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

    def used(self, name: str) -> int:
        hit = self._used.get(name)
        if hit is None:
            node = self.tree.nodes[name]
            e = node.entry(self.key)
            if e is not None:
                sub = self.usage.subtree(self.tree, name)
                hit = sum(a for k, a in sub.items() if node.entry(k) is e)
            else:
                hit = self.usage.own(name).get(self.key, 0) + sum(
                    self.used(c) for c in node.children
                )
            self._used[name] = hit
        return hit

    def reserved(self, name: str) -> int:
        e = self.tree.nodes[name].entry(self.key)
        if e is None or e.lending_limit is None:
            return 0
        return max(0, e.nominal - e.lending_limit - self.used(name))

    def cap(self, node: QueueNode) -> int:
        if node.parent is None:
            return self.nominal(node.name)
        e = node.entry(self.key)
        borrow = e.borrowing_limit if e is not None and e.borrowing_limit is not None else None
        if borrow is None:
            return UNLIMITED
        return min(UNLIMITED, self.nominal(node.name) + borrow)


def admit(tree: QueueTree, usage: QuotaUsage, queue: str, key: str, gpus: int) -> Admission:
    """Whether ``gpus`` more of concrete ``key`` fit ``queue`` and every ancestor (module doc).

    A broken queue admits nothing (its message is the reason); an unknown queue neither.
    Example reason: ``team-a uses 60 of 64 NVIDIA-H100-80GB-HBM3; 8 more needed; nothing to
    borrow: research lends 0 (research uses 128 of 128)``.
    """
    if queue in tree.broken:
        return Admission(False, reason=f"queue {queue} is not active: {tree.broken[queue]}")
    path = tree.path(queue)
    if not path:
        return Admission(False, reason=f"queue {queue} does not exist")
    view = _View(tree, usage, key)
    on_path = {n.name for n in path}
    for i, node in enumerate(path):
        cap = view.cap(node)
        if cap >= UNLIMITED:
            continue
        held = sum(view.reserved(c) for c in node.children if c not in on_path)
        load = view.used(node.name) + held
        if load + gpus <= cap:
            continue
        return Admission(False, reason=_refusal(view, path, i, gpus, cap, load, held))
    q = path[0].name
    borrowed = max(0, view.used(q) + gpus - view.nominal(q))
    return Admission(True, borrowed=borrowed)


def _refusal(
    view: _View, path: tuple[QueueNode, ...], i: int, gpus: int, cap: int, load: int, held: int
) -> str:
    q = path[0]
    e = q.entry(view.key)
    label = e.gpu_product if e is not None and e.gpu_product != ANY_GPU else view.key
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
    _seen: dict[str | None, Status] = field(default_factory=dict)

    name = QUOTA_PLUGIN

    def status(self, product: str | None) -> Status:
        """``SUCCESS``, or ``Unschedulable`` with the admission's reason, for ``product``."""
        hit = self._seen.get(product)
        if hit is None:
            hit = Status(Code.SUCCESS)
            for key, amount in sorted(demand_of(self.request, product).items()):
                a = admit(self.tree, self.usage, self.queue, key, amount)
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

    def queue(self, request: PlacementRequest) -> str:
        """The queue a request is charged to (``request.queue``, else the default queue)."""
        return request.queue if request.queue is not None else self.tree.default_queue

    def for_request(self, request: PlacementRequest) -> JobQuota | None:
        """The filter ``place()`` runs for ``request``, or None when nothing limits it."""
        q = self.queue(request)
        if not self.enforce or (q not in self.tree.broken and self.tree.unlimited(q)):
            return None
        return JobQuota(self.tree, self.usage, q, request)

    def charge(self, request: PlacementRequest, product: str | None) -> None:
        """Charge a placed ``request`` (on GPU ``product``) to its queue."""
        self.usage.charge_demand(request.uid, self.queue(request), demand_of(request, product))

    def release(self, job_uid: str) -> None:
        """Release a job that finished or lost its reservation."""
        self.usage.release(job_uid)


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
        view = _View(tree, usage, key)
        nominal = view.nominal(queue)
        if nominal >= UNLIMITED:
            continue
        used = view.used(queue)
        out.append(UsageRow(key, nominal, used, max(0, used - nominal)))
    return out
