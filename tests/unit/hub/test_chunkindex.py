"""The chunk index's write policy (hub/adapters/nodechunks.py ``ChunkIndex``): the puts and
deletes it plans, applied to a plain dict of keys (a stand-in for etcd the test applies itself,
prefix deletes included), always read back as exactly the inventory the test keeps in a
second dict, through random churn (node keys of their own and whole rewrites), by a new
replica that loads the keys, after a write that stopped half way, and after the per-node keys
of the release before; a write after one that went through touches only the changed nodes'
buckets; and no transaction puts a key twice or puts what it deletes (etcd refuses both)."""

from __future__ import annotations

import random
from unittest.mock import ANY

import pytest

from gpufed.api.inventory import NodeInventory
from gpufed.hub.adapters import nodechunks as nc


def node(name: str, version: int) -> NodeInventory:
    return NodeInventory(
        name=name,
        nvlink_domain=f"node:{name}",
        labels={"pool": "a"},
        allocatable={"nvidia.com/gpu": 8},
        requested={"nvidia.com/gpu": version % 9},
        job_requests={f"uid-{version}": {"nvidia.com/gpu": version % 9}} if version % 9 else {},
    )


Op = nc.Put | nc.Delete


def planned(
    index: nc.ChunkIndex, nodes: dict[str, NodeInventory], changed: list[str]
) -> nc.WritePlan[Op]:
    """The index's plan for member ``m1``, its ops as :class:`Put` and :class:`Delete`."""
    return index.plan_write("m1", dict(nodes), changed, nc.Put, nc.Delete)


def apply(kv: dict[str, bytes], bucket: nc.BucketOps[Op]) -> None:
    """One bucket's ops as etcd runs them in a transaction (checked first: what etcd refuses)."""
    puts = [op.key for op in bucket.ops if isinstance(op, nc.Put)]
    assert len(puts) == len(set(puts)), "a key put twice in one transaction"
    for op in bucket.ops:
        if isinstance(op, nc.Delete):
            hit = [
                k
                for k in puts
                if k == op.key or (op.under and k >= op.key and k.startswith(op.under))
            ]
            assert not hit, f"{hit} put and deleted in one transaction"
    for op in bucket.ops:
        if isinstance(op, nc.Put):
            kv[op.key] = op.value
        elif op.under:
            for k in [k for k in kv if k >= op.key and k.startswith(op.under)]:
                del kv[k]
        else:
            kv.pop(op.key, None)


def write(
    index: nc.ChunkIndex, kv: dict[str, bytes], nodes: dict[str, NodeInventory], changed: list[str]
) -> list[nc.BucketOps[Op]]:
    """``changed`` written as the index plans it; the plan's buckets."""
    plan = planned(index, nodes, changed)
    buckets = list(plan.buckets)
    for bucket in buckets:
        apply(kv, bucket)
    index.written(plan)
    return buckets


def load(kv: dict[str, bytes]) -> tuple[nc.ChunkIndex, dict[str, NodeInventory]]:
    """A new replica's load of ``kv`` (in etcd's key order), as the store's ``load`` does it."""
    index = nc.ChunkIndex()
    index.start_load()
    nodes: dict[str, dict[str, NodeInventory]] = {}
    for key in sorted(kv):
        assert index.load_key(nodes, key.split("/"), kv[key]), f"not a node key: {key}"
    index.finish_load(nodes)
    assert set(nodes) <= {"m1"}
    return index, nodes.get("m1", {})


def chunk_keys(kv: dict[str, bytes]) -> set[str]:
    return {k for k in kv if "/nodechunks/" in k}


@pytest.fixture(autouse=True)
def few_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight buckets: ~40 nodes a bucket, so both a bucket's node keys and its rewrites run."""
    monkeypatch.setattr(nc, "BUCKETS", 8)


