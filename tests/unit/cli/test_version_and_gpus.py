"""``gpufed version`` (client, protocol, the hub's GET /version) and ``gpufed get gpus`` (the
fleet by product from MemberCluster statuses)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufed.api.version import gpufed_version, protocol_version
from gpufed.cli.gpus import gpu_rows
from gpufed.cli.main import app
from tests.unit.cli.fake_api import kubeconfig, serving

H100 = "NVIDIA-H100-80GB-HBM3"
GB200 = "NVIDIA-GB200"


@pytest.fixture(autouse=True)
def no_sandbox(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUFED_STATE_DIR", str(tmp_path / "no-sandbox"))
    monkeypatch.delenv("GPUFED_HUB_URL", raising=False)


def test_version_without_a_hub_says_how_to_name_one() -> None:
    result = CliRunner().invoke(app, ["version"])
    assert result.exit_code == 0
    assert f"client:   {gpufed_version()}" in result.output
    assert f"protocol: {protocol_version()}" in result.output
    assert "--hub-url" in result.output


def test_version_asks_the_hubs_version_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    about = {"version": "9.9.9", "protocolVersion": protocol_version(), "hubId": "hub-0"}
    with serving(200, about) as url:
        monkeypatch.setenv("GPUFED_HUB_URL", url)
        result = CliRunner().invoke(app, ["version", "--json"])
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert doc["hub"] == about
    assert doc["client"] == {"version": gpufed_version(), "protocolVersion": protocol_version()}


def test_a_named_hub_that_does_not_answer_exits_1() -> None:
    result = CliRunner().invoke(app, ["version", "--hub-url", "http://127.0.0.1:1"])
    assert result.exit_code == 1
    assert "cannot reach the hub at http://127.0.0.1:1" in result.output


async def test_the_hub_serves_its_version() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from gpufed.hub.components.metrics import HubMetrics
    from gpufed.hub.edge.http import make_app

    about = {"version": "1.2.3", "protocolVersion": 1, "hubId": "h"}
    app_ = make_app(HubMetrics(), lambda: (True, "ok"), about)
    async with TestClient(TestServer(app_)) as client:
        resp = await client.get("/version")
        assert resp.status == 200
        assert await resp.json() == about


def member(
    name: str, *, ready: bool = True, total: dict[str, int], free: dict[str, int], **extra: Any
) -> dict[str, Any]:
    """A MemberCluster as the hub API serves it."""
    status = {
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": "AgentConnected" if ready else "LeaseExpired",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "gpusTotal": total,
        "gpusFree": free,
        **extra,
    }
    return {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "MemberCluster",
        "metadata": {"name": name},
        "spec": {"joinTokenRef": {"name": f"t-{name}"}},
        "status": status,
    }


FLEET = [
    member(
        "us-hgx",
        total={H100: 64},
        free={H100: 20},
        gpusReserved={H100: 4},
        largestFreeNVLinkBlockByProduct={H100: 8},
    ),
    member(
        "eu-mixed",
        total={H100: 16, GB200: 72},
        free={H100: 8, GB200: 72},
        largestFreeNVLinkBlock=72,
        largestFreeNVLinkBlockByProduct={H100: 8, GB200: 72},
    ),
    member("down", ready=False, total={H100: 8}, free={H100: 8}),
]


def test_gpus_by_product_count_free_from_ready_members_net_of_reservations() -> None:
    rows = {r["product"]: r for r in gpu_rows(FLEET)}
    h100 = rows[H100]
    assert (h100["total"], h100["free"], h100["reserved"]) == (88, 16 + 8, 4)
    assert h100["shortName"] == "H100-SXM"
    assert [(m["name"], m["free"], m["total"]) for m in h100["members"]] == [
        ("down", 0, 8),
        ("eu-mixed", 8, 16),
        ("us-hgx", 16, 64),
    ]
    # ties on the largest block go to the member name
    assert (h100["largestFreeNVLinkBlock"], h100["largestFreeNVLinkBlockMember"]) == (8, "eu-mixed")
    gb = rows[GB200]
    assert (gb["total"], gb["free"], gb["largestFreeNVLinkBlock"]) == (72, 72, 72)


def test_get_gpus_reads_memberclusters_from_the_hub(tmp_path: Path) -> None:
    with serving(200, {"kind": "MemberClusterList", "items": FLEET}) as url:
        cfg = kubeconfig(tmp_path / "k", url)
        result = CliRunner().invoke(app, ["get", "gpus", "--kubeconfig", str(cfg)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:4] == ["GPU", "SHORT", "TOTAL", "FREE"]
    assert lines[1].split()[:4] == [H100, "H100-SXM", "88", "24"]
    assert "down=0/8 (NotReady)" in lines[1]
    assert lines[2].split()[:4] == [GB200, "GB200", "72", "72"]
    assert lines[2].endswith("72 (eu-mixed)")
