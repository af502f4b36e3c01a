"""A placement request reduced to what the placement loop reads on every candidate.

``place()`` builds one :class:`JobShape` per call from the :class:`PlacementRequest`; plugins
and the fit code read it instead of the pydantic request, so the hot loop touches plain tuples.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gpufed.api.inventory import Toleration
from gpufed.api.labels import GPU_PRODUCT_LABEL, GPU_RESOURCE, MIG_STRATEGY_LABEL
from gpufed.api.request import PlacementRequest
from gpufed.api.resources import is_extended_resource

#: finest first
LEVEL_ORDER = ("nvlink", "rack", "block")


@dataclass(slots=True)
class PodSetShape:
    """One pod set: ``count`` pods of ``gpus`` whole GPUs plus ``other`` resources each.

    ``other``: every non-GPU resource with a positive per-pod amount, as (name, amount).
    ``extended``: the non-GPU extended resources among them (MIG profiles and the like).
    ``selector``: the pod template's ``nodeSelector`` as sorted (key, value) pairs.
    """

    index: int
    name: str
    count: int
    gpus: int
    requests: dict[str, int]
    other: tuple[tuple[str, int], ...]
    extended: tuple[str, ...]
    selector: tuple[tuple[str, str], ...]
    tolerations: tuple[Toleration, ...]
    #: None: GPUs through the extended resource; else through DRA claims, with these selectors
    claim_selectors: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Attempt:
    """One way to keep the job's GPU pods together, tried in order.

    ``level``: the group every GPU pod must share (``nvlink``, ``rack``, ``block``), or None
    for anywhere in the pool. ``rank``: index of that level among the levels the job asked for
    (0 = the finest wish met), or None when it earns no topology credit. ``mode``: how nodes are
    chosen when ungrouped: ``bestfit`` (tightest nodes first) or ``fewest`` (fewest domains).
    """

    level: str | None
    rank: int | None
    mode: str = "bestfit"


@dataclass(slots=True)
class JobShape:
    """What placement needs from one request, precomputed once per ``place()`` call."""

    request: PlacementRequest
    gpu_sets: tuple[PodSetShape, ...]
    other_sets: tuple[PodSetShape, ...]
    sets: tuple[PodSetShape, ...]
    demand: int
    gpu_pods: int
    max_gpus: int
    products: frozenset[str] | None
    wished: tuple[tuple[str, str], ...]
    required: frozenset[str]
    attempts: tuple[Attempt, ...]
    #: every attempt keeps all GPU pods inside one NVLink domain
    grouped_only: bool
    #: the request's constraints read by the static filters (memo key)
    static_key: Any
    #: everything a plan in one pool depends on (memo key of plans); None when the plan also
    #: depends on nodes outside the pool (pod sets without GPUs)
    fit_key: Any

    @classmethod
    def of(cls, request: PlacementRequest) -> JobShape:
        """Reduce a request; pod sets keep their order in ``sets``."""
        sets: list[PodSetShape] = []
        for i, ps in enumerate(request.pod_sets):
            other = tuple(
                (r, a) for r, a in sorted(ps.requests.items()) if r != GPU_RESOURCE and a > 0
            )
            sets.append(
                PodSetShape(
                    index=i,
                    name=ps.name,
                    count=ps.count,
                    gpus=ps.requests.get(GPU_RESOURCE, 0),
                    requests=ps.requests,
                    other=other,
                    extended=tuple(r for r, _ in other if is_extended_resource(r)),
                    selector=tuple(sorted(ps.node_selector.items())),
                    tolerations=ps.tolerations,
                    claim_selectors=ps.claim_selectors,
                )
            )
        gpu_sets = tuple(sorted((s for s in sets if s.gpus > 0), key=lambda s: (-s.gpus, s.index)))
        other_sets = tuple(s for s in sets if s.gpus == 0)
        demand = sum(s.gpus * s.count for s in gpu_sets)
        gpu_pods = sum(s.count for s in gpu_sets)
        topo = request.topology
        wished = tuple(
            (lv, pol)
            for lv, pol in (("nvlink", topo.nvlink), ("rack", topo.rack), ("block", topo.block))
            if pol in ("Required", "Preferred")
        )
        required = frozenset(lv for lv, pol in wished if pol == "Required")
        attempts = _attempts(wished, topo.nvlink, min(gpu_pods, 2))
        sel = request.cluster_selector
        sel_key = (
            None
            if sel is None
            else (tuple(sorted(sel.match_labels.items())), sel.match_expressions)
        )
        products = frozenset(request.gpu_products) if request.gpu_products else None
        shapes = tuple((s.index, s.gpus, s.count, s.other, s.selector) for s in gpu_sets)
        static_key = (
            products,
            sel_key,
            request.workload_kind,
            tuple(
                (s.gpus > 0, s.tolerations, s.selector, s.extended, s.claim_selectors) for s in sets
            ),
        )
        return cls(
            request=request,
            gpu_sets=gpu_sets,
            other_sets=other_sets,
            sets=tuple(sets),
            demand=demand,
            gpu_pods=gpu_pods,
            max_gpus=max((s.gpus for s in gpu_sets), default=0),
            products=products,
            wished=wished,
            required=required,
            attempts=attempts,
            grouped_only=all(a.level == "nvlink" for a in attempts),
            static_key=static_key,
            fit_key=None if other_sets else (shapes, attempts, wished),
        )

    def selector_pins(self, label: str) -> set[str] | None:
        """Values every GPU pod set's nodeSelector pins ``label`` to (None if unpinned)."""
        values: set[str] | None = None
        for s in self.gpu_sets:
            for k, v in s.selector:
                if k == label:
                    values = {v} if values is None else values & {v}
        return values


@lru_cache(maxsize=256)
def _attempts(
    wished: tuple[tuple[str, str], ...], nvlink: str, gpu_pods: int
) -> tuple[Attempt, ...]:
    """The ordered ways to keep GPU pods together (docs/placement.md, "Topology fit").

    Wished levels are tried finest first; a Required level ends the list (Kueue semantics:
    Preferred climbs, Required does not). A single GPU pod always sits in one NVLink domain, so
    it is only ever placed grouped at ``nvlink`` (best fit over domains). Without an NVLink
    wish, the job is still first tried inside one domain (best fit keeps fragmentation low),
    without topology credit.
    """
    if gpu_pods == 0:
        return (Attempt(None, None),)
    if gpu_pods == 1:
        # one pod is always inside one node, hence one domain, rack and block: every wish is
        # met by the best-fit domain
        return (Attempt("nvlink", 0 if wished else None),)
    out: list[Attempt] = []
    if nvlink == "None":
        out.append(Attempt("nvlink", None))
    for rank, (lv, pol) in enumerate(wished):
        out.append(Attempt(lv, rank))
        if pol == "Required":
            break
    else:
        mode = "fewest" if nvlink == "Preferred" else "bestfit"
        out.append(Attempt(None, None, mode))
    return tuple(out)


#: Node labels whose values a pod set's nodeSelector may pin and that a pool fixes.
POOL_LABELS = (GPU_PRODUCT_LABEL, MIG_STRATEGY_LABEL)
