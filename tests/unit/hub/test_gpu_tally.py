"""A member's GPU summary kept node by node (member_status.GPUTally) equals a recount from
scratch after any sequence of node upserts and removals, and the hub's periodic recount finds
no drift after snapshots and deltas (gpufed_hub_incremental_drift_total stays 0).

The reference is this file's own arithmetic over the final nodes, not summarize()."""

from __future__ import annotations

import random
from typing import Any

from gpufed.api.inventory import GPUSummary, NodeInventory
from gpufed.hub.components.member_status import GPUTally, drift


def brute(nodes: list[NodeInventory]) -> GPUSummary:
    """Whole GPUs of Ready, schedulable, undegraded, non-MIG-single nodes, written out."""
    total: dict[str, int] = {}
    free: dict[str, int] = {}
    per_block: dict[tuple[str, str], int] = {}
    for n in nodes:
        gpus = n.allocatable.get("nvidia.com/gpu", 0)
        if not (n.ready and not n.unschedulable and n.degraded is None) or gpus == 0:
            continue
        if n.mig_strategy == "single":
            continue
        p = n.gpu_product or "unknown"
        f = max(0, gpus - n.requested.get("nvidia.com/gpu", 0))
        total[p] = total.get(p, 0) + gpus
        free[p] = free.get(p, 0) + f
        per_block[(n.nvlink_domain, p)] = per_block.get((n.nvlink_domain, p), 0) + f
    domains = {d for d, _ in per_block}
    largest = max(
        (sum(v for (d2, _), v in per_block.items() if d2 == d) for d in domains), default=0
    )
    by_product: dict[str, int] = {}
    for (_, p), v in per_block.items():
        by_product[p] = max(by_product.get(p, 0), v)
    return GPUSummary(
        gpus_total=total,
        gpus_free=free,
        largest_free_nvlink_block=largest,
        largest_free_nvlink_block_by_product=by_product,
    )


def random_node(rng: random.Random, name: str) -> NodeInventory:
    gpus = rng.choice([0, 4, 8])
    domain = rng.choice([f"node:{name}", "clique:a", "clique:b"])
    return NodeInventory(
        name=name,
        gpu_product=rng.choice(["H100", "GB200", None]),
        mig_strategy=rng.choice(["none", "none", "single", "mixed"]),
        nvlink_domain=domain,
        ready=rng.random() > 0.1,
        unschedulable=rng.random() < 0.1,
        degraded="xid" if rng.random() < 0.05 else None,
        allocatable={"nvidia.com/gpu": gpus} if gpus else {},
        requested={"nvidia.com/gpu": rng.randint(0, 9)},
    )


def test_the_kept_summary_equals_a_recount_after_random_changes() -> None:
    for seed in range(30):
        rng = random.Random(seed)
        nodes: dict[str, NodeInventory] = {}
        tally = GPUTally()
        for _ in range(300):
            name = f"n{rng.randint(0, 40)}"
            if rng.random() < 0.25:
                nodes.pop(name, None)
                tally.remove(name)
            else:
                nodes[name] = random_node(rng, name)
                tally.set(nodes[name])
            if rng.random() < 0.1:
                assert tally.summary() == brute(list(nodes.values())), seed
        assert tally.summary() == brute(list(nodes.values())), seed
        assert not drift(tally, nodes.values())
        assert GPUTally(nodes.values()).summary() == brute(list(nodes.values()))


def test_a_missed_change_is_found_by_the_recount() -> None:
    idle = NodeInventory(name="a", nvlink_domain="node:a", allocatable={"nvidia.com/gpu": 8})
    tally = GPUTally([idle])
    busy = idle.model_copy(update={"requested": {"nvidia.com/gpu": 8}})
    assert drift(tally, [busy])
    assert not drift(tally, [idle])


async def test_the_hubs_kept_summaries_show_no_drift_after_snapshots_and_deltas() -> None:
    """Snapshots (nodes added, changed, removed) and deltas through Members; the MemberCluster
    status the hub writes matches the brute-force summary and the recount finds no drift."""
    from gpufed.api.stream import InventoryDelta, InventorySnapshot
    from tests.unit.hub.builders import membercluster_obj
    from tests.unit.hub.term import Term

    t = Term()
    t.ctrl.members.on_event("ADDED", membercluster_obj("m1"))
    m = t.ctrl.state.member("m1")
    rng = random.Random(5)
    for seq in range(1, 30):
        if seq % 7 == 1:
            names = rng.sample(range(60), 40)
            nodes = tuple(random_node(rng, f"n{i}") for i in names)
            t.ctrl.members.on_snapshot(m, InventorySnapshot(seq=seq, nodes=nodes))
        else:
            ups = tuple(random_node(rng, f"n{rng.randint(0, 59)}") for _ in range(5))
            gone = tuple(f"n{rng.randint(0, 59)}" for _ in range(2))
            t.ctrl.members.on_delta(m, InventoryDelta(seq=seq, upserts=ups, removed=gone))
        want = brute(list(m.nodes.values()))
        assert t.ctrl.members.tally(m).summary() == want
    assert t.ctrl.members.recount() == 0
    assert t.ctrl.metrics.incremental_drift.labels("member_gpus")._value.get() == 0


async def test_the_recount_round_is_spread_over_ticks_and_finds_a_missed_change(
    monkeypatch: Any,
) -> None:
    """The tick checks at most RECOUNT_NODES_PER_TICK nodes' worth of members (whole members,
    at least one), so 100 members x 5,000 nodes never hold the event loop in one turn; the
    round still reaches every member and finds a summary that a missed change left wrong."""
    from gpufed.hub.components import members as members_mod
    from tests.unit.hub.builders import hgx_node
    from tests.unit.hub.term import Term

    monkeypatch.setattr(members_mod, "RECOUNT_NODES_PER_TICK", 3)
    t = Term()
    for i in range(5):
        t.member(f"m{i}", hgx_node(f"m{i}-a"), hgx_node(f"m{i}-b"))
    ms = t.ctrl.members
    for i in range(5):
        ms.tally(t.ctrl.state.members[f"m{i}"])
    checked: list[str] = []
    real = members_mod.drift

    def counting(tally: GPUTally, nodes: Any) -> bool:
        nodes = list(nodes)
        checked.append(nodes[0].name.split("-")[0])
        return real(tally, nodes)

    monkeypatch.setattr(members_mod, "drift", counting)
    # a change behind the table: m4's kept summary counts a node it no longer has
    ms._tallies["m4"] = GPUTally([*t.ctrl.state.members["m4"].nodes.values(), hgx_node("x")])
    value = t.ctrl.metrics.incremental_drift.labels("member_gpus")._value
    await ms.check_health()
    assert checked == [], "no round before RECOUNT_INTERVAL_S"
    t.clock.advance(members_mod.RECOUNT_INTERVAL_S)
    await ms.check_health()
    assert checked == ["m0", "m1"]  # 2 + 2 nodes: the share of 3 is passed after the second
    await ms.check_health()
    assert checked == ["m0", "m1", "m2", "m3"]
    assert value.get() == 0
    await ms.check_health()
    assert checked == ["m0", "m1", "m2", "m3", "m4"]
    assert value.get() == 1
    await ms.check_health()  # the round is over: the next starts RECOUNT_INTERVAL_S later
    assert len(checked) == 5
    assert ms.recount() == 0, "m4 was rebuilt"
