"""Metrics hygiene (gpufed.hub.components.metrics, gpufed.sync.buildinfo): build and process metrics on
every hub and agent; a deleted member's series go; a replica that stops leading exports no
fleet or queue series."""

from __future__ import annotations

from prometheus_client import generate_latest

from gpufed.agent.metrics import AgentMetrics
from gpufed.api.version import gpufed_version, protocol_version
from gpufed.hub.components.metrics import HubMetrics
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, settle


def exposition(metrics: HubMetrics | AgentMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_hub_and_agent_export_build_info_and_process_metrics() -> None:
    for component, metrics in (("hub", HubMetrics()), ("agent", AgentMetrics())):
        text = exposition(metrics)
        assert (
            f'gpufed_build_info{{component="{component}",protocol="{protocol_version()}",'
            f'version="{gpufed_version()}"}} 1.0' in text
        )
        assert "process_resident_memory_bytes" in text
        assert "python_info" in text


async def test_a_deleted_members_series_are_removed() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    t.member("m2", hgx_node("m2-n0"))
    t.ctrl.members.write_all_statuses()
    text = exposition(t.ctrl.metrics)
    assert 'gpufed_cluster_ready{cluster="m1"} 1.0' in text
    assert 'gpufed_cluster_lost{cluster="m1"} 0.0' in text
    assert 'gpufed_cluster_largest_free_nvlink_block{cluster="m1"' in text
    assert 'gpufed_reservations{cluster="m1"} 0.0' in text
    t.ctrl.members.on_event("DELETED", {"metadata": {"name": "m1"}})
    await settle()
    text = exposition(t.ctrl.metrics)
    assert 'cluster="m1"' not in text
    assert 'gpufed_cluster_ready{cluster="m2"} 1.0' in text


async def test_a_replica_that_stops_leading_exports_no_fleet_series() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    t.ctrl.members.write_all_statuses()
    t.ctrl.metrics.is_leader.set(1)
    t.ctrl.metrics.queue_pending_jobs.labels("q").set(3)
    await t.ctrl.shutdown("leadership lost")
    text = exposition(t.ctrl.metrics)
    assert "gpufed_hub_is_leader 0.0" in text
    for name in ("gpufed_cluster_ready{", "gpufed_cluster_gpus{", "gpufed_queue_pending_jobs{"):
        assert name not in text
