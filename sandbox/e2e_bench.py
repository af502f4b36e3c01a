"""End-to-end benchmark (``gpufed bench e2e``): GPUJobs through the whole sandbox, timed from
watch events on one clock.

1. A fleet large enough to hold every job at once (so queueing does not hide the hub's own
   latency): ``members`` HGX members of 8-GPU H100 nodes, 1.25 x the nodes the jobs need.
2. A fresh sandbox with the hub and one agent per member (own temporary state dir, stopped at
   the end).
3. Watches in this process, all stamped with :func:`time.monotonic`: GPUJobs on the hub and
   ``batch/v1`` Jobs labelled ``gpufed.io/job-uid`` in every member.
4. ``jobs`` GPUJobs of 1-8 GPUs (seeded), each one pod running ``duration_s`` seconds
   (kwok), created at ``rate`` per second.
5. Measures, per job:

   - **dispatch** = the hub watch shows the GPUJob (``ADDED``) -> a member watch shows its Job
     (``ADDED``);
   - **status** = a member watch shows the Job's ``Complete`` condition -> the hub watch shows
     ``Complete`` in the GPUJob's ``status.conditions``;
   - **jobs_per_s** = jobs / (last dispatch - first create).

   and samples the resident memory of the hub and of every agent while the jobs run.

Output (:func:`run_bench`): ``{"jobs", "rate", "dispatch_p50_ms", "dispatch_p99_ms",
"status_p50_ms", "status_p99_ms", "jobs_per_s", "dispatched", "completed", "hub_rss_mib",
"agents_rss_mib"}`` (percentiles by nearest rank; RSS = peak MiB while the jobs ran).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import structlog

from gpufed.api.fleet import FleetSpec
from gpufed.api.labels import GROUP, JOB_UID_LABEL, SIM_DURATION_ANNOTATION, VERSION
from gpufed.sandbox.controlplane import HUB_COMPONENT, ControlPlaneOptions
from gpufed.sandbox.kube import async_api_client
from gpufed.sandbox.runtime import Sandbox, SandboxInfo

H100 = "NVIDIA-H100-80GB-HBM3"
NAMESPACE = "bench"
GPUS_PER_NODE = 8

Progress = Callable[[str], None]
log = structlog.get_logger("gpufed.sandbox.e2e_bench")


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


def gpujob(name: str, gpus: int, duration_s: float) -> dict[str, Any]:
    """A GPUJob of one pod with ``gpus`` GPUs that runs ``duration_s`` seconds (kwok)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "template": {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "spec": {
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
                },
            }
        },
    }


def percentile_ms(values: list[float], p: float) -> float | None:
    """Nearest-rank ``p``-quantile of seconds, in milliseconds (None when empty)."""
    if not values:
        return None
    xs = sorted(values)
    return round(xs[min(len(xs) - 1, max(0, math.ceil(p * len(xs)) - 1))] * 1000, 1)


@dataclass
class Clock:
    """First-seen times (``time.monotonic``) per ``namespace/name``."""

    created: dict[str, float] = field(default_factory=dict)
    dispatched: dict[str, float] = field(default_factory=dict)
    member_complete: dict[str, float] = field(default_factory=dict)
    hub_complete: dict[str, float] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)


def _complete(obj: dict[str, Any]) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Complete" and c.get("status") == "True" for c in conds)


def _dict_watch() -> Any:
    from kubernetes_asyncio import watch

    class DictWatch(watch.Watch):
        """Events carry the objects as decoded once (the client would re-encode and decode
        custom objects: measurement overhead that competes with what is measured)."""

        def get_return_type(self, func: object) -> str:
            return ""

    return DictWatch()


async def _watch(
    api: Any,
    list_fn: str,
    args: tuple[Any, ...],
    on_event: Callable[[str, dict[str, Any]], None],
    **kwargs: Any,
) -> None:
    """List+watch forever (re-list on expiry); ``on_event(type, object)`` for every object."""

    fn = getattr(api, list_fn)
    while True:
        try:
            listed = await fn(*args, **kwargs)
            for obj in listed.get("items", []):
                on_event("ADDED", obj)
            rv = listed["metadata"]["resourceVersion"]
            w = _dict_watch()
            async for ev in w.stream(
                fn, *args, resource_version=rv, allow_watch_bookmarks=True, **kwargs
            ):
                if ev["type"] in ("ADDED", "MODIFIED"):
                    on_event(ev["type"], ev["object"])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("bench.watch.restart", error=str(exc)[:200])
            await asyncio.sleep(0.2)


