"""Packed nodes (protocol version 2) decode to exactly the nodes the version-1 form decodes to,
each shape once per stream, and refuse what the version-1 checks refuse, naming the rule.

The reference is the version-1 path: every node encoded as its own ``Node`` message and
decoded with :func:`node_from_pb` (full pydantic validation)."""

from __future__ import annotations

import copy
import pickle
import random

import pytest

from gpufed.api.fleetnodes import node_specs
from gpufed.api.inventory import (
    MAX_DEVICES_PER_NODE,
    MAX_NODE_LABELS,
    DeviceGroup,
    NodeInventory,
    Taint,
    node_from_labels,
)
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol.codec import ProtocolError, node_from_pb, node_to_pb
from gpufed.api.protocol.packed import ShapeBook, ShapeTable, pack_nodes, packed_parts, unpack_nodes
from gpufed.api.resources import resource_list
from gpufed.sandbox.simagent import sim_cluster


def fleet_nodes(member: str, n: int, seed: int = 1) -> list[NodeInventory]:
    """The simulated member's nodes (GB200 NVL72 cliques and HGX racks), with random load:
    requested GPUs, job requests, cordons, NotReady and degraded nodes, a DRA node, a taint."""
    rng = random.Random(seed)
    out = []
    for i, spec in enumerate(node_specs(sim_cluster(member, n))):
        alloc = resource_list(spec.allocatable, field="allocatable")
        gpus = rng.randint(0, alloc.get("nvidia.com/gpu", 0))
        jobs = {f"uid-{rng.randint(0, 9)}": {"nvidia.com/gpu": gpus, "cpu": 1000}} if gpus else {}
        extra = {}
        if i % 97 == 5:
            extra["dra_gpus"] = (
                DeviceGroup(count=4, allocated=1, attributes={"productName": "x", "index": 3}),
            )
        out.append(
            node_from_labels(
                spec.name,
                spec.labels,
                taints=spec.taints
                + ((Taint(key="maint", effect="NoSchedule"),) if i % 50 == 7 else ()),
                allocatable=alloc,
                requested={"nvidia.com/gpu": gpus, "cpu": 1000 * gpus, "pods": len(jobs)},
                job_requests=jobs,
                ready=i % 31 != 3,
                unschedulable=i % 41 == 4,
                degraded="GPU health: XID 79" if i % 53 == 9 else None,
                **extra,
            )
        )
    return out


def pack(nodes: list[NodeInventory], table: ShapeTable, **kw: frozenset[str]) -> pb.PackedNodes:
    """The agent's encoding: each node as node_to_pb gives it, then packed."""
    return pack_nodes([node_to_pb(n) for n in nodes], table, **kw)


def reference(nodes: list[NodeInventory]) -> list[NodeInventory]:
    return [node_from_pb(node_to_pb(n)) for n in nodes]


def test_a_fleet_decodes_to_what_the_version_1_form_decodes_to() -> None:
    nodes = fleet_nodes("m1", 400)
    table, book = ShapeTable(), ShapeBook()
    got: list[NodeInventory] = []
    for i in range(0, len(nodes), 128):
        got += unpack_nodes(pack(nodes[i : i + 128], table), book)
    assert got == reference(nodes)
    assert [n.model_dump() for n in got] == [n.model_dump() for n in reference(nodes)]


def test_each_shape_is_sent_once_per_stream() -> None:
    nodes = fleet_nodes("m1", 400)
    table = ShapeTable()
    first = pack(nodes[:200], table)
    again = pack(nodes[:200], table)
    assert 0 < len(first.shapes) < 40, "a pool's nodes share few shapes"
    assert len(again.shapes) == 0, "nothing new the second time"
    distinct = {
        (tuple(sorted((k, v) for k, v in n.labels.items() if "hostname" not in k and "rack" not in k
               and "block" not in k and "clique" not in k)),
         n.taints, tuple(sorted(n.allocatable.items())), repr(n.dra_gpus))
        for n in nodes[:200]
    }  # fmt: skip
    assert len(first.shapes) == len(distinct)


def test_a_delta_reuses_the_snapshots_shapes_and_adds_its_own() -> None:
    nodes = fleet_nodes("m1", 100)
    table, book = ShapeTable(), ShapeBook()
    unpack_nodes(pack(nodes, table), book)
    before = len(book.shapes)
    changed = [nodes[3].model_copy(update={"requested": {"nvidia.com/gpu": 1}})]
    changed.append(nodes[4].model_copy(update={"allocatable": {"nvidia.com/gpu": 2}}))
    msg = pack(changed, table)
    assert len(msg.shapes) == 1
    assert unpack_nodes(msg, book) == reference(changed)
    assert len(book.shapes) == before + 1


def packed(nodes: list[NodeInventory] | None = None) -> pb.PackedNodes:
    return pack(nodes or fleet_nodes("m1", 40), ShapeTable())