@pytest.mark.parametrize("seed", range(6))
def test_random_churn_reads_back_as_the_inventory_kept_aside(seed: int) -> None:
    rng = random.Random(seed)
    want = {f"n{i:03d}": node(f"n{i:03d}", 0) for i in range(300)}
    kv: dict[str, bytes] = {}
    index = nc.ChunkIndex()
    write(index, kv, want, list(want))
    paths = set()
    for step in range(1, 40):
        changed = rng.sample(sorted(want), min(len(want), rng.choice([1, 2, 5, 20, 120])))
        for name in changed:
            if rng.random() < 0.3:
                want.pop(name)
            else:
                want[name] = node(name, step)
        new = [f"x{step}-{i}" for i in range(rng.choice([0, 1, 10, 30]))]
        want.update({n: node(n, step) for n in new})
        before = chunk_keys(kv)
        buckets = write(index, kv, want, [*changed, *new])
        # once a write went through, the next touches only the changed nodes' buckets
        assert len(buckets) == len({nc.bucket_of(n) for n in [*changed, *new]})
        paths.add("node keys" if any("/n/" in k for k in chunk_keys(kv) - before) else "whole")
        assert load(kv)[1] == want
        if step % 10 == 0:  # another replica takes over from what is stored
            index, got = load(kv)
            assert got == want
    assert paths == {"node keys", "whole"}  # both ways of writing a bucket ran
    write(index, kv, {}, list(want))
    assert kv == {}


def test_a_write_that_stopped_half_way_is_followed_by_a_whole_rewrite() -> None:
    want = {f"n{i:03d}": node(f"n{i:03d}", 0) for i in range(300)}
    kv: dict[str, bytes] = {}
    index = nc.ChunkIndex()
    write(index, kv, want, list(want))
    gone = sorted(want)[::3]
    for name in gone:
        want.pop(name)
    plan = planned(index, want, gone)
    for bucket, _ in zip(plan.buckets, range(3), strict=False):  # three buckets land
        apply(kv, bucket)
    # not reported written: the next write (nothing changed since) rewrites every bucket
    plan = planned(index, want, [])
    buckets = list(plan.buckets)
    assert len(buckets) == nc.BUCKETS
    for bucket in buckets:
        apply(kv, bucket)
    index.written(plan)
    assert load(kv)[1] == want


def test_the_release_befores_per_node_keys_go_with_the_first_write() -> None:
    want = {f"n{i:03d}": node(f"n{i:03d}", 1) for i in range(100)}
    kv = {nc.legacy_key("m1", n): v.model_dump_json().encode() for n, v in want.items()}
    index, got = load(kv)
    assert got == want
    want["n001"] = node("n001", 2)
    write(index, kv, want, ["n001"])  # one node changed: every bucket written, old keys gone
    assert not any(k.startswith("clusters/m1/nodes/") for k in kv)
    assert load(kv)[1] == want
    want["n002"] = node("n002", 3)
    [bucket] = write(index, kv, want, ["n002"])  # one bucket, and no old key deleted again
    assert bucket.ops == [nc.Put(nc.chunk_key("m1", nc.bucket_of("n002"), node="n002"), ANY)]
    assert load(kv)[1] == want


def test_keys_are_the_store_layout() -> None:
    assert nc.chunk_key("m1", 7, 2) == "clusters/m1/nodechunks/007/002"
    assert nc.chunk_key("m1", 7, node="a.b") == "clusters/m1/nodechunks/007/n/a.b"
    assert nc.chunk_key("m1", 7) == "clusters/m1/nodechunks/007/"
    assert nc.legacy_key("m1", "a") == "clusters/m1/nodes/a"


@pytest.mark.parametrize("reload", [False, True])
def test_buckets_split_in_parts_shrink_back_part_by_part(
    monkeypatch: pytest.MonkeyPatch, reload: bool
) -> None:
    """Parts of ~2 KB (a few nodes each), nodes removed a few at a time: the parts past a
    bucket's new last one are deleted, by the replica that wrote them and by one that loaded
    them (``reload``), so no removed node comes back."""
    encode_parts = nc.encode_parts
    monkeypatch.setattr(nc, "encode_parts", lambda nodes, limit=2000: encode_parts(nodes, limit))
    rng = random.Random(7)
    want = {f"n{i:03d}": node(f"n{i:03d}", 1) for i in range(300)}
    kv: dict[str, bytes] = {}
    index = nc.ChunkIndex()
    write(index, kv, want, list(want))
    assert any(k.endswith("/003") for k in kv)  # buckets of several parts
    while want:
        if reload:
            index, got = load(kv)
            assert got == want
        gone = rng.sample(sorted(want), min(len(want), 6))
        for name in gone:
            want.pop(name)
        write(index, kv, want, gone)
        assert load(kv)[1] == want
    assert kv == {}
