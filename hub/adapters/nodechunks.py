"""The stored form of a member's inventory: its nodes in a bounded number of chunk values.

Used by :class:`gpufed.hub.adapters.store.Store` (``write_nodes`` and ``load``). A member's
nodes are split into :data:`BUCKETS` buckets by a hash of the node name (:func:`bucket_of`,
CRC-32: the same in every process and release, so a new leader rewrites the buckets its
predecessor wrote); a bucket is stored as one or more *parts*, keys
``clusters/<cluster>/nodechunks/<bucket:03d>/<part:03d>`` each at most :data:`PART_BYTES`,
plus a key of its own for each node changed since (``<bucket:03d>/n/<node>``, one chunk of one
node, newer than the parts) until the bucket is rewritten whole (the write policy:
:meth:`ChunkIndex.plan_write`, below). A full snapshot of 5,000 nodes is ~256 puts instead of 5,000 (one etcd
op costs the hub ~6-7 µs of CPU in aetcd, a node's pydantic JSON ~2.3 µs; issue 25).

A part's value is compact JSON (:func:`encode_chunk`)::

    {"v": 1, "objs": [...], "nodes": [[name, labels, gpu_product, mig_strategy,
      nvlink_domain, rack, block, ready, unschedulable, taints, allocatable, requested,
      job_requests, degraded, dra_gpus], ...]}

``taints``, ``allocatable`` and ``dra_gpus`` (-1: none) are indices into ``objs``, one entry
per distinct object in the part (nodes the hub decoded from packed inventory share their
shape's objects, docs/hub.md "Packed inventory", so a shape's are written once a part);
``requested`` and ``job_requests`` are JSON objects; ``labels`` is a JSON object, or ``[layout, [own values]]`` for a
:class:`~gpufed.api.nodelabels.NodeLabels`, where ``objs[layout]`` is ``[base, [own keys]]``
and ``objs[base]`` the shape's labels. :func:`decode_chunk` rebuilds each node and validates
it as a :class:`NodeInventory`; anything that does not add up raises ``ValueError`` (the
store names the key).

:class:`ChunkIndex` is what a hub replica knows of each member's stored chunks (the node names
in a bucket's parts, its part count, its node keys) and the policy that turns a changed
inventory into each bucket's puts and deletes (:meth:`ChunkIndex.plan_write`); it does no I/O:
the store runs the ops in its guarded transactions and reports back (:meth:`ChunkIndex.written`),
and feeds it each key it loads (:meth:`ChunkIndex.load_key`: the node keys' layout is parsed
where :func:`chunk_key` and :func:`legacy_key` build it).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from pydantic_core import to_json

from gpufed.api.inventory import NodeInventory
from gpufed.api.nodelabels import NodeLabels

#: Buckets per member (a power of two). 5,000 nodes -> ~20 a bucket; 15,000 (the per-member
#: bound) -> ~60. Changing it is safe: a leader that loads a node from another bucket than
#: :func:`bucket_of` gives rewrites that member's chunks whole (``Store.load``).
BUCKETS = 256
#: Largest part value written (bytes); a bucket whose encoding is larger is split in parts.
#: etcd refuses a request over ``--max-request-bytes`` (1.5 MiB by default).
PART_BYTES = 512 * 1024
#: Version of the value's form (``"v"``); :func:`decode_chunk` refuses others.
FORMAT = 1

_ROW = 15


def bucket_of(name: str) -> int:
    """The bucket (0 .. :data:`BUCKETS` - 1) of a node name, the same in every process."""
    return zlib.crc32(name.encode()) & (BUCKETS - 1)


def encode_chunk(nodes: Iterable[NodeInventory]) -> bytes:
    """One part's value (UTF-8 JSON, module docstring) for ``nodes``: a few µs of CPU a
    node, less for nodes that share their shape's objects (``scripts/bench_hub.py
    --persist``, docs/benchmarks.md)."""
    objs: list[Any] = []
    ref: dict[int, int] = {}  # id(object) -> index in objs; the nodes keep the objects alive
    get = ref.get
    layouts: dict[tuple[int, tuple[str, ...]], int] = {}  # equal layouts of other messages

    def add(obj: Any, value: Any) -> int:
        i = ref[id(obj)] = len(objs)
        objs.append(value)
        return i

    rows = []
    for n in nodes:
        d = n.__dict__
        labels = d["labels"]
        if type(labels) is NodeLabels:
            layout = labels.layout
            li = get(id(layout))
            if li is None:
                bi = get(id(layout.base))
                if bi is None:
                    bi = add(layout.base, layout.base)
                li = layouts.get((bi, layout.keys))
                if li is None:
                    li = layouts[bi, layout.keys] = add(layout, (bi, layout.keys))
                else:
                    ref[id(layout)] = li
            out_labels: Any = (li, labels.own_values)
        else:
            out_labels = labels
        taints, alloc, dra = d["taints"], d["allocatable"], d["dra_gpus"]
        ti = get(id(taints))
        if ti is None:
            ti = add(taints, [(t.key, t.value, t.effect) for t in taints])
        ai = get(id(alloc))
        if ai is None:
            ai = add(alloc, alloc)
        di = get(id(dra), -1) if dra else -1
        if di == -1 and dra:
            di = add(dra, [g.model_dump(mode="json") for g in dra])
        rows.append(
            (
                d["name"],
                out_labels,
                d["gpu_product"],
                d["mig_strategy"],
                d["nvlink_domain"],
                d["rack"],
                d["block"],
                d["ready"],
                d["unschedulable"],
                ti,
                ai,
                d["requested"],
                d["job_requests"],
                d["degraded"],
                di,
            )
        )
    return to_json({"v": FORMAT, "objs": objs, "nodes": rows})


def encode_parts(nodes: Sequence[NodeInventory], limit: int = PART_BYTES) -> list[bytes]:
    """``nodes`` as one part, or as several of at most ``limit`` bytes each (halved until
    they fit; a single node over ``limit`` is a part of its own). Empty: no part."""
    if not nodes:
        return []
    value = encode_chunk(nodes)
    if len(value) <= limit or len(nodes) == 1:
        return [value]
    half = len(nodes) // 2
    return encode_parts(nodes[:half], limit) + encode_parts(nodes[half:], limit)


def decode_chunk(value: bytes) -> list[NodeInventory]:
    """The nodes of one part's value; ``ValueError`` (naming what) when it does not decode
    or a node is not a valid :class:`NodeInventory`."""
    try:
        doc = json.loads(value)
        if not isinstance(doc, dict) or doc.get("v") != FORMAT:
            got = doc.get("v") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"not a node chunk of form {FORMAT} (v={got!r})")
        objs, rows = doc["objs"], doc["nodes"]
        if not isinstance(objs, list) or not isinstance(rows, list):
            raise ValueError("objs and nodes must be lists")
        out = []
        for row in rows:
            if not isinstance(row, list) or len(row) != _ROW:
                raise ValueError(f"a node row must be a list of {_ROW} values: {row!r:.200}")
            labels = row[1]
            if isinstance(labels, list):
                li, values = labels
                bi, keys = _obj(objs, li)
                labels = {**_obj(objs, bi), **dict(zip(keys, values, strict=True))}
            dra = row[14]
            out.append(
                NodeInventory.model_validate(
                    {
                        "name": row[0],
                        "labels": labels,
                        "gpu_product": row[2],
                        "mig_strategy": row[3],
                        "nvlink_domain": row[4],
                        "rack": row[5],
                        "block": row[6],
                        "ready": row[7],
                        "unschedulable": row[8],
                        "taints": [
                            {"key": k, "value": v, "effect": e} for k, v, e in _obj(objs, row[9])
                        ],
                        "allocatable": _obj(objs, row[10]),
                        "requested": row[11],
                        "job_requests": row[12],
                        "degraded": row[13],
                        "dra_gpus": () if dra == -1 else _obj(objs, dra),
                    },
                    strict=False,
                )
            )
        return out
    except ValueError:
        raise
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"malformed node chunk: {type(exc).__name__}: {exc}") from exc


def _obj(objs: list[Any], i: Any) -> Any:
    if type(i) is not int or not 0 <= i < len(objs):
        raise ValueError(f"object index {i!r} out of range (0 .. {len(objs) - 1})")
    return objs[i]


def chunk_key(cluster: str, bucket: int, part: int | None = None, *, node: str = "") -> str:
    """``clusters/<cluster>/nodechunks/<bucket>/<part>``, ``.../<bucket>/n/<node>`` (a node
    key), or the bucket's prefix (neither; it ends in ``/``): keys after the store's prefix."""
    if node:
        return f"clusters/{cluster}/nodechunks/{bucket:03d}/n/{node}"
    if part is None:
        return f"clusters/{cluster}/nodechunks/{bucket:03d}/"
    return f"clusters/{cluster}/nodechunks/{bucket:03d}/{part:03d}"


def legacy_key(cluster: str, name: str) -> str:
    """``clusters/<cluster>/nodes/<node>``: a node's key in the release before (after the
    store's prefix)."""
    return f"clusters/{cluster}/nodes/{name}"


