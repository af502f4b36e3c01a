"""The build and process metrics every gpufed process exports (hub and agent alike).

Called by :class:`gpufed.hub.components.metrics.HubMetrics` and :class:`gpufed.agent.metrics.AgentMetrics`
when they build their registries; it lives here because ``sync`` is what hub and agent share.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, PlatformCollector, ProcessCollector

from gpufed.api.version import gpufed_version, protocol_version


def register_build_info(registry: CollectorRegistry, component: str) -> Gauge:
    """Register ``gpufed_build_info{component, version, protocol} 1`` on ``registry``
    (``component``: ``hub`` or ``agent``; ``version``: the gpufed distribution's; ``protocol``:
    the agent protocol version this build speaks), plus prometheus-client's process collector
    (``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
    ``process_open_fds``, ``process_start_time_seconds``; Linux only) and platform collector
    (``python_info``). Returns the build-info gauge."""
    info = Gauge(
        "gpufed_build_info",
        "Always 1; the labels say which gpufed build and agent protocol version runs.",
        ["component", "version", "protocol"],
        registry=registry,
    )
    info.labels(component, gpufed_version(), str(protocol_version())).set(1)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return info
