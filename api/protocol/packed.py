"""Packed inventory nodes (protocol version 2): nodes as columns over per-stream shapes.

The agent's stream client encodes with :func:`pack_nodes` and a :class:`ShapeTable`; the hub's
session decodes with :func:`unpack_nodes` and a :class:`ShapeBook` (the wire form is
``PackedNodes`` in agent.proto). A *shape* is what the nodes of one pool share (labels but the
node's own, ``gpu_product``, ``mig_strategy``, ``taints``, ``allocatable``, ``dra_gpus``): it
is sent once per stream and validated once, by the rules of
:func:`gpufed.api.protocol.codec.node_from_pb`. A node is its name, its shape's index and the
values that differ (flags, NVLink domain, rack, block, degradation, its own labels, requested
amounts, job requests), so a full snapshot costs the hub a few microseconds a node instead of
a message object and a validation each (``scripts/bench_hub.py --decode``).

Decoding refuses the whole message (:class:`~gpufed.api.protocol.codec.ProtocolError` naming
the column or node and the rule) for what :func:`node_from_pb` refuses, and for columns whose
lengths or indices do not add up; the caller keeps its last good inventory. Decoded nodes of
one shape share its ``allocatable`` and ``taints`` objects, and equal ``requested`` and
``job_requests`` amounts within a message share one dict: inventory is never mutated in place,
only replaced. A decoded node's ``labels`` are a read-only
:class:`~gpufed.api.nodelabels.NodeLabels` over its shape's (one object for the shape's nodes
without labels of their own), and its field values sit in a key-sharing ``__dict__``
(:func:`gpufed.api.inventory._share_field_keys`): ~1.3 KB a node held by the hub instead of
~2.4 KB (issue 25's hub RSS; docs/benchmarks.md).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufed.api.inventory import (
    _DNS1123_SUBDOMAIN,
    MAX_DEVICES_PER_NODE,
    MAX_NODE_JOBS,
    MAX_NODE_LABELS,
    MAX_NODE_RESOURCES,
    NodeInventory,
    is_dns1123_subdomain,
)
from gpufed.api.labels import DEFAULT_BLOCK_LABEL, DEFAULT_RACK_LABEL, GPU_CLIQUE_LABEL
from gpufed.api.nodelabels import LabelLayout, NodeLabels
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol.codec import (
    ProtocolError,
    _label_value,
    _qualified_name,
    _quote,
    node_from_pb,
)
from gpufed.api.resources import is_extended_resource

#: Most shapes one stream's table may hold (an agent past it sends a new snapshot, which
#: starts a new table). Each shape is bounded as a node is.
MAX_SHAPES = 4096
#: Most nodes in one packed message (a few µs a node for the hub, so a few ms a message).
MAX_PACKED_NODES_PER_PART = 512
#: Labels an encoder keeps out of shapes by default: they differ from node to node.
NODE_LABELS: frozenset[str] = frozenset(
    {"kubernetes.io/hostname", DEFAULT_RACK_LABEL, DEFAULT_BLOCK_LABEL, GPU_CLIQUE_LABEL}
)


class _FieldsSet(set[str]):
    """Every field's name, one set shared by all decoded nodes (a set of its own per node was
    728 bytes, a quarter of a decoded node; issue 25's hub RSS). pydantic copies a model's
    fields set on ``model_copy``/``copy``/``deepcopy`` and only then adds the updated names,
    so copies get a plain set of their own (a frozenset crashed there, issue 26); changing the
    shared set itself raises ``TypeError``."""

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a decoded node's fields set is shared: copy the model to change it")

    add = discard = remove = pop = clear = update = _refuse  # type: ignore[assignment]
    difference_update = intersection_update = symmetric_difference_update = _refuse
    __ior__ = __iand__ = __isub__ = __ixor__ = _refuse  # type: ignore[assignment]

    def __copy__(self) -> set[str]:
        return set(self)

    def __deepcopy__(self, memo: dict[int, object]) -> set[str]:
        return set(self)

    def __reduce__(self) -> tuple[type, tuple[list[str]]]:
        return (set, (list(self),))


_FIELDS_SET = _FieldsSet(NodeInventory.model_fields)
_new = object.__new__
_set = object.__setattr__


@dataclass(frozen=True, slots=True)
class _Shape:
    labels: dict[str, str]
    #: ``labels`` read-only, shared by the shape's nodes without labels of their own
    node_labels: NodeLabels
    gpu_product: str | None
    mig_strategy: str
    taints: tuple[Any, ...]
    allocatable: dict[str, int]
    dra_gpus: tuple[Any, ...]


@dataclass
class ShapeBook:
    """The shapes one stream has defined, decoded and validated (hub side). A snapshot's part
    0 starts a new book (:meth:`reset`)."""

    shapes: list[_Shape] = field(default_factory=list)

    def reset(self) -> None:
        """Forget every shape (a new snapshot redefines those it uses)."""
        self.shapes = []


@dataclass
class ShapeTable:
    """The shapes one stream has sent (agent side): shape key -> index in the hub's book."""

    index: dict[Hashable, int] = field(default_factory=dict)

    def reset(self) -> None:
        """Forget every shape: call when a snapshot starts (the hub starts a new book then)."""
        self.index = {}

    @property
    def full(self) -> bool:
        """True once one more message of new shapes could cross :data:`MAX_SHAPES` (send a
        snapshot, with a new table, instead of a delta)."""
        return len(self.index) > MAX_SHAPES - MAX_PACKED_NODES_PER_PART


