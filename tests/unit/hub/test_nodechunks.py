"""The stored form of a member's nodes (hub/adapters/nodechunks.py): every node comes back as
it went in (checked against pydantic's own dump of each node, not against the codec), shared
shapes are written once, parts stay under their limit, and bad values raise ValueError."""

from __future__ import annotations

import json
import zlib

import pytest

from gpufed.api.inventory import DeviceGroup, NodeInventory, Taint
from gpufed.api.nodelabels import NodeLabels
from gpufed.api.protocol.codec import node_to_pb
from gpufed.api.protocol.packed import ShapeBook, ShapeTable, packed_parts, unpack_nodes
from gpufed.hub.adapters import nodechunks as nc


def plain_nodes() -> list[NodeInventory]:
    """Nodes as a version-1 agent's decode gives them: a dict of labels each, every field
    used somewhere."""
    out = []
    for i in range(40):
        out.append(
            NodeInventory(
                name=f"gpu-{i:03d}.example.com",
                labels={"pool": "a" if i % 2 else "b", "kubernetes.io/hostname": f"gpu-{i:03d}"},
                gpu_product="NVIDIA-H100-80GB-HBM3" if i % 3 else None,
                mig_strategy="single" if i % 7 == 0 else "none",
                nvlink_domain=f"clique:c{i // 4}" if i % 2 else f"node:gpu-{i:03d}",
                rack=f"r{i // 8}" if i % 5 else None,
                block="b1" if i % 4 else None,
                ready=i % 9 != 0,
                unschedulable=i % 11 == 0,
                taints=(Taint(key="gpu", value=str(i % 2), effect="NoSchedule"),) if i % 3 else (),
                allocatable={"nvidia.com/gpu": 8, "cpu": 128_000},
                requested={"nvidia.com/gpu": i % 9, "cpu": 4000 * (i % 9)},
                job_requests={f"uid-{i}": {"nvidia.com/gpu": i % 9}} if i % 9 else {},
                degraded="no allocatable" if i % 13 == 0 else None,
                dra_gpus=(DeviceGroup(count=8, attributes={"type": "gpu", "ok": True}),)
                if i % 6 == 0
                else (),
            )
        )
    return out


def packed_nodes() -> list[NodeInventory]:
    """The same nodes as the hub holds them from a packed (version 2) stream: shared shapes,
    NodeLabels; two pools whose nodes have the same own label keys over different bases."""
    book, out = ShapeBook(), []
    for part in packed_parts([node_to_pb(n) for n in plain_nodes()], ShapeTable(), 1 << 20):
        out += unpack_nodes(part, book)
    return out


def dumps(nodes: list[NodeInventory]) -> list[dict[str, object]]:
    return sorted((n.model_dump(mode="json") for n in nodes), key=lambda d: str(d["name"]))


@pytest.mark.parametrize("make", [plain_nodes, packed_nodes])
def test_nodes_come_back_as_they_went_in(make: object) -> None:
    nodes = make()  # type: ignore[operator]
    assert isinstance(nodes[1].labels, NodeLabels) == (make is packed_nodes)
    back = nc.decode_chunk(nc.encode_chunk(nodes))
    assert dumps(back) == dumps(nodes)
    assert [n.name for n in back] == [n.name for n in nodes]


def test_nodes_of_two_messages_share_one_layout_and_keep_their_own_bases() -> None:
    # Two snapshot messages decode to equal layouts as distinct objects; the chunk writes one.
    book, nodes = ShapeBook(), []
    encoded = [node_to_pb(n) for n in plain_nodes()]
    for part in packed_parts(encoded, ShapeTable(), 1 << 20, max_nodes=10):
        nodes += unpack_nodes(part, book)
    value = nc.encode_chunk(nodes)
    assert dumps(nc.decode_chunk(value)) == dumps(nodes)
    doc = json.loads(value)
    layouts = [o for o in doc["objs"] if isinstance(o, list) and len(o) == 2 and o[1] != []]
    assert len(layouts) == len({(o[0], tuple(o[1])) for o in layouts})


