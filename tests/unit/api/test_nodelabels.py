"""Decoded nodes' labels without a dict per node (api/nodelabels, issue 25's hub RSS).

Every reader must see what the full per-node dict shows: the dict is built here independently
(``{**base, **own}``, the way the decoder built it before), and compared key by key, in order,
with equality both ways, and through the readers placement uses (``LabelSelector.matches``,
``.get`` with defaults, ``in``). Changing decoded labels must be refused or work on a copy.
"""

from __future__ import annotations

import copy
import pickle
import platform
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufed.api.inventory import NodeInventory
from gpufed.api.nodelabels import LabelLayout, NodeLabels
from gpufed.api.protocol.codec import node_from_pb, node_to_pb
from gpufed.api.protocol.packed import NODE_LABELS, ShapeBook, ShapeTable, pack_nodes, unpack_nodes
from gpufed.api.request import LabelSelector

KEYS = ["a", "b", "c", "example.com/d", "kubernetes.io/hostname", "topology/rack"]
VALUES = st.sampled_from(["", "x", "y", "z1", "node-1"])
ABSENT = object()


def reference(base: dict[str, str], keys: list[str], values: list[str]) -> dict[str, str]:
    full = dict(base)
    for k, v in zip(keys, values, strict=True):
        full[k] = v
    return full


def assert_reads_as(got: NodeLabels, want: dict[str, str]) -> None:
    assert list(got) == list(want), "same keys in the same order"
    assert list(got.items()) == list(want.items())
    assert list(got.values()) == list(want.values())
    assert len(got) == len(want)
    assert got == want
    assert want == got
    assert (got != want) is False
    assert (want != got) is False
    assert dict(got) == want
    assert {**got} == want
    for k in [*KEYS, "missing"]:
        assert (k in got) == (k in want)
        assert got.get(k) == want.get(k)
        assert got.get(k, ABSENT) is want.get(k, ABSENT) or got.get(k) == want.get(k)
        if k in want:
            assert got[k] == want[k]
        else:
            with pytest.raises(KeyError):
                got[k]
    assert repr(got) == repr(want)
    other = dict(want)
    other["missing"] = "1"
    assert got != other
    assert other != got
    if want:
        first = next(iter(want))
        changed = {**want, first: want[first] + "!"}
        assert got != changed
        assert changed != got


@settings(max_examples=300, deadline=None)
@given(
    base=st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=5),
    own=st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=6),
)
def test_labels_read_as_the_full_dict(base: dict[str, str], own: list[tuple[str, str]]) -> None:
    # keys given twice and keys of the base included: dict.update's rules (first place, last value)
    keys, values = [k for k, _ in own], [v for _, v in own]
    got = LabelLayout(dict(base), tuple(keys)).labels(tuple(values))
    assert_reads_as(got, reference(base, keys, values))


@settings(max_examples=100, deadline=None)
@given(
    shapes=st.lists(
        st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4), min_size=1, max_size=3
    ),
    nodes=st.lists(
        st.tuples(st.integers(0, 2), st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=3)),
        min_size=1,
        max_size=12,
    ),
    per_node=st.sets(st.sampled_from(KEYS)),
    selectors=st.lists(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=2), max_size=4),
)
def test_decoded_nodes_show_every_reader_their_full_labels(
    shapes: list[dict[str, str]],
    nodes: list[tuple[int, dict[str, str]]],
    per_node: set[str],
    selectors: list[dict[str, str]],
) -> None:
    full = [
        {**shapes[si % len(shapes)], **own, "kubernetes.io/hostname": f"n{i}"}
        for i, (si, own) in enumerate(nodes)
    ]
    inv = [
        NodeInventory(name=f"n{i}", labels=lab, nvlink_domain=f"node:n{i}")
        for i, lab in enumerate(full)
    ]
    # any split between shape and node labels decodes to the same labels
    msg = pack_nodes(
        [node_to_pb(n) for n in inv], ShapeTable(), node_labels=frozenset(per_node) | NODE_LABELS
    )
    decoded = unpack_nodes(msg, ShapeBook())
    for node, want, v1 in zip(decoded, full, inv, strict=True):
        assert isinstance(node.labels, NodeLabels)
        # the order the decoder gave before: the shape's labels, then the node's own (each
        # in the order its protobuf map decodes in)
        shared = {k for k in want if k not in per_node | NODE_LABELS}
        keys = list(node.labels)
        assert set(keys[: len(shared)]) == shared
        assert set(keys[len(shared) :]) == set(want) - shared
        assert_reads_as(node.labels, {k: want[k] for k in keys} if set(keys) == set(want) else want)
        assert node == v1 == node_from_pb(node_to_pb(v1))
        assert node.model_dump() == v1.model_dump()
        assert node.model_dump(mode="json")["labels"] == want
        assert NodeInventory.model_validate_json(node.model_dump_json()) == v1
        for sel in selectors:
            selector = LabelSelector(matchLabels=sel)
            assert selector.matches(node.labels) == selector.matches(want)
        assert node.labels.get("kubernetes.io/hostname", "?") == node.name


def decoded_fleet() -> list[NodeInventory]:
    nodes = [
        NodeInventory(
            name=f"n{i}",
            labels={"pool": "a", "kubernetes.io/hostname": f"n{i}"} if i % 2 else {"pool": "b"},
            nvlink_domain=f"node:n{i}",
            requested={"nvidia.com/gpu": i % 3},
            job_requests={"uid-1": {"nvidia.com/gpu": i % 3}} if i % 3 else {},
        )
        for i in range(8)
    ]
    return unpack_nodes(pack_nodes([node_to_pb(n) for n in nodes], ShapeTable()), ShapeBook())


def test_changing_decoded_labels_is_refused_and_copies_change_freely() -> None:
    for node in decoded_fleet():  # with labels of their own and with the shape's only
        labels = node.labels
        before = dict(labels)
        with pytest.raises(TypeError, match="read-only"):
            labels["pool"] = "c"  # type: ignore[index]
        with pytest.raises(TypeError, match="read-only"):
            del labels["pool"]  # type: ignore[attr-defined]
        for method in ("update", "pop", "popitem", "setdefault", "clear"):
            assert not hasattr(labels, method)
        for mine in (labels.copy(), copy.copy(labels), copy.deepcopy(labels), labels | {}):
            assert type(mine) is dict
            assert mine == before
            mine["pool"] = "c"
        assert pickle.loads(pickle.dumps(labels)) == before
        assert dict(labels) == before, "the node's labels never changed"
        moved = node.model_copy(update={"labels": {**labels, "pool": "c"}})
        assert moved.labels["pool"] == "c"
        assert node.labels == before
        assert copy.deepcopy(node) == node
        assert pickle.loads(pickle.dumps(node)) == node


def test_equal_amounts_are_shared_and_fields_share_their_keys() -> None:
    decoded = decoded_fleet()
    by_gpus = {n.requested["nvidia.com/gpu"]: n.requested for n in decoded}
    assert all(n.requested is by_gpus[n.requested["nvidia.com/gpu"]] for n in decoded)
    assert all(n.name is n.labels.get("kubernetes.io/hostname", n.name) for n in decoded)
    for n in decoded:
        assert list(n.__dict__) == list(NodeInventory.model_fields)
    if platform.python_implementation() == "CPython" and sys.version_info >= (3, 11):
        # a key-sharing dict holds values only (the memory figure of docs/benchmarks.md)
        assert sys.getsizeof(decoded[0].__dict__) < sys.getsizeof(dict(decoded[0].__dict__))