class Put(NamedTuple):
    """Write ``value`` at ``key`` (after the store's prefix): an op as a plain reader of
    :meth:`ChunkIndex.plan_write` (a test) makes it."""

    key: str
    value: bytes


class Delete(NamedTuple):
    """Delete ``key`` (after the store's prefix); with ``under`` (a prefix, ``""``: none),
    every key from ``key`` up to the last key under ``under``. As :class:`Put`."""

    key: str
    under: str = ""


#: an op as the caller of :meth:`ChunkIndex.plan_write` makes it (``put`` and ``delete``)
Op = TypeVar("Op")


@dataclass(slots=True)
class BucketOps(Generic[Op]):
    """One bucket's share of a write: its ops in order, the value bytes its puts carry and
    the nodes it encoded (the store's transaction limits count both)."""

    ops: list[Op]
    value_bytes: int
    nodes: int


@dataclass
class _Index:
    """What one member's stored chunks hold, by bucket: the node names in its parts, its part
    count, and the names of its node keys (``<bucket>/n/<node>``, newer than the parts)."""

    #: a tuple, not a set, per bucket: ~10 bytes a node instead of ~96 (a set's table), 45 MiB
    #: of the hub's RSS at 100 x 5,000; a write makes a set of the few buckets it touches
    names: dict[int, tuple[str, ...]] = field(default_factory=dict)
    parts: dict[int, int] = field(default_factory=dict)
    loose: dict[int, set[str]] = field(default_factory=dict)
    #: names of the per-node keys of the release before (``clusters/<cluster>/nodes/<node>``)
    legacy: dict[int, set[str]] = field(default_factory=dict)


