"""The hub's ``/fleet/members/<name>/blocks``: one member's NVLink blocks from the placement
snapshot (:func:`gpufed.hub.rules.blocks.member_blocks`, counts worked out by hand below), and
who may read them (:class:`gpufed.hub.edge.access.AccessCheck`: a bearer token, reviewed by the
hub cluster, cached). The reviews against a real API server are in
tests/integration/console/."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpufed.api.decision import Reservation
from gpufed.api.inventory import ClusterInventory, MemberClusterState, NodeInventory
from gpufed.hub.components.metrics import HubMetrics
from gpufed.hub.edge.access import AccessCheck
from gpufed.hub.edge.http import make_app
from gpufed.hub.rules.blocks import member_blocks
from gpufed.placement import FleetSnapshot

H100, GB200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-GB200"


def node(name: str, domain: str, product: str, gpus: int, requested: int = 0, **kw: Any) -> Any:
    return NodeInventory(
        name=name,
        gpu_product=product,
        nvlink_domain=domain,
        allocatable={"nvidia.com/gpu": gpus, "cpu": 96000},
        requested={"nvidia.com/gpu": requested} if requested else {},
        **kw,
    )


def snapshot() -> FleetSnapshot:
    """m1: hgx-0 (8 GPUs, 3 requested, 2 reserved), hgx-1 (8, NotReady), cpu-0 (no GPU); and a
    2-tray clique of 4 GPUs each, one tray with 4 requested."""
    nodes = (
        node("hgx-0", "node:hgx-0", H100, 8, requested=3),
        node("hgx-1", "node:hgx-1", H100, 8, ready=False),
        NodeInventory(name="cpu-0", nvlink_domain="node:cpu-0", allocatable={"cpu": 8000}),
        node("tray-0", "clique:c1", GB200, 4, requested=4),
        node("tray-1", "clique:c1", GB200, 4),
    )
    snap = FleetSnapshot(
        [MemberClusterState(name="m1", inventory=ClusterInventory(cluster="m1", nodes=nodes))]
    )
    snap.add_reservation(
        Reservation(
            job_uid="u1",
            cluster="m1",
            nodes={"hgx-0": {"nvidia.com/gpu": 2}},
            created_at=0.0,
            ttl_s=600.0,
        )
    )
    return snap


def test_blocks_count_used_reserved_free_and_unavailable_per_domain() -> None:
    got = member_blocks(snapshot(), "m1")
    rows = [
        (b["domain"], b["gpus"], b["used"], b["reserved"], b["free"], b["unavailable"], b["nodes"])
        for b in got["blocks"]
    ]
    assert rows == [
        ("clique:c1", 8, 4, 0, 4, 0, ["tray-0", "tray-1"]),
        ("node:hgx-0", 8, 3, 2, 3, 0, ["hgx-0"]),
        ("node:hgx-1", 8, 0, 0, 0, 8, ["hgx-1"]),
    ]
    assert (got["member"], got["nodes"], got["truncated"]) == ("m1", 5, 0)


def test_gpus_held_for_a_preemptor_are_shown_apart_from_reserved() -> None:
    # u1's 2 reserved GPUs on hgx-0 are a waiting preemptor's hold (the controller says so)
    got = member_blocks(snapshot(), "m1", held={"hgx-0": 2, "tray-1": 3})
    hgx0 = next(b for b in got["blocks"] if b["domain"] == "node:hgx-0")
    assert (hgx0["used"], hgx0["reserved"], hgx0["held"], hgx0["free"]) == (3, 0, 2, 3)
    # a hold is never more than what the snapshot shows reserved there
    c1 = next(b for b in got["blocks"] if b["domain"] == "clique:c1")
    assert (c1["held"], c1["free"]) == (0, 4)


def test_blocks_are_bounded() -> None:
    got = member_blocks(snapshot(), "m1", max_blocks=1)
    assert [b["domain"] for b in got["blocks"]] == ["clique:c1"]
    assert got["truncated"] == 2


def test_unknown_member_is_a_key_error() -> None:
    with pytest.raises(KeyError, match="nope"):
        member_blocks(snapshot(), "nope")


class Reviews:
    """A review function that allows ``allowed`` tokens and counts its calls."""

    def __init__(self, allowed: set[str], valid: set[str]) -> None:
        self.allowed, self.valid, self.calls = allowed, valid, 0
        self.fail = False

    async def __call__(self, token: str, attributes: dict[str, str]) -> tuple[bool | None, str]:
        self.calls += 1
        if self.fail:
            raise OSError("connection refused")
        assert attributes == {
            "verb": "get",
            "group": "gpufed.io",
            "resource": "memberclusters",
            "name": attributes["name"],
        }
        if token not in self.valid:
            return None, "invalid token"
        return (True, "alice") if token in self.allowed else (False, "no RBAC rule")


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, 401),
        ("Basic abc", 401),
        ("Bearer ", 401),
        ("Bearer junk", 401),
        ("Bearer denied", 403),
        ("Bearer good", 200),
    ],
)
async def test_access_codes(header: str | None, code: int) -> None:
    check = AccessCheck(Reviews({"good"}, {"good", "denied"}))
    assert (await check.check(header, "m1"))[0] == code


async def test_access_is_cached_per_token_and_member_for_ttl() -> None:
    now = [0.0]
    reviews = Reviews({"good"}, {"good"})
    check = AccessCheck(reviews, ttl_s=10, clock=lambda: now[0])
    for _ in range(3):
        assert (await check.check("Bearer good", "m1"))[0] == 200
    assert reviews.calls == 1
    await check.check("Bearer good", "m2")
    assert reviews.calls == 2
    now[0] = 10.5
    await check.check("Bearer good", "m1")
    assert reviews.calls == 3


async def test_an_unreachable_api_server_is_503_and_not_cached() -> None:
    reviews = Reviews({"good"}, {"good"})
    reviews.fail = True
    check = AccessCheck(reviews)
    assert (await check.check("Bearer good", "m1"))[0] == 503
    reviews.fail = False
    assert (await check.check("Bearer good", "m1"))[0] == 200


async def test_endpoint_answers_blocks_only_to_allowed_bearers() -> None:
    snap = snapshot()
    leader = [True]

    def blocks(name: str) -> Any:
        return member_blocks(snap, name) if leader[0] else None

    app = make_app(
        HubMetrics(),
        lambda: (True, "leader"),
        blocks=blocks,
        access=AccessCheck(Reviews({"good"}, {"good", "denied"})),
    )
    async with TestClient(TestServer(app)) as http:
        resp = await http.get("/fleet/members/m1/blocks")
        assert resp.status == 401
        assert "Bearer" in resp.headers["WWW-Authenticate"]
        assert (await http.get("/fleet/members/m1/blocks", headers=_auth("denied"))).status == 403
        resp = await http.get("/fleet/members/m1/blocks", headers=_auth("good"))
        assert resp.status == 200
        assert len((await resp.json())["blocks"]) == 3
        assert (await http.get("/fleet/members/zz/blocks", headers=_auth("good"))).status == 404
        leader[0] = False
        assert (await http.get("/fleet/members/m1/blocks", headers=_auth("good"))).status == 503


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
