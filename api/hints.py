"""Placement hints on a plain workload: the ``gpufed.io/*`` annotations and the queue label,
read into a GPUJob's ``spec.placement``.

The one reader shared by ``gpufed submit`` (:func:`gpufed.cli.jobs.wrap`) and the hub's
managed plain workloads (:mod:`gpufed.hub.rules.managed`), so that a Job wrapped by the CLI and
a Job applied to the hub with ``managedBy: gpufed.io/hub`` are placed alike (docs/design.md §4).
"""

from __future__ import annotations

from typing import Any

from gpufed.api.errors import FieldError
from gpufed.api.labels import (
    GPU_PRODUCTS_ANNOTATION,
    NVLINK_ANNOTATION,
    PRIORITY_ANNOTATION,
    QUEUE_LABEL,
)

__all__ = ["placement_hints"]


def _strings(meta: dict[str, Any], key: str) -> dict[str, str]:
    values = meta.get(key) or {}
    if not isinstance(values, dict):
        raise FieldError(f"metadata.{key}", "must be a mapping of strings")
    for k, v in values.items():
        if not isinstance(v, str):
            raise FieldError(f"metadata.{key}[{k}]", f"{v!r} must be a string (quote it in YAML)")
    return values


def placement_hints(meta: dict[str, Any]) -> dict[str, Any]:
    """``spec.placement`` (JSON form) from a workload's ``metadata``.

    ``gpufed.io/gpu-products`` (comma-separated) -> ``gpuProducts``; ``gpufed.io/nvlink``
    (``Required``/``Preferred``/``None``) -> ``topology.nvlink``; ``gpufed.io/priority``
    (integer) -> ``priority``; the label ``gpufed.io/queue`` -> ``queue``. Absent keys add
    nothing. Raises :class:`~gpufed.api.errors.FieldError` naming the annotation or label.
    """
    ann = _strings(meta, "annotations")
    labels = _strings(meta, "labels")
    placement: dict[str, Any] = {}
    if products := ann.get(GPU_PRODUCTS_ANNOTATION):
        placement["gpuProducts"] = [p.strip() for p in products.split(",") if p.strip()]
    if nvlink := ann.get(NVLINK_ANNOTATION):
        if nvlink not in ("Required", "Preferred", "None"):
            raise FieldError(
                f"metadata.annotations[{NVLINK_ANNOTATION}]",
                f"{nvlink!r} is not Required, Preferred or None",
            )
        placement["topology"] = {"nvlink": nvlink}
    if priority := ann.get(PRIORITY_ANNOTATION):
        try:
            placement["priority"] = int(priority)
        except ValueError as exc:
            raise FieldError(
                f"metadata.annotations[{PRIORITY_ANNOTATION}]", f"{priority!r} is not an integer"
            ) from exc
    if queue := labels.get(QUEUE_LABEL):
        placement["queue"] = queue
    return placement
