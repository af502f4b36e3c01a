"""The rows of ``gpufed get gpus`` (the command: :mod:`gpufed.cli.get`): the fleet by GPU product, as ``sky show-gpus`` shows it across clouds.

Per GPU product (GFD ``nvidia.com/gpu.product``, with its short name from the GPU catalogue,
``api/gpus.py``): whole GPUs in all, free now, per member ``free/total``, and the largest free
NVLink block (the most free GPUs of that product inside one NVLink domain, and where). Read
from the MemberCluster statuses on the hub cluster (docs/design.md §3 meanings), like
``gpufed get clusters``. Free = reported free minus GPUs reserved for dispatched jobs whose
pods are not bound yet; only Ready members count as free (placement skips the others).
"""

from __future__ import annotations

from typing import Any

from gpufed.api.gpus import short_name
from gpufed.api.membercluster import MemberCluster

__all__ = ["gpu_rows"]


def gpu_rows(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``get gpus --json``: one object per GPU product, most GPUs first (ties by name).

    Each: ``product``, ``shortName`` (None when none is documented), ``total``, ``free``,
    ``reserved``, ``largestFreeNVLinkBlock`` and ``largestFreeNVLinkBlockMember``, and
    ``members``: ``[{name, ready, total, free, reserved, largestFreeNVLinkBlock}]`` by name.
    A status without the per-product block (an older hub) uses the member-wide one.
    """
    by_product: dict[str, list[dict[str, Any]]] = {}
    for raw in items:
        mc = MemberCluster.model_validate(raw)
        s = mc.status
        if s is None:
            continue
        ready = s.ready()
        for product, total in s.gpus_total.items():
            reserved = s.gpus_reserved.get(product, 0)
            free = max(0, s.gpus_free.get(product, 0) - reserved) if ready else 0
            block = s.largest_free_nvlink_block_by_product.get(
                product, s.largest_free_nvlink_block or 0
            )
            by_product.setdefault(product, []).append(
                {
                    "name": mc.metadata.name,
                    "ready": ready,
                    "total": total,
                    "free": free,
                    "reserved": reserved,
                    "largestFreeNVLinkBlock": min(block, free) if ready else 0,
                }
            )
    rows = []
    for product, members in by_product.items():
        members.sort(key=lambda m: m["name"])
        best = min(members, key=lambda m: (-m["largestFreeNVLinkBlock"], m["name"]))
        rows.append(
            {
                "product": product,
                "shortName": short_name(product),
                "total": sum(m["total"] for m in members),
                "free": sum(m["free"] for m in members),
                "reserved": sum(m["reserved"] for m in members),
                "largestFreeNVLinkBlock": best["largestFreeNVLinkBlock"],
                "largestFreeNVLinkBlockMember": best["name"]
                if best["largestFreeNVLinkBlock"]
                else None,
                "members": members,
            }
        )
    rows.sort(key=lambda r: (-r["total"], r["product"]))
    return rows
