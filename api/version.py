"""The versions gpufed reports: the distribution's (client, hub, agent) and the agent
protocol's.

Called by ``gpufed version`` (``cli/version.py``), the hub's ``/version`` endpoint
(``hub/edge/app.py`` builds its body) and the agent's ``Hello.agent_version``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["gpufed_version", "protocol_version"]


def gpufed_version() -> str:
    """The installed ``gpufed`` distribution's version (``0.1.0``); ``0.0.0+unknown`` when run
    from a source tree that is not installed."""
    try:
        return version("gpufed")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0+unknown"


def protocol_version() -> int:
    """The newest agent protocol version this build speaks (``PROTOCOL_VERSION_PACKED_NODES``
    of ``api/protocol/agent.proto``, carried in ``Hello`` and ``Welcome``; the hub also serves
    the version before: docs/hub.md, "Version skew")."""
    from gpufed.api.protocol import agent_pb2

    return int(agent_pb2.PROTOCOL_VERSION_PACKED_NODES)
