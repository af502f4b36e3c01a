"""What an agent may report about a node is bounded and checked where it enters the hub
(node_from_pb): names, label syntax, amounts and counts, each refused naming node and field."""

from __future__ import annotations

import pytest

from gpufed.api.inventory import (
    MAX_DEVICES_PER_NODE,
    MAX_NODE_LABELS,
    NodeInventory,
    is_dns1123_subdomain,
    is_qualified_name,
)
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol.codec import ProtocolError, node_from_pb, node_to_pb


def hgx(name: str = "hgx-0", **fields: object) -> pb.Node:
    node = NodeInventory(
        name="hgx-0",
        nvlink_domain="node:hgx-0",
        labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        allocatable={"nvidia.com/gpu": 8, "cpu": 128_000},
        requested={"nvidia.com/gpu": 2},
    )
    msg = node_to_pb(node)
    msg.name = name
    for key, value in fields.items():
        setattr(msg, key, value)
    return msg


def test_a_good_node_decodes() -> None:
    assert node_from_pb(hgx()).free("nvidia.com/gpu") == 6


@pytest.mark.parametrize("name", ["", "a/b", "UPPER", "-x", "x" * 254, "a..b"])
def test_node_names_must_be_dns1123_subdomains(name: str) -> None:
    with pytest.raises(ProtocolError, match="name must be a DNS-1123 subdomain"):
        node_from_pb(hgx(name))
    assert not is_dns1123_subdomain(name)


def test_negative_or_absurd_amounts_are_refused_naming_the_field() -> None:
    msg = hgx()
    msg.requested["nvidia.com/gpu"] = -1000
    with pytest.raises(ProtocolError, match=r"node 'hgx-0': requested\[nvidia.com/gpu\]: -1000"):
        node_from_pb(msg)
    msg = hgx()
    msg.allocatable["nvidia.com/gpu"] = MAX_DEVICES_PER_NODE + 1
    with pytest.raises(ProtocolError, match=r"allocatable\[nvidia.com/gpu\]: 4097 is outside"):
        node_from_pb(msg)
    msg = hgx()
    msg.job_requests["uid-1"].amounts["cpu"] = -1
    with pytest.raises(ProtocolError, match=r"job_requests\[uid-1\]\[cpu\]"):
        node_from_pb(msg)


def test_label_syntax_and_counts_are_checked_before_anything_is_copied() -> None:
    msg = hgx()
    msg.labels["bad key!"] = "x"
    with pytest.raises(ProtocolError, match="is not a qualified name"):
        node_from_pb(msg)
    msg = hgx()
    msg.labels["ok"] = "not a label value"
    with pytest.raises(ProtocolError, match="not a valid label value"):
        node_from_pb(msg)
    msg = hgx()
    for i in range(MAX_NODE_LABELS + 1):
        msg.labels[f"k{i}"] = "v"
    with pytest.raises(ProtocolError, match="labels: 1026 entries, at most 1024"):
        node_from_pb(msg)
    assert is_qualified_name("nvidia.com/gpu.product")
    assert not is_qualified_name("/x")