@dataclass(slots=True)
class WritePlan(Generic[Op]):
    """One member's write (:meth:`ChunkIndex.plan_write`): iterate :attr:`buckets` for the
    ops, then report them written (:meth:`ChunkIndex.written`)."""

    cluster: str
    #: one :class:`BucketOps` a touched bucket, encoded only when asked for
    buckets: Iterator[BucketOps[Op]]
    _index: _Index


class ChunkIndex:
    """Each member's stored chunks as this replica last loaded or wrote them, and the write
    policy over them (module docstring). Owned by one :class:`~gpufed.hub.adapters.store.Store`;
    no I/O, no clock."""

    def __init__(self) -> None:
        self._index: dict[str, _Index] = {}
        #: members whose next write rewrites every chunk (stored form unknown)
        self._rewrite: set[str] = set()
        #: during a load: the per-node keys of the release before, cluster -> name -> node
        self._legacy_nodes: dict[str, dict[str, NodeInventory]] = {}

    def plan_write(
        self,
        cluster: str,
        nodes: Mapping[str, NodeInventory],
        changed: Iterable[str],
        put: Callable[[str, bytes], Op],
        delete: Callable[[str, str], Op],
    ) -> WritePlan[Op]:
        """The ops that persist one member's inventory after ``changed`` nodes were upserted
        or removed: one :class:`BucketOps` a touched bucket, each encoded only when the caller
        asks for the next (so it may run a transaction between two). ``nodes`` is the member's
        whole inventory now (name -> node), ``changed`` the names added, changed or gone since
        the last write. In a bucket with a few changed nodes and none of its parts' nodes gone,
        each changed node is written as a node key of its own (``<bucket>/n/<node>``, one put,
        as cheap as the per-node keys of the release before); once they would be more than
        half of its parts' nodes, or one of those left, the bucket is rewritten whole (its
        parts, node keys deleted). Every bucket is rewritten, and the per-node keys of the
        release before deleted, when this member's stored form is not known to match (an
        upgrade, a write that failed): the member stays so marked until the caller reports
        the plan written (:meth:`written`). The index records each bucket as it is planned.
        Each op is what ``put(key, value)`` or ``delete(key, under)`` makes of it (keys after
        the store's prefix, as :class:`Put` and :class:`Delete` spell them): the store makes
        its etcd transaction ops at once, with no op in between."""
        index = self._index.setdefault(cluster, _Index())
        full = cluster in self._rewrite
        by_bucket: dict[int, set[str]] = {}
        for name in nodes if full else changed:
            by_bucket.setdefault(bucket_of(name), set()).add(name)
        self._rewrite.add(cluster)  # until this write went through
        buckets = _buckets(cluster, nodes, index, by_bucket, full, put, delete)
        return WritePlan(cluster, buckets, index)

    def written(self, plan: WritePlan[Any]) -> None:
        """Every op of ``plan`` was written: the member's stored form is known again (and the
        per-node keys of the release before are gone)."""
        plan._index.legacy.clear()
        self._rewrite.discard(plan.cluster)

    def start_load(self) -> None:
        """Forget every member's stored form: a load is about to read it again
        (:meth:`load_key` each key, then :meth:`finish_load`)."""
        self._index, self._rewrite, self._legacy_nodes = {}, set(), {}

    def load_key(
        self, nodes: dict[str, dict[str, NodeInventory]], parts: Sequence[str], value: bytes
    ) -> bool:
        """One key a load read (after the store's prefix, split on ``/``, in etcd's key order)
        into ``nodes`` (cluster -> name -> node) and the member's index when it is one of this
        module's node keys (:func:`chunk_key`'s parts and node keys, :func:`legacy_key`'s
        per-node keys of the release before): True; False for any other key (the caller reads
        it with the same parts). ``ValueError`` when its value does not decode."""
        match parts:
            case ["clusters", cluster, "nodechunks", b, "n", name]:
                self._load_chunk(nodes.setdefault(cluster, {}), cluster, int(b), None, value, name)
            case ["clusters", cluster, "nodechunks", b, part]:
                self._load_chunk(nodes.setdefault(cluster, {}), cluster, int(b), part, value)
            case ["clusters", cluster, "nodes", name]:
                node = NodeInventory.model_validate_json(value)
                self._legacy_nodes.setdefault(cluster, {})[node.name] = node
                index = self._index.setdefault(cluster, _Index())
                index.legacy.setdefault(bucket_of(name), set()).add(name)
                self._rewrite.add(cluster)  # the first write rewrites it whole, drops those keys
            case _:
                return False
        return True

    def finish_load(self, nodes: dict[str, dict[str, NodeInventory]]) -> None:
        """The per-node keys of the release before into ``nodes`` (:meth:`load_key`'s), under
        what the chunks hold: a bucket's go in the transaction that first writes it, so the two
        never hold one node (what a chunk holds wins)."""
        for cluster, legacy in self._legacy_nodes.items():
            nodes[cluster] = {**legacy, **nodes.get(cluster, {})}
        self._legacy_nodes = {}

    def _load_chunk(
        self,
        nodes: dict[str, NodeInventory],
        cluster: str,
        bucket: int,
        part: str | None,
        value: bytes,
        node_key: str = "",
    ) -> None:
        """One chunk part (``part``) or node key (``node_key``: the node's name) into
        ``nodes`` (the member's loaded nodes, name -> node) and the member's index;
        ``ValueError`` when it does not decode. A node key is newer than its bucket's parts
        (and sorts after them). A node outside its bucket marks the member for a whole
        rewrite."""
        index = self._index.setdefault(cluster, _Index())
        decoded = decode_chunk(value)
        if node_key and [n.name for n in decoded] != [node_key]:
            raise ValueError(f"a node key holds {[n.name for n in decoded]!r:.200}")
        for node in decoded:
            nodes[node.name] = node
            if bucket_of(node.name) != bucket:
                self._rewrite.add(cluster)
        if part is not None:
            index.parts[bucket] = max(index.parts.get(bucket, 0), int(part) + 1)
            index.names[bucket] = (*index.names.get(bucket, ()), *(n.name for n in decoded))
        else:
            index.loose.setdefault(bucket, set()).update(n.name for n in decoded)