def refused(msg: pb.PackedNodes, match: str) -> None:
    book = ShapeBook()
    with pytest.raises(ProtocolError, match=match):
        unpack_nodes(msg, book)
    assert book.shapes == [], "a refused message defines no shape"


def test_a_bad_node_name_is_refused_naming_it() -> None:
    msg = packed()
    msg.names[3] = "UPPER"
    refused(msg, "node 'UPPER': name must be a DNS-1123 subdomain")


def test_a_bad_shape_is_refused_as_a_node_would_be() -> None:
    msg = packed()
    msg.shapes[0].labels["bad key!"] = "x"
    refused(msg, r"shape 0: labels: key 'bad key!' is not a qualified name")
    msg = packed()
    msg.shapes[0].allocatable["nvidia.com/gpu"] = MAX_DEVICES_PER_NODE + 1
    refused(msg, "shape 0: allocatable")


@pytest.mark.parametrize(
    ("column", "match"),
    [
        ("flags", "flags has 39 entries, not 40"),
        ("shape", "shape has 39 entries, not 40"),
        ("label_key", "label_key has"),
        ("requested_value", "requested_value has"),
        ("job_amount_count", "job_amount_count has"),
    ],
)
def test_columns_of_the_wrong_length_are_refused(column: str, match: str) -> None:
    msg = packed()
    del getattr(msg, column)[-1]
    refused(msg, match)


def test_indices_out_of_range_are_refused() -> None:
    msg = packed()
    msg.shape[0] = len(msg.shapes)
    refused(msg, "shape .* is not defined")
    msg = packed()
    msg.rack[0] = len(msg.strings) + 1
    refused(msg, "rack: string")
    msg = packed()
    msg.requested_key[0] = 0
    refused(msg, "requested_key: string 0")


def test_bad_strings_and_amounts_are_refused_for_their_use() -> None:
    msg = packed()
    msg.strings[msg.rack[0] - 1] = "not a label value!"
    refused(msg, "(rack|label_value) 'not a label value!' is not a valid label value")
    msg = packed()
    i = list(msg.requested_key).index(list(msg.strings).index("nvidia.com/gpu") + 1)
    msg.requested_value[i] = MAX_DEVICES_PER_NODE + 1
    refused(msg, f"requested: {MAX_DEVICES_PER_NODE + 1} is outside")
    msg = packed()
    msg.requested_value[0] = -1
    refused(msg, "requested_value: -1 is negative")
    msg = packed()
    msg.flags[0] = 4
    refused(msg, "flags: only bits")


def test_counts_are_bounded_as_for_version_1() -> None:
    node = fleet_nodes("m1", 1)[0]
    many = {f"k{i}": "v" for i in range(MAX_NODE_LABELS + 1)}
    msg = pack(
        [node.model_copy(update={"labels": many})], ShapeTable(), node_labels=frozenset(many)
    )
    refused(msg, f"label_count: {MAX_NODE_LABELS + 1} entries, at most {MAX_NODE_LABELS}")


def test_parts_stay_under_the_byte_budget_and_decode_to_the_same_nodes() -> None:
    nodes = fleet_nodes("m1", 300)
    table, book = ShapeTable(), ShapeBook()
    parts = packed_parts([node_to_pb(n) for n in nodes], table, 4096)
    assert len(parts) > 1
    assert all(p.ByteSize() <= 4096 for p in parts)
    got = [n for p in parts for n in unpack_nodes(p, book)]
    assert got == reference(nodes)
    assert len(packed_parts([], ShapeTable(), 4096)) == 1, "an empty cluster is one message"


def test_a_decoded_node_can_be_copied_with_updates_as_a_validated_one() -> None:
    # issue 26: the preemption what-if (placement.whatif) copies nodes with updates; packed
    # nodes shared one frozenset of fields set, and model_copy(update=...) crashed the leader.
    nodes = fleet_nodes("m", 20)
    book = ShapeBook()
    decoded = unpack_nodes(pack(nodes, ShapeTable()), book)
    for got, want in zip(decoded, reference(nodes), strict=True):
        copied = got.model_copy(update={"requested": {}, "job_requests": {}})
        assert copied.requested == {}
        assert copied.job_requests == {}
        assert got.requested == want.requested, "the original is unchanged"
        assert "requested" in copied.model_fields_set
        # decoded nodes share one fields set (issue 25's RSS); a copy's change never reaches it
        assert got.model_fields_set == set(NodeInventory.model_fields)
        assert copy.deepcopy(got) == got
        assert copy.copy(got).model_fields_set == set(NodeInventory.model_fields)
    with pytest.raises(TypeError, match="shared"):
        decoded[0].model_fields_set.add("x")
    assert all(n.model_fields_set == set(NodeInventory.model_fields) for n in decoded)
    assert pickle.loads(pickle.dumps(decoded[0])) == decoded[0]