# --- encode (agent) ------------------------------------------------------------------------------


def pack_nodes(
    nodes: Sequence[pb.Node],
    table: ShapeTable,
    *,
    node_labels: frozenset[str] = NODE_LABELS,
) -> pb.PackedNodes:
    """Encode ``nodes`` (as :func:`~gpufed.api.protocol.codec.node_to_pb` gives them) against
    ``table``; new shapes are added to both the table and the message. ``node_labels``: label
    keys sent per node rather than in the shape (pass the agent's topology label keys too); any
    choice decodes to the same nodes, this one only keeps the number of shapes down. Raises
    ValueError past :data:`MAX_SHAPES` (send a snapshot with a new table instead)."""
    msg = pb.PackedNodes()
    strings: dict[str, int] = {}

    def ref(text: str) -> int:
        if not text:
            return 0
        i = strings.get(text)
        if i is None:
            i = strings[text] = len(strings) + 1
        return i

    for node in nodes:
        labels = node.labels
        own = [(k, v) for k, v in labels.items() if k in node_labels]
        shared = sorted((k, v) for k, v in labels.items() if k not in node_labels)
        key = (
            tuple(shared),
            node.gpu_product,
            node.mig_strategy,
            tuple((t.key, t.value, t.effect) for t in node.taints),
            tuple(sorted(node.allocatable.items())),
            tuple(g.SerializeToString(deterministic=True) for g in node.dra_gpus),
        )
        index = table.index.get(key)
        if index is None:
            if len(table.index) >= MAX_SHAPES:
                raise ValueError(f"more than {MAX_SHAPES} node shapes in one stream")
            index = table.index[key] = len(table.index)
            shape = msg.shapes.add(
                labels=dict(shared),
                gpu_product=node.gpu_product,
                mig_strategy=node.mig_strategy,
                taints=node.taints,
                allocatable=node.allocatable,
                dra_gpus=node.dra_gpus,
            )
            shape.ready = True
        msg.names.append(node.name)
        msg.shape.append(index)
        msg.flags.append((1 if node.ready else 0) | (2 if node.unschedulable else 0))
        domain = node.nvlink_domain
        msg.nvlink_domain.append(0 if domain == f"node:{node.name}" else ref(domain))
        msg.rack.append(ref(node.rack))
        msg.block.append(ref(node.block))
        msg.degraded.append(ref(node.degraded))
        msg.label_count.append(len(own))
        for k, v in own:
            msg.label_key.append(ref(k))
            msg.label_value.append(ref(v))
        msg.requested_count.append(len(node.requested))
        for k, amount in node.requested.items():
            msg.requested_key.append(ref(k))
            msg.requested_value.append(amount)
        msg.job_count.append(len(node.job_requests))
        for uid, r in node.job_requests.items():
            msg.job_uid.append(ref(uid))
            msg.job_amount_count.append(len(r.amounts))
            for k, amount in r.amounts.items():
                msg.job_amount_key.append(ref(k))
                msg.job_amount_value.append(amount)
    msg.strings.extend(strings)
    return msg


