"""``gpufed bench e2e --compare multikueue``: the same job stream through gpufed and through
Kueue's MultiKueue, each in a fresh sandbox, one after the other, timed alike by
:mod:`gpufed.sandbox.e2e_harness`. Called by ``cli/bench.py``.

The runs, in order (same seed, sizes, durations, rate and fleet, :func:`bench_fleet`):

1. ``gpufed``: a sandbox with the hub and agents, GPUJobs on the hub (as ``gpufed bench e2e``);
2. ``multikueue``: a sandbox of clusters only with Kueue as MultiKueue manager on the hub
   cluster and Kueue in every member (:func:`gpufed.sandbox.multikueue.start_multikueue`),
   Kueue's default client QPS and burst; the hub objects are ``batch/v1`` Jobs labelled
   ``kueue.x-k8s.io/queue-name=<local queue>`` with the same Job spec (:func:`kueue_job`);
   a job's member copy is the Job of the same namespace and name; its hub ``Complete`` is the
   hub Job's own ``Complete`` condition (MultiKueue mirrors the worker's status there);
3. ``multikueue_fast``: as 2 with client QPS and burst 1,000 (MultiKueue's fast figure).

Result (:func:`run_compare`): ``{"gpufed": {...}, "multikueue": {...}, "multikueue_fast":
{...}, "ratio": {"dispatch_p99", "status_p99", "cpu_per_job", "api_requests_per_job"}}``,
each ratio gpufed / multikueue_fast (None when either side is missing or zero).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gpufed.sandbox.controlplane import ControlPlaneOptions
from gpufed.sandbox.e2e_bench import (
    bench_fleet,
    gpufed_result,
    gpufed_system,
    job_sizes,
    job_spec,
)
from gpufed.sandbox.e2e_harness import Collection, Progress, System, fresh_sandbox, measure
from gpufed.sandbox.multikueue import MultiKueueInfo, MultiKueueOptions, start_multikueue

#: The peers ``--compare`` knows.
PEERS = ("multikueue",)
#: Client QPS and burst of the ``multikueue_fast`` run (Kueue's published fast figure).
FAST_QPS = 1000
#: Namespace of the MultiKueue runs' Jobs (hub and members).
MULTIKUEUE_NAMESPACE = "bench"
#: ``ratio`` key -> the result key it divides.
RATIO_KEYS = {
    "dispatch_p99": "dispatch_p99_ms",
    "status_p99": "status_p99_ms",
    "cpu_per_job": "cpu_per_job_ms",
    "api_requests_per_job": "api_requests_per_job",
}


def check_peer(peer: str) -> str:
    """``peer`` when ``--compare`` knows it; ValueError naming the flag and the choices."""
    if peer not in PEERS:
        raise ValueError(
            f"--compare {peer!r}: unknown peer; the one supported is {', '.join(PEERS)} "
            "(gpufed bench e2e --compare multikueue)"
        )
    return peer


def kueue_job(
    name: str,
    gpus: int,
    duration_s: float,
    *,
    namespace: str,
    local_queue: str,
    queue_label: str = "kueue.x-k8s.io/queue-name",
) -> dict[str, Any]:
    """A ``batch/v1`` Job for Kueue's LocalQueue ``local_queue`` in ``namespace``: the
    benchmark's :func:`job_spec`, created suspended as Kueue's docs show (Kueue unsuspends it
    on admission; its webhook would suspend it anyway)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {queue_label: local_queue}},
        "spec": {**job_spec(gpus, duration_s), "suspend": True},
    }


def multikueue_system(mk: MultiKueueInfo, name: str = "multikueue") -> System:
    """MultiKueue as the harness sees it: queued Jobs in ``mk.namespace`` on the hub, the
    copies of the same namespace and name in the members; its processes are the Kueue
    managers."""

    def manifest(job: str, gpus: int, duration_s: float) -> dict[str, Any]:
        return kueue_job(
            job,
            gpus,
            duration_s,
            namespace=mk.namespace,
            local_queue=mk.local_queue,
            queue_label=mk.queue_label,
        )

    return System(
        name=name,
        namespace=mk.namespace,
        hub=Collection("batch", "v1", "jobs", namespace=mk.namespace),
        member=Collection("batch", "v1", "jobs", namespace=mk.namespace),
        manifest=manifest,
        components=tuple(mk.components),
    )


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` to 3 decimals; None when either is missing or ``b`` is 0."""
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def ratios(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float | None]:
    """:data:`RATIO_KEYS` of ``ours`` over ``theirs``."""
    return {k: ratio(ours.get(v), theirs.get(v)) for k, v in RATIO_KEYS.items()}


def _sub(base: Path | None, name: str) -> Path | None:
    return None if base is None else base / name


def _trace(trace: Path | None, name: str) -> Path | None:
    """``trace`` with the system's name before the suffix: ``t.jsonl`` -> ``t.gpufed.jsonl``."""
    return None if trace is None else trace.with_name(f"{trace.stem}.{name}{trace.suffix}")


def run_compare(
    peer: str = "multikueue",
    jobs: int = 200,
    rate: float = 25.0,
    *,
    duration_s: float = 3.0,
    members: int = 2,
    seed: int = 1,
    state_dir: Path | None = None,
    progress: Progress | None = None,
    trace: Path | None = None,
    stall_s: float = 60.0,
) -> dict[str, Any]:
    """Run the three systems one after the other, each in a fresh sandbox (``state_dir/<run>``
    when given, else temporary directories), and return the result (module docstring).
    ``trace``: each run's per-job times go to ``trace`` with the run's name before the suffix.
    Raises ValueError for an unknown ``peer`` (before starting anything), SandboxError when a
    sandbox or Kueue does not come up."""
    check_peer(peer)
    say = progress or (lambda _m: None)
    sizes = job_sizes(jobs, seed)
    fleet = bench_fleet(sizes, members)
    nodes = sum(c.node_count for c in fleet.clusters)
    say(f"fleet: {members} members, {nodes} nodes of 8 H100 for {sum(sizes)} GPUs of jobs")
    out: dict[str, Any] = {}

    say("== gpufed ==")
    with fresh_sandbox(_sub(state_dir, "gpufed"), progress=say) as sandbox:
        info = sandbox.up(fleet, control_plane=ControlPlaneOptions())
        res = asyncio.run(
            measure(
                sandbox,
                info,
                gpufed_system(info),
                sizes,
                rate,
                duration_s,
                say,
                trace=_trace(trace, "gpufed"),
                stall_s=stall_s,
            )
        )
        out["gpufed"] = gpufed_result(res, info)

    runs = {
        "multikueue": MultiKueueOptions(),
        "multikueue_fast": MultiKueueOptions(qps=FAST_QPS, burst=FAST_QPS),
    }
    for name, options in runs.items():
        qps = f"client QPS {options.qps or 'default'}, burst {options.burst or 'default'}"
        say(f"== {name} ({qps}) ==")
        with fresh_sandbox(_sub(state_dir, name), progress=say) as sandbox:
            info = sandbox.up(fleet)
            mk = start_multikueue(
                sandbox, info, namespace=MULTIKUEUE_NAMESPACE, options=options, progress=say
            )
            out[name] = asyncio.run(
                measure(
                    sandbox,
                    info,
                    multikueue_system(mk, name),
                    sizes,
                    rate,
                    duration_s,
                    say,
                    trace=_trace(trace, name),
                    stall_s=stall_s,
                )
            )
    out["ratio"] = ratios(out["gpufed"], out["multikueue_fast"])
    return out
