"""End-to-end benchmark (``gpufed bench e2e``): GPUJobs through the whole sandbox, timed from
watch events on one clock by :mod:`gpufed.sandbox.e2e_harness` (shared with ``--compare``,
:mod:`gpufed.sandbox.e2e_compare`). This module owns the job stream and the gpufed system.

1. A fleet large enough to hold every job at once (so queueing does not hide the hub's own
   latency): ``members`` HGX members of 8-GPU H100 nodes, 1.25 x the nodes the jobs need
   (:func:`bench_fleet`); job sizes 1-8 GPUs, seeded (:func:`job_sizes`).
2. A fresh sandbox with the hub and one agent per member (own temporary state dir, stopped at
   the end).
3. The harness's watches: GPUJobs on the hub and ``batch/v1`` Jobs labelled
   ``gpufed.io/job-uid`` in every member (:func:`gpufed_system`).
4. ``jobs`` GPUJobs (:func:`gpujob`), each one pod running ``duration_s`` seconds (kwok),
   created at ``rate`` per second.
5. Measures, per job, **dispatch** (GPUJob ``ADDED`` on the hub -> its Job ``ADDED`` in a
   member), **status** (member Job ``Complete`` -> GPUJob ``Complete``), throughput, CPU of
   the hub and agents per job, API requests per job, and the peak memory of the hub and of
   every agent while the jobs run.

Output (:func:`run_bench`): the harness's keys (:func:`gpufed.sandbox.e2e_harness.measure`)
with ``rss_mib`` given as ``"hub_rss_mib"`` and ``"agents_rss_mib"`` (``{member: MiB}``).
"""

from __future__ import annotations

import asyncio
import math
import random
from pathlib import Path
from typing import Any

from gpufed.api.fleet import FleetSpec
from gpufed.api.labels import GROUP, JOB_UID_LABEL, SIM_DURATION_ANNOTATION, VERSION
from gpufed.sandbox.controlplane import HUB_COMPONENT, ControlPlaneOptions, agent_component
from gpufed.sandbox.e2e_harness import Collection, Progress, System, fresh_sandbox, measure
from gpufed.sandbox.runtime import SandboxInfo

H100 = "NVIDIA-H100-80GB-HBM3"
NAMESPACE = "bench"
GPUS_PER_NODE = 8


def job_sizes(jobs: int, seed: int) -> list[int]:
    """GPUs of each job: uniform 1-8, seeded."""
    rng = random.Random(seed)
    return [rng.randint(1, GPUS_PER_NODE) for _ in range(jobs)]


def bench_fleet(sizes: list[int], members: int = 2, headroom: float = 1.25) -> FleetSpec:
    """HGX members whose nodes hold every job at once: ``headroom`` x the nodes a first-fit
    decreasing packing of ``sizes`` needs, split evenly over ``members``."""
    bins: list[int] = []
    for s in sorted(sizes, reverse=True):
        i = next((i for i, free in enumerate(bins) if free >= s), None)
        if i is None:
            bins.append(GPUS_PER_NODE - s)
        else:
            bins[i] -= s
    per_member = max(1, math.ceil(len(bins) * headroom / members))
    return FleetSpec.model_validate(
        {
            "clusters": [
                {
                    "name": f"bench-{i}",
                    "nodePools": [
                        {
                            "name": "h100",
                            "nodes": per_member,
                            "gpu": {"product": H100, "count": GPUS_PER_NODE},
                            "nvlink": "node",
                        }
                    ],
                }
                for i in range(members)
            ]
        }
    )


def job_spec(gpus: int, duration_s: float) -> dict[str, Any]:
    """The ``batch/v1`` Job spec of every benchmark job, whatever the system: one pod with
    ``gpus`` GPUs that runs ``duration_s`` seconds (kwok reads the
    ``gpufed.io/sim-duration`` annotation), no retries."""
    return {
        "backoffLimit": 0,
        "template": {
            "metadata": {"annotations": {SIM_DURATION_ANNOTATION: f"{duration_s:g}s"}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "bench:1.0",
                        "resources": {"limits": {"nvidia.com/gpu": gpus}},
                    }
                ],
            },
        },
    }


def gpujob(name: str, gpus: int, duration_s: float, namespace: str = NAMESPACE) -> dict[str, Any]:
    """A GPUJob in ``namespace`` whose template is :func:`job_spec`."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "template": {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "spec": job_spec(gpus, duration_s),
            }
        },
    }


def gpufed_system(info: SandboxInfo) -> System:
    """gpufed as the harness sees it: GPUJobs created in :data:`NAMESPACE` on the hub, their
    Jobs (labelled ``gpufed.io/job-uid``, same namespace and name) in the members; its
    processes are the hub and the agents."""
    return System(
        name="gpufed",
        namespace=NAMESPACE,
        hub=Collection(GROUP, VERSION, "gpujobs", namespace=NAMESPACE),
        member=Collection("batch", "v1", "jobs", label_selector=JOB_UID_LABEL),
        manifest=gpujob,
        components=(HUB_COMPONENT, *(agent_component(m) for m in info.members)),
    )


def gpufed_result(result: dict[str, Any], info: SandboxInfo) -> dict[str, Any]:
    """The harness's result with the hub's and agents' memory under their own keys."""
    out = dict(result)
    rss = out.pop("rss_mib")
    out["hub_rss_mib"] = rss.get(HUB_COMPONENT, 0)
    out["agents_rss_mib"] = {m: rss.get(agent_component(m), 0) for m in info.members}
    return out


def run_bench(
    jobs: int = 200,
    rate: float = 25.0,
    *,
    duration_s: float = 3.0,
    members: int = 2,
    seed: int = 1,
    state_dir: Path | None = None,
    keep: bool = False,
    options: ControlPlaneOptions | None = None,
    progress: Progress | None = None,
    trace: Path | None = None,
) -> dict[str, Any]:
    """Run the benchmark in a fresh sandbox (``state_dir``, default a temporary directory),
    stop it afterwards (unless ``keep``) and return the result (module docstring).
    ``trace``: also write each job's times (wall-clock seconds) there, one JSON line per job,
    to line up with the hub's and agents' logs. Raises SandboxError when the sandbox does not
    come up."""
    say = progress or (lambda _m: None)
    sizes = job_sizes(jobs, seed)
    fleet = bench_fleet(sizes, members)
    nodes = sum(c.node_count for c in fleet.clusters)
    say(f"fleet: {members} members, {nodes} nodes of 8 H100 for {sum(sizes)} GPUs of jobs")
    with fresh_sandbox(state_dir, keep=keep, progress=say) as sandbox:
        info = sandbox.up(fleet, control_plane=options or ControlPlaneOptions())
        system = gpufed_system(info)
        result = asyncio.run(
            measure(sandbox, info, system, sizes, rate, duration_s, say, trace=trace)
        )
        return gpufed_result(result, info)