def packed_parts(
    nodes: Sequence[pb.Node],
    table: ShapeTable,
    limit: int,
    *,
    node_labels: frozenset[str] = NODE_LABELS,
    max_nodes: int = MAX_PACKED_NODES_PER_PART,
) -> list[pb.PackedNodes]:
    """:func:`pack_nodes` in messages of at most ``max_nodes`` nodes and ``limit`` encoded bytes
    (a part over the budget is packed again at half the nodes; a single node over it travels
    alone and the hub decides). At least one message: an empty cluster is a snapshot too."""
    out: list[pb.PackedNodes] = []
    i, step = 0, max_nodes
    while i < len(nodes) or not out:
        chunk = nodes[i : i + step]
        saved = dict(table.index)
        msg = pack_nodes(chunk, table, node_labels=node_labels)
        if len(chunk) > 1 and msg.ByteSize() > limit:
            table.index, step = saved, max(1, len(chunk) // 2)
            continue
        out.append(msg)
        i, step = i + len(chunk), max_nodes
    return out


# --- decode (hub) --------------------------------------------------------------------------------


def _shape_of(msg: pb.Node, index: int) -> _Shape:
    probe = pb.Node()
    probe.CopyFrom(msg)
    probe.name = "shape"
    try:
        node = node_from_pb(probe)
    except ProtocolError as exc:
        raise ProtocolError(f"shape {index}: {str(exc).split(': ', 1)[-1]}") from exc
    labels = dict(node.labels)
    return _Shape(
        labels=labels,
        node_labels=LabelLayout(labels, ()).labels(()),
        gpu_product=node.gpu_product,
        mig_strategy=node.mig_strategy,
        taints=node.taints,
        allocatable=node.allocatable,
        dra_gpus=node.dra_gpus,
    )


def _check_columns(msg: pb.PackedNodes, book: ShapeBook) -> None:
    """Lengths, counts and indices of every column (raises ProtocolError naming it)."""
    n = len(msg.names)
    for name in ("shape", "flags", "nvlink_domain", "rack", "block", "degraded"):
        if len(getattr(msg, name)) != n:
            raise ProtocolError(
                f"packed nodes: {name} has {len(getattr(msg, name))} entries, not {n}"
            )
    groups = (
        ("label_count", ("label_key", "label_value"), MAX_NODE_LABELS),
        ("requested_count", ("requested_key", "requested_value"), MAX_NODE_RESOURCES),
        ("job_count", ("job_uid", "job_amount_count"), MAX_NODE_JOBS),
        ("job_amount_count", ("job_amount_key", "job_amount_value"), MAX_NODE_RESOURCES),
    )
    for count_name, columns, limit in groups:
        counts = getattr(msg, count_name)
        want = n if count_name != "job_amount_count" else len(msg.job_uid)
        if len(counts) != want:
            raise ProtocolError(f"packed nodes: {count_name} has {len(counts)} entries, not {want}")
        if counts and max(counts) > limit:
            raise ProtocolError(
                f"packed nodes: {count_name}: {max(counts)} entries, at most {limit}"
            )
        total = sum(counts)
        for column in columns:
            if len(getattr(msg, column)) != total:
                raise ProtocolError(
                    f"packed nodes: {column} has {len(getattr(msg, column))} entries, not {total}"
                )
    if msg.flags and max(msg.flags) > 3:
        raise ProtocolError("packed nodes: flags: only bits 0 (ready) and 1 (unschedulable)")
    if msg.shape and max(msg.shape) >= len(book.shapes):
        raise ProtocolError(
            f"packed nodes: shape {max(msg.shape)} is not defined ({len(book.shapes)} shapes)"
        )
    top = len(msg.strings)
    for name in (
        "nvlink_domain", "rack", "block", "degraded", "label_key", "label_value",
        "requested_key", "job_uid", "job_amount_key",
    ):  # fmt: skip
        column = getattr(msg, name)
        if column and max(column) > top:
            raise ProtocolError(f"packed nodes: {name}: string {max(column)} of {top}")
    for name in ("label_key", "requested_key", "job_uid", "job_amount_key"):
        column = getattr(msg, name)
        if column and min(column) == 0:
            raise ProtocolError(f"packed nodes: {name}: string 0 (none) where one is required")
    for name in ("requested_value", "job_amount_value"):
        column = getattr(msg, name)
        if column and min(column) < 0:
            raise ProtocolError(f"packed nodes: {name}: {min(column)} is negative")


def _check_strings(msg: pb.PackedNodes, strings: list[str]) -> set[int]:
    """Each string once per use it is put to; returns the indices of extended resources."""
    rules = (
        (
            ("label_key", "requested_key", "job_amount_key"),
            _qualified_name,
            "is not a qualified name",
        ),
        (("label_value", "rack", "block"), _label_value, "is not a valid label value"),
        (("nvlink_domain",), lambda s: len(s) <= 320, "is longer than 320 characters"),
        (("degraded",), lambda s: len(s) <= 1024, "is longer than 1024 characters"),
        (("job_uid",), lambda s: 0 < len(s) <= 128, "is not a job UID"),
    )
    for columns, ok, what in rules:
        checked: set[int] = {0}
        for column in columns:
            used = set(getattr(msg, column)) - checked
            for i in used:
                if not ok(strings[i]):
                    raise ProtocolError(f"packed nodes: {column} {_quote(strings[i])} {what}")
            checked |= used
    keys = set(msg.requested_key) | set(msg.job_amount_key)
    return {i for i in keys if is_extended_resource(strings[i])}


def _amounts(keys: Sequence[int], values: Sequence[int], ext: set[int], where: str) -> None:
    for k, v in zip(keys, values, strict=True):
        if k in ext and v > MAX_DEVICES_PER_NODE:
            raise ProtocolError(f"packed nodes: {where}: {v} is outside 0..{MAX_DEVICES_PER_NODE}")


# Node names joined by newlines (which no valid name holds): one match checks a whole message.
_NAMES = re.compile(f"(?:{_DNS1123_SUBDOMAIN.pattern})(?:\\n(?:{_DNS1123_SUBDOMAIN.pattern}))*")


def _check_names(names: list[str]) -> None:
    """Every name a DNS-1123 subdomain (the rule of node_from_pb), checked in one match of the
    names joined by newlines (which no valid name holds); the first bad one is named."""
    if not names:
        return
    joined = "\n".join(names)
    if (
        max(map(len, names)) <= 253
        and joined.count("\n") == len(names) - 1
        and _NAMES.fullmatch(joined) is not None
    ):
        return
    for name in names:
        if not is_dns1123_subdomain(name):
            raise ProtocolError(
                f"node {_quote(name)}: name must be a DNS-1123 subdomain (lowercase a-z, 0-9, "
                "'-', '.'; 1-253 characters)"
            )


def unpack_nodes(msg: pb.PackedNodes, book: ShapeBook) -> list[NodeInventory]:
    """Decode and validate ``msg`` against ``book``; new shapes are added to ``book`` only when
    the whole message decodes. Raises :class:`ProtocolError` naming the column, shape or node
    and the rule; nothing is kept then."""
    # 1. New shapes, each validated once as a node is.
    base = len(book.shapes)
    new = [_shape_of(s, base + i) for i, s in enumerate(msg.shapes)]
    if base + len(new) > MAX_SHAPES:
        raise ProtocolError(f"packed nodes: more than {MAX_SHAPES} shapes in one stream")
    trial = ShapeBook(book.shapes + new) if new else book
    # 2. Columns, then each string once for what it is used as.
    _check_columns(msg, trial)
    intern = sys.intern
    strings: list[Any] = [None, *(intern(s) for s in msg.strings)]
    ext = _check_strings(msg, strings)
    _amounts(msg.requested_key, msg.requested_value, ext, "requested")
    _amounts(msg.job_amount_key, msg.job_amount_value, ext, "job_requests")
    # 3. The names, in one regular-expression match for the whole message.
    names = list(msg.names)
    _check_names(names)
    # one string for a name and its hostname label (the strings are interned)
    names = [intern(n) for n in names]
    # 4. The nodes: one model object each, no validation left to do.
    shapes = trial.shapes
    out: list[NodeInventory] = []
    lkeys = [strings[i] for i in msg.label_key]
    lvals = [strings[i] or "" for i in msg.label_value]
    rkeys = [strings[i] for i in msg.requested_key]
    rvals = list(msg.requested_value)
    juids = [strings[i] for i in msg.job_uid]
    jcounts = list(msg.job_amount_count)
    jkeys = [strings[i] for i in msg.job_amount_key]
    jvals = list(msg.job_amount_value)
    layouts: dict[tuple[int, tuple[str, ...]], LabelLayout] = {}
    amounts: dict[tuple[Any, ...], dict[str, int]] = {}
    job_maps: dict[tuple[str, int], dict[str, dict[str, int]]] = {}
    no_jobs: dict[str, dict[str, int]] = {}
    li = ri = ji = jai = 0
    rows = zip(
        names, msg.shape, msg.flags, msg.nvlink_domain, msg.rack, msg.block, msg.degraded,
        msg.label_count, msg.requested_count, msg.job_count, strict=True,
    )  # fmt: skip
    fields_set = _FIELDS_SET
    for name, si, flags, dom, rack, block, deg, nl, nr, nj in rows:
        s = shapes[si]
        labels = s.node_labels
        if nl:
            # the shape's labels and the node's own, without a dict per node (api/nodelabels)
            keys = tuple(lkeys[li : li + nl])
            layout = layouts.get((si, keys))
            if layout is None:
                layout = layouts[si, keys] = LabelLayout(s.labels, keys)
                if layout.size > MAX_NODE_LABELS:
                    raise ProtocolError(f"node {_quote(name)}: labels: more than {MAX_NODE_LABELS}")
            labels = layout.labels(tuple(lvals[li : li + nl]))
            li += nl
        # equal amounts share one dict within a message (never mutated: replaced), as the
        # shape's allocatable is shared: most nodes repeat a few GPU counts and jobs
        key: tuple[Any, ...] = (*rkeys[ri : ri + nr], *rvals[ri : ri + nr])
        requested = amounts.get(key)
        if requested is None:
            requested = amounts[key] = dict(
                zip(rkeys[ri : ri + nr], rvals[ri : ri + nr], strict=False)
            )
        ri += nr
        if nj == 1:
            n = jcounts[ji]
            key = (*jkeys[jai : jai + n], *jvals[jai : jai + n])
            one = amounts.get(key)
            if one is None:
                one = amounts[key] = dict(
                    zip(jkeys[jai : jai + n], jvals[jai : jai + n], strict=False)
                )
            jobs = job_maps.get((juids[ji], id(one)))
            if jobs is None:
                jobs = job_maps[juids[ji], id(one)] = {juids[ji]: one}
            jai += n
            ji += 1
        elif nj:
            jobs = {}
            for j in range(ji, ji + nj):
                n = jcounts[j]
                jobs[juids[j]] = dict(zip(jkeys[jai : jai + n], jvals[jai : jai + n], strict=False))
                jai += n
            ji += nj
        else:
            jobs = no_jobs
        node = _new(NodeInventory)
        # stored key by key in field order, the dict shares its keys with every node's
        # (inventory._share_field_keys): 190 bytes a node instead of 464
        d = node.__dict__
        d["name"] = name
        d["labels"] = labels
        d["gpu_product"] = s.gpu_product
        d["mig_strategy"] = s.mig_strategy
        d["nvlink_domain"] = strings[dom] if dom else "node:" + name
        d["rack"] = strings[rack]
        d["block"] = strings[block]
        d["ready"] = flags & 1 == 1
        d["unschedulable"] = flags & 2 == 2
        d["taints"] = s.taints
        d["allocatable"] = s.allocatable
        d["requested"] = requested
        d["job_requests"] = jobs
        d["degraded"] = strings[deg]
        d["dra_gpus"] = s.dra_gpus
        # one shared set (:class:`_FieldsSet`): a copy gets its own before pydantic adds to it
        _set(node, "__pydantic_fields_set__", fields_set)
        _set(node, "__pydantic_extra__", None)
        _set(node, "__pydantic_private__", None)
        out.append(node)
    if new:
        book.shapes.extend(new)
    return out