async def _measure(
    info: SandboxInfo,
    sizes: list[int],
    rate: float,
    duration_s: float,
    sandbox: Sandbox,
    progress: Progress,
    trace: Path | None = None,
) -> dict[str, Any]:
    from kubernetes_asyncio import client

    clock = Clock()
    jobs = len(sizes)
    hub_api = await async_api_client(info.kubeconfig, info.hub.context)
    member_apis = [await async_api_client(info.kubeconfig, m) for m in info.members]
    custom: Any = client.CustomObjectsApi(hub_api)
    names = [f"job-{i:05d}" for i in range(jobs)]
    wanted = {f"{NAMESPACE}/{n}" for n in names}

    def wanted_key(obj: dict[str, Any]) -> str | None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        return key if key in wanted else None

    def hub_event(_type: str, obj: dict[str, Any]) -> None:
        if (key := wanted_key(obj)) is None:
            return
        now = time.monotonic()
        clock.created.setdefault(key, now)
        if _complete(obj) and key not in clock.hub_complete:
            clock.hub_complete[key] = now
            if len(clock.hub_complete) == jobs:
                clock.done.set()

    def member_event(_type: str, obj: dict[str, Any]) -> None:
        if (key := wanted_key(obj)) is None:
            return
        now = time.monotonic()
        clock.dispatched.setdefault(key, now)
        if _complete(obj):
            clock.member_complete.setdefault(key, now)

    core: Any = client.CoreV1Api(hub_api)
    with contextlib.suppress(client.ApiException):
        await core.create_namespace({"metadata": {"name": NAMESPACE}})
    watchers = [
        asyncio.create_task(
            _watch(
                custom,
                "list_namespaced_custom_object",
                (GROUP, VERSION, NAMESPACE, "gpujobs"),
                hub_event,
            )
        )
    ]
    for mapi in member_apis:
        watchers.append(
            asyncio.create_task(
                _watch(
                    # batch/v1 Jobs through the generic client: plain dicts, as GPUJobs.
                    client.CustomObjectsApi(mapi),
                    "list_cluster_custom_object",
                    ("batch", "v1", "jobs"),
                    member_event,
                    label_selector=JOB_UID_LABEL,
                )
            )
        )
    rss: dict[str, int] = {}

    async def sample_rss() -> None:
        comps = [HUB_COMPONENT, *(f"agent/{m}" for m in info.members)]
        procs: dict[str, psutil.Process] = {}
        for c in comps:
            pid = sandbox.supervisor.pid(c)
            if pid:
                procs[c] = psutil.Process(pid)
        while True:
            for c, p in procs.items():
                with contextlib.suppress(psutil.Error):
                    rss[c] = max(rss.get(c, 0), p.memory_info().rss)
            await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample_rss())
    creates: list[asyncio.Task[Any]] = []
    try:
        await asyncio.sleep(1.0)  # the watches are listed and open
        cpu0 = {c.name: c.cpu_seconds for c in sandbox.supervisor.statuses()}
        wall0 = time.monotonic()
        progress(f"submitting {jobs} GPUJobs at {rate:g}/s ...")
        t0 = time.monotonic()
        for i, (name, gpus) in enumerate(zip(names, sizes, strict=True)):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            creates.append(
                asyncio.create_task(
                    custom.create_namespaced_custom_object(
                        GROUP, VERSION, NAMESPACE, "gpujobs", gpujob(name, gpus, duration_s)
                    )
                )
            )
        await asyncio.gather(*creates)
        progress(f"submitted in {time.monotonic() - t0:.1f}s; waiting for them to complete ...")
        limit = duration_s + 60 + jobs / rate
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(clock.done.wait(), limit)
        wall = time.monotonic() - wall0
        cpu = {
            c.name: round((c.cpu_seconds - cpu0.get(c.name, 0.0)) / wall, 2)
            for c in sandbox.supervisor.statuses()
        }
        cpu["bench"] = round(sum(psutil.Process().cpu_times()[:2]) / wall, 2)
    finally:
        for t in [*watchers, sampler, *creates]:
            t.cancel()
        await asyncio.gather(*watchers, sampler, return_exceptions=True)
        for a in [hub_api, *member_apis]:
            await a.close()

    dispatch = [
        clock.dispatched[k] - clock.created[k]
        for k in wanted
        if k in clock.dispatched and k in clock.created
    ]
    status = [
        clock.hub_complete[k] - clock.member_complete[k]
        for k in wanted
        if k in clock.hub_complete and k in clock.member_complete
    ]
    if trace is not None:
        # One JSON line per job, wall-clock seconds: compare with the processes' logs.
        offset = time.time() - time.monotonic()
        with trace.open("w") as fh:
            for k in sorted(wanted):
                times = {
                    "created": clock.created.get(k),
                    "dispatched": clock.dispatched.get(k),
                    "member_complete": clock.member_complete.get(k),
                    "hub_complete": clock.hub_complete.get(k),
                }
                fh.write(
                    json.dumps(
                        {"job": k, **{n: t + offset if t else None for n, t in times.items()}}
                    )
                    + "\n"
                )
    first = min(clock.created.values(), default=0.0)
    last = max(clock.dispatched.values(), default=first)
    return {
        "jobs": jobs,
        "rate": rate,
        "dispatch_p50_ms": percentile_ms(dispatch, 0.50),
        "dispatch_p99_ms": percentile_ms(dispatch, 0.99),
        "status_p50_ms": percentile_ms(status, 0.50),
        "status_p99_ms": percentile_ms(status, 0.99),
        "jobs_per_s": round(jobs / (last - first), 1) if last > first else None,
        "dispatched": len(dispatch),
        "completed": len(clock.hub_complete),
        "hub_rss_mib": round(rss.get(HUB_COMPONENT, 0) / 2**20),
        "agents_rss_mib": {m: round(rss.get(f"agent/{m}", 0) / 2**20) for m in info.members},
        "cpu_cores": dict(sorted(cpu.items(), key=lambda kv: -kv[1])),
    }


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
    to line up with the hub's and agents' logs."""
    say = progress or (lambda _m: None)
    sizes = job_sizes(jobs, seed)
    fleet = bench_fleet(sizes, members)
    tmp = None
    if state_dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="gpufed-bench-e2e-"))
        state_dir = tmp / "state"
    sandbox = Sandbox(state_dir, progress=say)
    nodes = sum(c.node_count for c in fleet.clusters)
    say(f"fleet: {members} members, {nodes} nodes of 8 H100 for {sum(sizes)} GPUs of jobs")
    try:
        info = sandbox.up(fleet, control_plane=options or ControlPlaneOptions())
        return asyncio.run(_measure(info, sizes, rate, duration_s, sandbox, say, trace))
    finally:
        if not keep:
            sandbox.down()
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
