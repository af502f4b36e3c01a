"""Shape-named builders for preemption tests: members full of running jobs, and the jobs.

``nvl72_full_of_4gpu_jobs("b", cliques=2)`` is an NVL72 member whose every tray runs one
4-GPU job (``b-c0-t00-job`` ...), each reported by the member on its node
(``job_requests``), with the :class:`Running` rows preemption reads;
``hgx_full_of_jobs("a", nodes=2, per_node=2)`` the same on 8-GPU HGX nodes (two 4-GPU jobs a
node).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from placement_builders import CPU_PER_GPU, GB200, GPU, H100, MEM_PER_GPU, member, node

from gpufed.api.inventory import MemberClusterState, NodeInventory
from gpufed.placement.preemption import PreemptionEvent, Running

Attrs = Callable[[str, int], dict[str, Any]]
"""(job uid, index) -> extra fields of its Running row (priority, checkpoints, ...)"""


def _job_requests(gpus: int) -> dict[str, int]:
    return {GPU: gpus, "cpu": gpus * CPU_PER_GPU, "memory": gpus * MEM_PER_GPU}


def busy_node(name: str, jobs: Sequence[tuple[str, int]], **kw: Any) -> NodeInventory:
    """A node running ``jobs`` (uid, GPUs), reported per job; the rest of it free."""
    gpus = kw.pop("gpus", 8)
    used = sum(g for _, g in jobs)
    return node(
        name,
        gpus=gpus,
        free=gpus - used,
        job_requests={uid: _job_requests(g) for uid, g in jobs},
        **kw,
    )


def running(
    uid: str,
    cluster: str,
    gpus: dict[str, int],
    *,
    priority: int = 0,
    started_at: float = 0.0,
    queue: str | None = None,
    last_checkpoint: float | None = None,
    interval: float | None = None,
    preempted: Sequence[tuple[float, str]] = (),
    preemptible_after: float = 0.0,
    submitted_at: float | None = None,
) -> Running:
    """One running job as preemption sees it."""
    return Running(
        uid=uid,
        job=f"ns/{uid}",
        cluster=cluster,
        priority=priority,
        gpus=gpus,
        started_at=started_at,
        queue=queue,
        last_checkpoint=last_checkpoint,
        checkpoint_interval_s=interval,
        preemptible_after=preemptible_after,
        preempted=tuple(PreemptionEvent(at, by) for at, by in preempted),
        submitted_at=submitted_at,
    )


def _none(uid: str, i: int) -> dict[str, Any]:
    return {}


def nvl72_full_of_4gpu_jobs(
    name: str, cliques: int = 1, *, trays: int = 18, attrs: Attrs = _none
) -> tuple[MemberClusterState, list[Running]]:
    """An NVL72 member (``cliques`` x ``trays`` trays of 4 GB200) with one 4-GPU job per tray."""
    nodes, runs = [], []
    for c in range(cliques):
        for t in range(trays):
            n = f"{name}-c{c}-t{t:02d}"
            uid = f"{n}-job"
            nodes.append(
                busy_node(
                    n,
                    [(uid, 4)],
                    gpus=4,
                    product=GB200,
                    clique=f"{name}-fabric.{c}",
                    rack=f"{name}-rack{c}",
                )
            )
            runs.append(running(uid, name, {n: 4}, **attrs(uid, len(runs))))
    return member(name, nodes), runs


def hgx_full_of_jobs(
    name: str, nodes: int = 2, *, per_node: int = 2, attrs: Attrs = _none
) -> tuple[MemberClusterState, list[Running]]:
    """An HGX H100 member of ``nodes`` 8-GPU nodes, each running ``per_node`` equal jobs."""
    g = 8 // per_node
    invs, runs = [], []
    for i in range(nodes):
        n = f"{name}-n{i:03d}"
        jobs = [(f"{n}-j{k}", g) for k in range(per_node)]
        invs.append(busy_node(n, jobs, product=H100))
        for uid, _ in jobs:
            runs.append(running(uid, name, {n: g}, **attrs(uid, len(runs))))
    return member(name, invs), runs
