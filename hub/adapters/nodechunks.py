"""The stored form of a member's inventory: its nodes in a bounded number of chunk values.

Used by :class:`gpufed.hub.adapters.store.Store` (``write_nodes`` and ``load``). A member's
nodes are split into :data:`BUCKETS` buckets by a hash of the node name (:func:`bucket_of`,
CRC-32: the same in every process and release, so a new leader rewrites the buckets its
predecessor wrote); a bucket is stored as one or more *parts*, keys
``clusters/<cluster>/nodechunks/<bucket:03d>/<part:03d>`` each at most :data:`PART_BYTES`,
plus a key of its own for each node changed since (``<bucket:03d>/n/<node>``, one chunk of one
node, newer than the parts) until the bucket is rewritten whole (the store's policy:
``Store.write_nodes``). A full snapshot of 5,000 nodes is ~256 puts instead of 5,000 (one etcd
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
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

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