def _buckets(
    cluster: str,
    nodes: Mapping[str, NodeInventory],
    index: _Index,
    by_bucket: dict[int, set[str]],
    full: bool,
    put: Callable[[str, bytes], Op],
    delete: Callable[[str, str], Op],
) -> Iterator[BucketOps[Op]]:
    """The per-bucket half of :meth:`ChunkIndex.plan_write`."""
    for b in range(BUCKETS) if full else sorted(by_bucket):
        # this bucket's sets, stored back below (loose: only while not empty)
        names = set() if full else set(index.names.get(b, ()))
        loose = set() if full else index.loose.pop(b, set())
        todo = by_bucket.get(b, set())
        ops = [
            delete(legacy_key(cluster, name), "") for name in index.legacy.get(b, ())
        ]  # the release before's keys go with the bucket's first write (~60 at most)
        ups = [n for name in todo if (n := nodes.get(name)) is not None]
        gone = todo.difference(nodes) if len(ups) != len(todo) else set()
        half = len(names) // 2
        if not full and len(todo) <= half and not (gone & names) and len(loose | todo) <= half:
            added = 0
            for n in ups:  # node keys of their own
                v = encode_chunk((n,))
                ops.append(put(chunk_key(cluster, b, node=n.name), v))
                added += len(v)
            for name in gone:
                ops.append(delete(chunk_key(cluster, b, node=name), ""))
            loose |= todo
            loose -= gone
            encoded = len(ups)
        else:  # the bucket whole
            if names or loose or gone:
                names |= loose
                names |= todo
                names -= gone
                members = [n for name in names if (n := nodes.get(name)) is not None]
                if len(members) != len(names):
                    names.intersection_update(nodes)
            else:  # nothing stored yet (a new member): the changed nodes are all of it
                names |= todo
                members = ups
            parts = encode_parts(members)
            ops += [put(chunk_key(cluster, b, p), v) for p, v in enumerate(parts)]
            if full or loose or len(parts) < index.parts.get(b, 0):
                # parts past the new last one, and every node key (they sort after)
                ops.append(delete(chunk_key(cluster, b, len(parts)), chunk_key(cluster, b)))
            index.parts[b] = len(parts)
            loose.clear()
            added, encoded = sum(map(len, parts)), len(members)
        index.names[b] = tuple(names)
        if loose:
            index.loose[b] = loose
        yield BucketOps(ops, added, encoded)
