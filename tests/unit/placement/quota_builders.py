"""Shape-named builders for quota tests: queue trees as people describe them.

``org_with_two_teams(nominal=64)`` is ``research`` (no quota of its own: it pools its teams')
over ``team-a`` and ``team-b``, each with 64 H100 and namespaces of the same name.
"""

from __future__ import annotations

from typing import Any

from gpufed.api.gpujob import ObjectMeta
from gpufed.api.queue import GPUQueue, GPUQueueSpec, QueueQuota
from gpufed.placement.quota import QueueTree, build_tree

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"


def quota(
    key: str = H100,
    nominal: int = 0,
    borrowing: int | None = None,
    lending: int | None = None,
) -> QueueQuota:
    """One ``spec.quotas[]`` entry."""
    return QueueQuota(
        gpu_product=key, nominal=nominal, borrowing_limit=borrowing, lending_limit=lending
    )


def gpu_queue(
    name: str,
    *quotas: QueueQuota,
    parent: str | None = None,
    namespaces: tuple[str, ...] | None = None,
    weight: int = 1,
) -> GPUQueue:
    """A GPUQueue listing ``namespaces`` (default: a namespace named after it)."""
    spec: dict[str, Any] = {
        "parent": parent,
        "namespaces": list(namespaces if namespaces is not None else (name,)),
        "quotas": list(quotas),
        "fair_share": {"weight": weight},
    }
    return GPUQueue(metadata=ObjectMeta(name=name), spec=GPUQueueSpec(**spec))


def org_with_two_teams(
    nominal: int = 64,
    *,
    org_nominal: int | None = None,
    borrowing: int | None = None,
    lending: int | None = None,
    key: str = H100,
) -> QueueTree:
    """``research`` over ``team-a`` and ``team-b`` with ``nominal`` of ``key`` each.

    ``org_nominal``: research's own cap (absent: research pools its teams' quotas).
    ``borrowing`` / ``lending``: the teams' limits.
    """
    org = gpu_queue(
        "research",
        *([quota(key, org_nominal)] if org_nominal is not None else []),
        namespaces=(),
    )
    teams = [
        gpu_queue(t, quota(key, nominal, borrowing, lending), parent="research")
        for t in ("team-a", "team-b")
    ]
    return build_tree([org, *teams])
