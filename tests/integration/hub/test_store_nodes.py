"""A member's inventory in etcd (hub/adapters/store.py ``write_nodes``/``load``, chunk layout of
hub/adapters/nodechunks.py) against a real etcd: what a new leader loads is exactly the last
inventory written (checked against a plain dict the test keeps, and against the raw keys),
removed nodes leave etcd, the per-node keys of the release before load and are replaced at
the member's first write, and a value that does not decode names its key."""

from __future__ import annotations

import asyncio

import pytest

from gpufed.api.inventory import NodeInventory
from gpufed.hub.adapters import nodechunks
from gpufed.hub.adapters.store import Store, StoreError
from gpufed.hub.edge.leader import LeaderElector

pytestmark = pytest.mark.integration


def node(name: str, gpus: int = 0, pad: int = 0) -> NodeInventory:
    return NodeInventory(
        name=name,
        nvlink_domain=f"node:{name}",
        labels={"pool": "a", "pad": "x" * pad} if pad else {"pool": "a"},
        allocatable={"nvidia.com/gpu": 8},
        requested={"nvidia.com/gpu": gpus},
    )


async def lead(store: Store) -> None:
    await asyncio.wait_for(LeaderElector(store, ttl_s=5).acquire(), 10)


async def raw(store: Store, under: str = "") -> dict[str, bytes]:
    """Every key under the store's prefix (after it) -> value, read around the store."""
    got = await store._client.get_prefix((store.prefix + under).encode())
    return {kv.key.decode()[len(store.prefix) :]: bytes(kv.value) for kv in got}


async def test_a_snapshot_then_deltas_load_back_exactly_and_removed_nodes_leave_etcd(
    store: Store, etcd_endpoint: str, prefix: str
) -> None:
    await lead(store)
    want = {f"n{i:04d}": node(f"n{i:04d}", i % 8) for i in range(1200)}
    await store.write_nodes("m1", dict(want), list(want))
    keys = await raw(store, "clusters/m1/")
    assert len(keys) == nodechunks.BUCKETS  # chunks, not a key a node
    # Deltas: a few changes (node keys of their own), then many in one bucket (rewritten
    # whole), removals of chunked and of loose nodes, and a new node.
    one = next(n for n in want if nodechunks.bucket_of(n) == 7)
    same_bucket = [n for n in want if nodechunks.bucket_of(n) == 7]
    for names, gone in (
        ([one, "n0001"], []),
        (same_bucket, []),
        (["n0002"], []),
        ([], ["n0002", "n0003"]),  # n0002 loose, n0003 in a chunk
        (["x-new"], [same_bucket[1]]),
    ):
        for name in names:
            want[name] = node(name, 3)
        for name in gone:
            want.pop(name)
        await store.write_nodes("m1", dict(want), [*names, *gone])
    keys = await raw(store, "clusters/m1/")
    for gone_name in ("n0002", "n0003", same_bucket[1]):
        assert not any(gone_name in k or gone_name.encode() in v for k, v in keys.items())
    # A new leader (another replica) loads exactly this, and its deltas keep it exact.
    b = await Store.connect([etcd_endpoint], prefix=prefix, hub_id="hub-a")
    try:
        assert (await b.load()).nodes["m1"] == want
        for name in ("n0001", "x-new", "n0004"):
            want.pop(name)
        want["n0005"] = node("n0005", 1)
        await b.write_nodes("m1", dict(want), ["n0001", "x-new", "n0004", "n0005"])
        assert (await store.load()).nodes["m1"] == want
        # All gone: nothing left of the member's inventory.
        await b.write_nodes("m1", {}, list(want))
        assert await raw(store, "clusters/m1/") == {}
        assert "m1" not in (await store.load()).nodes
    finally:
        await b.close()


async def test_a_bucket_over_the_part_limit_is_split_and_shrinks_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await lead(store)
    monkeypatch.setattr(nodechunks, "BUCKETS", 1)
    want = {f"n{i}": node(f"n{i}", pad=1500) for i in range(600)}  # ~1 MB in all
    await store.write_nodes("m1", dict(want), list(want))
    parts = await raw(store, "clusters/m1/")
    assert len(parts) >= 2
    assert all(len(v) <= nodechunks.PART_BYTES for v in parts.values())
    assert (await store.load()).nodes["m1"] == want
    for i in range(100, 600):
        want.pop(f"n{i}")
    await store.write_nodes("m1", dict(want), [f"n{i}" for i in range(100, 600)])
    assert len(await raw(store, "clusters/m1/")) == 1  # the parts past the last deleted
    assert (await store.load()).nodes["m1"] == want


async def test_the_per_node_keys_of_the_release_before_load_and_go_at_the_first_write(
    store: Store,
) -> None:
    await lead(store)
    # What the release before wrote: one key a node, pydantic JSON.
    want = {f"n{i}": node(f"n{i}", i % 8) for i in range(300)}
    for n in want.values():
        await store._client.put(
            store._k("clusters", "m1", "nodes", n.name), n.model_dump_json().encode()
        )
    assert (await store.load()).nodes["m1"] == want
    want["n1"] = node("n1", 5)  # one node changed: the member is written whole, once
    await store.write_nodes("m1", dict(want), ["n1"])
    assert await raw(store, "clusters/m1/nodes/") == {}
    assert (await store.load()).nodes["m1"] == want
    want["n2"] = node("n2", 6)
    await store.write_nodes("m1", dict(want), ["n2"])
    assert (await store.load()).nodes["m1"] == want


async def test_an_interrupted_upgrade_loses_nothing_and_brings_nothing_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first write after an upgrade fails after some of its transactions: each bucket's
    old keys went with its chunk, so the next load has every node once."""
    await lead(store)
    want = {f"n{i}": node(f"n{i}", 1) for i in range(400)}
    for n in want.values():
        await store._client.put(
            store._k("clusters", "m1", "nodes", n.name), n.model_dump_json().encode()
        )
    await store.load()
    real = store._guarded
    calls = 0

    async def fail_third(ops: list[object]) -> int:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise StoreError("injected")
        return await real(ops)

    monkeypatch.setattr(store, "_guarded", fail_third)
    removed = [n for n in want if nodechunks.bucket_of(n) < 20]  # in the first transactions
    for name in removed:
        want.pop(name)
    with pytest.raises(StoreError, match="injected"):
        await store.write_nodes("m1", dict(want), removed)
    monkeypatch.setattr(store, "_guarded", real)
    loaded = await store.load()
    assert loaded.nodes["m1"] == want  # nothing lost, the removed not back
    await store.write_nodes("m1", dict(want), [])
    assert await raw(store, "clusters/m1/nodes/") == {}
    assert (await store.load()).nodes["m1"] == want


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("clusters/m1/nodechunks/003/000", b'{"v":1,"objs":[],"nodes":[["n"]]}', "row"),
        ("clusters/m1/nodechunks/003/000", b"\xff\xfe", "Expecting value"),
        ("clusters/m1/nodechunks/xyz/000", b'{"v":1,"objs":[],"nodes":[]}', "xyz"),
        ("clusters/m1/nodechunks/003/n/a", b'{"v":1,"objs":[[],{}],"nodes":[]}', "holds"),
        ("clusters/m1/nodes/n1", b'{"name": 5}', "validation"),
    ],
)
async def test_a_stored_node_value_that_does_not_decode_names_its_key(
    store: Store, key: str, value: bytes, says: str
) -> None:
    await store._client.put((store.prefix + key).encode(), value)
    with pytest.raises(StoreError, match=f"etcd key {store.prefix}{key}: ") as err:
        await store.load()
    assert says in str(err.value)