def test_a_shape_is_written_once_a_part() -> None:
    pool = [
        NodeInventory(
            name=f"n{i}",
            labels={"pool": "a", "zone": "z1", "kubernetes.io/hostname": f"n{i}"},
            nvlink_domain=f"node:n{i}",
            taints=(Taint(key="gpu", effect="NoSchedule"),),
            allocatable={"nvidia.com/gpu": 8, "cpu": 128_000},
            requested={"nvidia.com/gpu": i % 3},
        )
        for i in range(30)
    ]
    book, nodes = ShapeBook(), []
    for part in packed_parts([node_to_pb(n) for n in pool], ShapeTable(), 1 << 20):
        nodes += unpack_nodes(part, book)
    text = nc.encode_chunk(nodes).decode()
    assert text.count('"cpu":128000') == 1  # the shared allocatable
    assert text.count('"zone":"z1"') == 1
    assert text.count("NoSchedule") == 1
    assert len(text) < sum(len(n.model_dump_json()) for n in nodes) * 0.5
    assert dumps(nc.decode_chunk(text.encode())) == dumps(pool)


def test_parts_stay_under_their_limit_and_hold_every_node_once() -> None:
    nodes = plain_nodes()
    limit = len(nc.encode_chunk(nodes)) // 5
    parts = nc.encode_parts(nodes, limit)
    assert len(parts) > 1
    assert all(len(p) <= limit for p in parts)
    back = [n for p in parts for n in nc.decode_chunk(p)]
    assert dumps(back) == dumps(nodes)
    assert nc.encode_parts([], limit) == []
    assert nc.encode_parts(nodes[:1], 10) == [nc.encode_chunk(nodes[:1])]  # alone, over it


def test_a_bucket_is_crc32_of_the_name_the_same_everywhere() -> None:
    assert nc.BUCKETS & (nc.BUCKETS - 1) == 0
    for name in ("n0", "gpu-001.example.com", "ip-10-0-1-23.ec2.internal"):
        assert nc.bucket_of(name) == zlib.crc32(name.encode()) % nc.BUCKETS
    spread = {nc.bucket_of(f"node-{i}") for i in range(5000)}
    assert len(spread) == nc.BUCKETS


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"", "Expecting value"),
        (b"not json", "Expecting value"),
        (b"[]", "not a node chunk"),
        (b'{"v": 2, "objs": [], "nodes": []}', "not a node chunk of form 1"),
        (b'{"v": 1, "objs": {}, "nodes": []}', "must be lists"),
        (b'{"v": 1, "objs": [], "nodes": [["n"]]}', "a node row must be a list of 15"),
        (
            b'{"v": 1, "objs": [], "nodes": [["n", {}, null, "none", "node:n", null, null, true,'
            b" false, 0, 0, {}, {}, null, -1]]}",
            "object index 0 out of range",
        ),
        (
            b'{"v": 1, "objs": [[], {"nvidia.com/gpu": "x"}], "nodes": [["n", {}, null, "none",'
            b' "node:n", null, null, true, false, 0, 1, {}, {}, null, -1]]}',
            "allocatable",
        ),
        (
            b'{"v": 1, "objs": [[], {}], "nodes": [["n", [7, []], null, "none", "node:n", null,'
            b" null, true, false, 0, 1, {}, {}, null, -1]]}",
            "object index 7",
        ),
        (b'{"v": 1, "objs": [], "nodes": [[1, 2]]}', "a node row"),
        (b'{"v": 1, "objs": [], "nodes": [5]}', "a node row"),
        (b'{"v": 1}', "malformed node chunk: KeyError"),
    ],
)
def test_a_value_that_does_not_add_up_raises_value_error(value: bytes, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        nc.decode_chunk(value)


def test_a_valid_minimal_value_decodes() -> None:
    value = (
        b'{"v": 1, "objs": [[], {}], "nodes": [["n", {}, null, "none", "node:n", null, null,'
        b" true, false, 0, 1, {}, {}, null, -1]]}"
    )
    assert nc.decode_chunk(value) == [NodeInventory(name="n", nvlink_domain="node:n")]


def test_the_chunk_form_covers_every_field_of_a_node() -> None:
    """A field added to NodeInventory or Taint must be added to the chunk's row (and FORMAT
    raised), or a failover would load nodes without it: this fails until it is."""
    assert list(NodeInventory.model_fields) == [
        "name", "labels", "gpu_product", "mig_strategy", "nvlink_domain", "rack", "block",
        "ready", "unschedulable", "taints", "allocatable", "requested", "job_requests",
        "degraded", "dra_gpus",
    ]  # fmt: skip
    assert list(Taint.model_fields) == ["key", "value", "effect"]
