"""The queue tree (pure): GPUQueue specs checked and linked, and the queue of a job.

Part of the quota rules of :mod:`.quota` (which re-exports these names; docs/placement.md,
"Queues and quotas"): :func:`build_tree` turns GPUQueue specs into a :class:`QueueTree`,
reporting each broken queue with the field that breaks it while the rest keeps working;
:func:`queue_of` is the queue of a job. Called by the hub and the simulator through
:mod:`.quota`. No I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Final

from gpufed.api.labels import is_mig_resource
from gpufed.api.queue import (
    ANY_GPU,
    DEFAULT_PREEMPTION,
    GPUQueue,
    GPUQueueSpec,
    QueuePreemption,
    QueueQuota,
)

#: The hub's default queue name (``--default-queue``).
DEFAULT_QUEUE: Final = "default"


@dataclass(frozen=True, slots=True)
class QueueNode:
    """One queue of the tree.

    ``quotas``: key -> entry (``*``, products, MIG resources); a leaf with none is unlimited.
    ``children``: names, sorted. ``preemption``: its ``spec.preemption``, else the nearest
    ancestor's, else the defaults (docs/placement.md, "Who may preempt whom, when").
    """

    name: str
    parent: str | None
    namespaces: tuple[str, ...]
    quotas: Mapping[str, QueueQuota]
    weight: int
    children: tuple[str, ...] = ()
    preemption: QueuePreemption = DEFAULT_PREEMPTION

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
    of them by name, which is broken). ``orphans``: accepted queue -> the broken queues whose
    nearest accepted ancestor it is: their running jobs stay charged to it and its ancestors
    until they end (a broken queue admits nothing new, but what runs still uses the tree's
    quota).
    """

    nodes: Mapping[str, QueueNode]
    broken: Mapping[str, str]
    namespaces: Mapping[str, str]
    default_queue: str = DEFAULT_QUEUE
    orphans: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def path(self, queue: str) -> tuple[QueueNode, ...]:
        """``queue`` and its ancestors, the queue first, the root last (empty if unknown)."""
        out: list[QueueNode] = []
        node = self.nodes.get(queue)
        while node is not None:
            out.append(node)
            node = self.nodes.get(node.parent) if node.parent is not None else None
        return tuple(out)

    @cached_property
    def listed_keys(self) -> frozenset[str]:
        """Every quota key some accepted queue lists."""
        return frozenset(k for n in self.nodes.values() for k in n.quotas)

    def charged_path(self, queue: str) -> tuple[QueueNode, ...]:
        """The queues whose usage a charge to ``queue`` counts in: its path, or for a broken
        queue the path of its nearest accepted ancestor (``orphans``); empty if none."""
        if queue in self.nodes:
            return self.path(queue)
        for parent, names in self.orphans.items():
            if queue in names:
                return self.path(parent)
        return ()

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
            preemption=_inherited(name, good),
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
        orphans=_orphans(specs, broken, nodes),
    )


def _inherited(name: str, good: Mapping[str, GPUQueueSpec]) -> QueuePreemption:
    """``spec.preemption`` of ``name`` or of its nearest ancestor that sets it (the defaults
    when none does). ``good`` has no cycles."""
    cur: str | None = name
    while cur is not None and cur in good:
        own = good[cur].preemption
        if own is not None:
            return own
        cur = good[cur].parent
    return DEFAULT_PREEMPTION


def _orphans(
    specs: Mapping[str, GPUQueueSpec], broken: Mapping[str, str], nodes: Mapping[str, QueueNode]
) -> dict[str, tuple[str, ...]]:
    """Accepted queue -> the broken queues (with a spec) whose nearest accepted ancestor it
    is; a broken queue in a cycle of parents has none and is charged nowhere above itself."""
    out: dict[str, list[str]] = defaultdict(list)
    for name in sorted(specs):
        if name not in broken:
            continue
        seen = {name}
        cur = specs[name].parent
        while cur is not None and cur not in nodes and cur in specs and cur not in seen:
            seen.add(cur)
            cur = specs[cur].parent
        if cur is not None and cur in nodes:
            out[cur].append(name)
    return {k: tuple(v) for k, v in out.items()}


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
