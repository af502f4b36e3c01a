"""ComputeDomain placement rules: which jobs get a ComputeDomain, where they may not go, how big.

NVIDIA's DRA driver gives a job that spans the trays of a GB200/GB300 NVL72 clique its multi-node
NVLink through a **ComputeDomain** (``resource.nvidia.com/v1beta1``): an IMEX domain over the
nodes of the job's pods, each pod holding the domain's channel claim (docs/placement.md "DRA and
ComputeDomains", ``shared/notes/dra-computedomains.md``). The driver does not keep a job's pods
in one clique; placement does, and these are its rules, read by ``place()`` (:mod:`.engine`):

* a job **wants** a domain when ``spec.placement.topology`` says ``nvlink: Required`` and
  ``computeDomain: Auto`` and it has more than one GPU pod (:func:`wants`);
* the rules **apply** in a pool of multi-node NVLink domains (cliques) of a member whose agent
  reports that it serves the ComputeDomain CRD (:func:`applies`); elsewhere the job is placed
  as before and gets no domain (an HGX node is its own NVLink domain: nothing to create);
* where they apply, the job goes to **one clique** (``nvlink: Required`` already asks that),
  to **no clique that already holds a domain** (two ComputeDomains in one clique conflict:
  driver issue #892) and to **at most** :data:`MAX_DOMAIN_NODES` **nodes** (an IMEX domain
  holds at most 18 nodes on GB200);
* the placed job **gets** a domain when its GPU pods then span more than one node
  (:func:`gets_domain`); on one node it needs none.

A clique holds a domain when one of its nodes carries the driver's
``resource.nvidia.com/computeDomain`` label (set where a domain's channel claim is prepared), or
when a reservation of a job that gets a domain names one of its nodes (placed, pods not yet
reported bound). Pure functions over the snapshot; no I/O.
"""

from __future__ import annotations

from collections.abc import Set
from typing import TYPE_CHECKING, Final

from gpufed.api.labels import COMPUTE_DOMAIN_KIND, COMPUTE_DOMAIN_NODE_LABEL
from gpufed.placement.plugins import Code, Planner, Status

if TYPE_CHECKING:
    from gpufed.placement.fit import Plan
    from gpufed.placement.index import PoolState
    from gpufed.placement.member import ClusterState
    from gpufed.placement.shape import JobShape
    from gpufed.placement.snapshot import FleetSnapshot

#: Most nodes one IMEX domain holds on GB200/GB300 (NVIDIA's IMEX documentation).
MAX_DOMAIN_NODES: Final = 18


def wants(job: JobShape) -> bool:
    """True when the job asks for one NVLink domain, allows a ComputeDomain and has more than one
    GPU pod (one pod sits on one node and needs no domain)."""
    topo = job.request.topology
    return topo.nvlink == "Required" and topo.compute_domain == "Auto" and job.gpu_pods > 1


def applies(job: JobShape, cluster: ClusterState, pool: PoolState | None) -> bool:
    """True when the ComputeDomain rules bind ``job`` in ``pool`` of ``cluster``: it
    :func:`wants` a domain, the member serves the CRD, and the pool has multi-node NVLink
    domains."""
    return (
        COMPUTE_DOMAIN_KIND in cluster.served_kinds  # cheapest test first: most members fail it
        and pool is not None
        and bool(pool.groups["nvlink"])
        and wants(job)
    )


def domain_cliques(snapshot: FleetSnapshot, cluster: ClusterState) -> frozenset[str]:
    """NVLink domain ids (``clique:<id>``) of ``cluster`` that already hold a ComputeDomain: a
    node labelled by the driver, or a node named by a reservation of a domain job."""
    out = {
        n.inv.nvlink_domain
        for n in cluster.nodes.values()
        if COMPUTE_DOMAIN_NODE_LABEL in n.inv.labels
    }
    for res in snapshot.reservations():
        if res.compute_domain and res.cluster == cluster.name:
            for name in res.nodes:
                node = cluster.nodes.get(name)
                if node is not None:
                    out.add(node.inv.nvlink_domain)
    return frozenset(d for d in out if d.startswith("clique:"))


def excluded_nodes(pool: PoolState, cliques: frozenset[str]) -> frozenset[str]:
    """Names of the pool's nodes inside ``cliques`` (where a domain job may not go)."""
    if not cliques:
        return frozenset()
    return frozenset(
        name for key, g in pool.groups["nvlink"].items() if key in cliques for name in g.nodes
    )


def plan_nodes(job: JobShape, plan: Plan) -> int:
    """How many distinct nodes the plan puts the job's GPU pods on."""
    return len({name for s in job.gpu_sets for name in plan.assign[s.index]})


def too_big(job: JobShape, plan: Plan) -> str | None:
    """Why ``plan`` breaks the node limit of one IMEX domain, or None when it keeps it."""
    used = plan_nodes(job, plan)
    if used <= MAX_DOMAIN_NODES:
        return None
    return (
        f"the pods need {used} nodes of one clique; one ComputeDomain (IMEX domain) holds at most "
        f"{MAX_DOMAIN_NODES} nodes (ask for fewer, larger pods, or set "
        "spec.placement.topology.computeDomain: Never)"
    )


def never_fits(job: JobShape, pool: PoolState) -> bool:
    """True when the job's GPUs exceed what :data:`MAX_DOMAIN_NODES` of the pool's largest nodes
    hold: no state of the pool could ever place it under one domain."""
    biggest = max((n.gpu_alloc for n in pool.nodes.values()), default=0)
    return job.demand > MAX_DOMAIN_NODES * biggest


def gets_domain(job: JobShape, cluster: ClusterState, plan: Plan) -> bool:
    """True when the placed job gets a ComputeDomain: the rules apply and its GPU pods span more
    than one node."""
    return applies(job, cluster, plan.pool) and plan_nodes(job, plan) > 1


def plan_domain(
    job: JobShape,
    cluster: ClusterState,
    pool: PoolState | None,
    exclude: Set[str],
    planner: Planner,
    snapshot: FleetSnapshot,
) -> Plan | Status:
    """The planner's answer for a job the rules bind (:func:`applies`): cliques that hold a
    domain are left out (with ``exclude``), and a plan on more nodes than one IMEX domain holds
    is refused; a job too big for any clique of the pool is ``UNRESOLVABLE``."""
    assert pool is not None  # applies() checked it
    if never_fits(job, pool):
        return Status(
            Code.UNRESOLVABLE,
            f"{job.demand} GPUs need more than {MAX_DOMAIN_NODES} nodes of {pool.product}; one "
            f"ComputeDomain (IMEX domain) holds at most {MAX_DOMAIN_NODES} nodes (or set "
            "spec.placement.topology.computeDomain: Never)",
        )
    taken = domain_cliques(snapshot, cluster)
    result = planner.plan(job, cluster, pool, exclude | excluded_nodes(pool, taken))
    if isinstance(result, Status):
        if taken:
            k = len(taken)
            return Status(
                result.code,
                f"{result.reason}; {k} clique{'s' if k > 1 else ''} already "
                f"hold{'' if k > 1 else 's'} a ComputeDomain",
            )
        return result
    why = too_big(job, result)
    return Status(Code.UNSCHEDULABLE, why) if why else result
