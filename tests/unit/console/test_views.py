"""The console's views (pure): what each page shows for hand-built hub objects. Expected values
are worked out by hand in each test, not by the code under test."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpufed.console import views

H100 = "NVIDIA-H100-80GB-HBM3"
NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)


def member(name: str, *, ready: str | None = "True", reason: str = "Ok", **status: Any) -> Any:
    conds = (
        []
        if ready is None
        else [{"type": "Ready", "status": ready, "reason": reason, "message": "m"}]
    )
    return {
        "metadata": {"name": name},
        "spec": {"joinTokenRef": {"name": f"{name}-join"}},
        "status": {"conditions": conds, **status},
    }


def queue(name: str, parent: str | None = None, **spec: Any) -> Any:
    return {"metadata": {"name": name}, "spec": {"parent": parent, **spec}}


def job(ns: str, name: str, created: str, phase: str | None = None, **spec: Any) -> Any:
    obj: dict[str, Any] = {
        "metadata": {"namespace": ns, "name": name, "creationTimestamp": created},
        "spec": {"template": {"kind": "Job"}, **spec},
    }
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def test_a_busy_member_splits_its_gpus_into_used_reserved_and_free() -> None:
    """64 GPUs, 20 free, 8 reserved: 36 used."""
    (m,) = views.fleet(
        [
            member(
                "hgx",
                gpusTotal={H100: 64},
                gpusFree={H100: 20},
                gpusReserved={H100: 8},
                largestFreeNVLinkBlockByProduct={H100: 8},
                largestFreeNVLinkBlock=8,
            )
        ]
    )
    (bar,) = m.products
    assert (bar.used, bar.reserved, bar.free, bar.total) == (36, 8, 20, 64)
    assert bar.percent(bar.used) == pytest.approx(56.25)
    assert m.state == "Ready"


def test_reserved_never_makes_used_negative() -> None:
    """A status written between two reports may say more reserved than not free: the bar still
    adds up to the total (8 total, 6 free, 5 reserved: 2 reserved, 0 used)."""
    (m,) = views.fleet(
        [member("a", gpusTotal={H100: 8}, gpusFree={H100: 6}, gpusReserved={H100: 5})]
    )
    (bar,) = m.products
    assert (bar.used, bar.reserved, bar.free) == (0, 2, 6)


def test_blocks_attach_with_suspects_and_fragmentation() -> None:
    """Three 8-GPU blocks: one wholly free, one with 3 free (stranded), one full whose node is
    suspect; a member without an answer keeps no blocks."""
    members = views.fleet(
        [member("a", suspectNodes=[{"node": "n2", "reason": "NodeLost"}]), member("b")]
    )
    answer = {
        "blocks": [
            {"domain": "node:n0", "free": 8, "nodes": ["n0"]},
            {"domain": "node:n1", "used": 5, "free": 3, "nodes": ["n1"]},
            {"domain": "node:n2", "unavailable": 8, "nodes": ["n2"]},
        ],
        "truncated": 4,
    }
    a, b = views.with_blocks(members, {"a": answer})
    assert b.blocks is None
    assert a.blocks is not None
    assert [(x.state, x.suspect) for x in a.blocks] == [
        ("free", False),
        ("partial", False),
        ("suspect", True),
    ]
    assert a.blocks[1].cells() == ["used"] * 5 + ["free"] * 3
    assert a.blocks[2].cells() == ["suspect"] * 8
    assert (a.whole_free_blocks, a.stranded, a.blocks_truncated, a.compact) == (1, 3, 4, False)


def test_a_member_past_the_cell_bound_is_drawn_one_cell_per_block() -> None:
    blocks = [{"domain": f"node:n{i}", "free": 8} for i in range(views.MAX_CELLS // 8 + 1)]
    (m,) = views.with_blocks(views.fleet([member("a")]), {"a": {"blocks": blocks}})
    assert m.compact


@pytest.mark.parametrize(
    ("ready", "reason", "extra", "state"),
    [
        ("True", "Ok", {}, "Ready"),
        ("False", "LeaseExpired", {}, "NotReady"),
        ("False", "ClusterLost", {}, "Lost"),
        ("False", "LeaseExpired", {"lostTime": "2026-12-03T11:00:00Z"}, "Lost"),
        (None, "", {}, "Unknown"),
    ],
)
def test_member_state_from_ready_condition_and_lost_time(
    ready: str | None, reason: str, extra: dict[str, Any], state: str
) -> None:
    (m,) = views.fleet([member("a", ready=ready, reason=reason, **extra)])
    assert m.state == state


def test_queue_tree_is_depth_first_with_orphans_and_cycles_as_roots() -> None:
    """org > (team-a > sub, team-b); a queue whose parent is unreadable is a root; a two-queue
    cycle is still shown, each once."""
    items = [
        queue("team-b", "org"),
        queue("sub", "team-a"),
        queue("org"),
        queue("team-a", "org"),
        queue("orphan", "hidden-parent"),
        queue("x", "y"),
        queue("y", "x"),
    ]
    tree = views.queue_tree(items)
    assert [(q.name, q.depth) for q in tree] == [
        ("org", 0),
        ("team-a", 1),
        ("sub", 2),
        ("team-b", 1),
        ("orphan", 0),
        ("x", 0),
        ("y", 1),
    ]


def test_queue_quota_lines_follow_spec_then_usage_only_keys() -> None:
    q = queue("t", quotas=[{"gpuProduct": H100, "nominal": 16, "borrowingLimit": 8}])
    q["status"] = {
        "usage": [
            {"gpuProduct": H100, "nominal": 16, "used": 20, "borrowed": 4},
            {"gpuProduct": "*", "nominal": 0, "used": 2, "borrowed": 2},
        ],
        "pendingJobs": 3,
    }
    (v,) = views.queue_tree([q])
    assert [(x.key, x.nominal, x.used, x.borrowed, x.idle) for x in v.quotas] == [
        (H100, 16, 20, 4, 0),
        ("*", 0, 2, 2, 0),
    ]
    assert v.quotas[0].borrowing_limit == 8
    assert v.pending == 3


def test_job_rows_newest_first_and_filtered() -> None:
    items = [
        job("a", "old", "2026-12-03T10:00:00Z", "Succeeded"),
        job("b", "new", "2026-12-03T11:00:00Z"),
        job("a", "mid", "2026-12-03T10:30:00Z", "Running", placement={"queue": "special"}),
        job("a", "mid2", "2026-12-03T10:30:00Z", "Running"),
    ]
    ns_queue = {"a": "team-a", "b": "team-b"}
    rows = views.job_rows(items, ns_queue)
    assert [r.name for r in rows] == ["new", "mid", "mid2", "old"]
    assert rows[0].phase == "Pending"  # no status yet
    assert [r.queue for r in rows] == ["team-b", "special", "team-a", "team-a"]
    assert [r.name for r in views.job_rows(items, ns_queue, namespace="a", phase="Running")] == [
        "mid",
        "mid2",
    ]
    assert [r.name for r in views.job_rows(items, ns_queue, queue="team-a")] == ["mid2", "old"]


def test_timeline_orders_status_facts_and_events_by_time() -> None:
    raw = job("a", "j", "2026-12-03T10:00:00Z", "Running")
    raw["status"].update(
        {
            "cluster": "m1",
            "placement": {
                "outcome": "Placed",
                "cluster": "m1",
                "nvlinkDomains": ["clique:c1"],
                "podSets": [{"name": "w", "nodes": {"n2": 1, "n1": 1}}],
                "decidedTime": "2026-12-03T10:05:00Z",
            },
            "restartHistory": [
                {
                    "attempt": 1,
                    "cluster": "m0",
                    "nodes": ["n9"],
                    "reason": "NodeLost",
                    "time": "2026-12-03T10:04:00Z",
                }
            ],
            "startTime": "2026-12-03T10:06:00Z",
        }
    )
    events = [
        {"reason": "Placed", "message": "placed on m0", "lastTimestamp": "2026-12-03T10:01:00Z"},
        {
            "reason": "Preempted",
            "message": "by a/big",
            "eventTime": "2026-12-03T10:02:00.123456+00:00",
            "count": 2,
        },
    ]
    t = views.timeline(raw, events)
    assert [(e.time[11:19], e.kind) for e in t] == [
        ("10:00:00", "submitted"),
        ("10:01:00", "placed"),
        ("10:02:00", "preempted"),
        ("10:04:00", "failure"),
        ("10:05:00", "placed"),
        ("10:06:00", "running"),
    ]
    assert t[2].title == "Preempted (x2)"
    assert t[2].time == "2026-12-03T10:02:00Z"  # one spelling for every time
    assert "n1, n2" in t[4].detail
    assert "clique:c1" in t[4].detail
    assert "NodeLost" in t[3].title
    assert "n9" in t[3].detail


@pytest.mark.parametrize(
    ("then", "shown"),
    [("2026-12-03T11:59:30Z", "30s"), ("2026-12-03T09:00:00Z", "3h"), (None, "-"), ("x", "-")],
)
def test_age(then: str | None, shown: str) -> None:
    assert views.age(then, NOW) == shown


def test_sparkline_maps_time_and_value_into_the_box() -> None:
    """Samples at t=0, 50, 100 with values 0, 5, 10 in a 100 x 10 box: left-bottom,
    middle-middle, right-top; fewer than two samples draw nothing."""
    assert views.sparkline([(100, 10), (0, 0), (50, 5)], width=100, height=10) == (
        "0.0,10.0 50.0,5.0 100.0,0.0"
    )
    assert views.sparkline([(0, 1.0)]) == ""


def test_gpus_held_for_a_preemptor_have_their_own_cells() -> None:
    answer = {
        "blocks": [{"domain": "node:n0", "used": 2, "reserved": 1, "held": 3, "free": 2}],
        "truncated": 0,
    }
    [a] = views.with_blocks(views.fleet([member("a")]), {"a": answer})
    assert a.blocks is not None
    assert a.blocks[0].cells() == ["used"] * 2 + ["reserved"] + ["held"] * 3 + ["free"] * 2
    assert a.blocks[0].gpus == 8
