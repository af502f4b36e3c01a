"""The end-to-end timing harness: one way to time any federation "system" in a sandbox, so that
``gpufed bench e2e`` (:mod:`gpufed.sandbox.e2e_bench`) and its ``--compare``
(:mod:`gpufed.sandbox.e2e_compare`) measure gpufed and its peers alike.

A :class:`System` says what the benchmark creates on the hub cluster (a GPUJob, a Kueue-queued
``batch/v1`` Job), where the copies appear in the members, and which supervisor components are
the system's own processes. :func:`measure` then, on one clock (:func:`time.monotonic`):

1. opens list+watches in this process: the hub objects and the member copies in every member;
2. reads every API server's ``apiserver_request_total`` twice, ``idle_s`` apart (the idle
   request rate), and every component's CPU seconds;
3. creates ``len(sizes)`` hub objects (``job-00000``, ...) at ``rate`` per second;
4. waits until every hub object shows ``Complete`` (or nothing moved for ``stall_s``);
5. reads the counters again and computes, per job:

   - **dispatch** = the hub watch shows the object (``ADDED``) -> a member watch shows the
     copy of the same ``namespace/name``;
   - **status** = a member watch shows the copy's ``Complete`` condition -> the hub watch
     shows ``Complete`` in the hub object's ``status.conditions``;
   - **cpu_per_job_ms** = CPU seconds of the system's components over the run / jobs;
   - **api_requests_per_job** = requests the hub and member API servers served over the run
     (their own counter, every label set) / jobs, also per API server and request kind
     (``api_requests_per_job_by_kind``: ``{"hub": {"PATCH gpujobs/status": 2.1, "PATCH
     gpujobs/status 409": 0.1, ...}}``) and the 409 conflicts apart
     (``api_conflicts_per_job``); the benchmark's own share (its creates and
     metric reads: the same for every system) is reported apart as
     ``bench_api_requests_per_job``, and its CPU as ``bench_cpu_per_job_ms``; the rate
     of an idle window just before the jobs (requests per second, every API server) as
     ``api_requests_idle_per_s``: the background included in the run's count; the
     system's own CPU over that window as ``cpu_idle_cores`` (what it costs doing nothing,
     included in ``cpu_per_job_ms`` for as long as the run lasts).

Output of :func:`measure`: ``{"jobs", "rate", "dispatch_p50_ms", "dispatch_p99_ms",
"status_p50_ms", "status_p99_ms", "jobs_per_s", "dispatched", "completed", "cpu_per_job_ms",
"api_requests_per_job", "bench_cpu_per_job_ms", "bench_api_requests_per_job",
"api_requests_per_job_by_cluster", "api_requests_per_job_by_kind", "api_conflicts_per_job",
"api_requests_idle_per_s", "cpu_idle_cores", "rss_mib", "cpu_cores", "wall_s"}`` (percentiles by
nearest rank over the jobs that got that far; ``rss_mib``: peak resident MiB of each of the
system's components while the jobs ran; ``cpu_cores``: every sandbox process and the benchmark,
in cores over the run).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import structlog

from gpufed.sandbox.apimetrics import Counts, counts_deltas, request_counts
from gpufed.sandbox.kube import async_api_client
from gpufed.sandbox.runtime import Sandbox, SandboxInfo

Progress = Callable[[str], None]
#: ``(name, gpus, duration_s) -> the hub object`` a system is given one job as.
Manifest = Callable[[str, int, float], dict[str, Any]]

log = structlog.get_logger("gpufed.sandbox.e2e_harness")


@dataclass(frozen=True)
class Collection:
    """A kind of object in one cluster, through the generic (custom objects) client:
    ``/apis/<group>/<version>[/namespaces/<namespace>]/<plural>``; ``namespace`` None: every
    namespace; ``label_selector``: only the objects it selects."""

    group: str
    version: str
    plural: str
    namespace: str | None = None
    label_selector: str | None = None


@dataclass(frozen=True)
class System:
    """One system under test. ``namespace``: where the hub objects are created; ``hub``: the
    objects created and watched on the hub (``hub.namespace`` must be ``namespace``);
    ``member``: the copies watched in every member; ``manifest``: one job's hub object;
    ``components``: supervisor component names of the system's own processes (its CPU and
    memory)."""

    name: str
    namespace: str
    hub: Collection
    member: Collection
    manifest: Manifest
    components: tuple[str, ...]


def job_names(jobs: int) -> list[str]:
    """Names of the benchmark's ``jobs`` hub objects: ``job-00000``, ``job-00001``, ..."""
    return [f"job-{i:05d}" for i in range(jobs)]


def percentile_ms(values: list[float], p: float) -> float | None:
    """Nearest-rank ``p``-quantile of seconds, in milliseconds (None when empty)."""
    if not values:
        return None
    xs = sorted(values)
    return round(xs[min(len(xs) - 1, max(0, math.ceil(p * len(xs)) - 1))] * 1000, 1)


def per_job(total: float, jobs: int, scale: float = 1.0, digits: int = 2) -> float | None:
    """``total * scale / jobs`` rounded (None without jobs)."""
    return round(total * scale / jobs, digits) if jobs else None


@dataclass
class Clock:
    """First-seen times (``time.monotonic``) per ``namespace/name``; ``last_event``: when any of
    them last grew (the stall detector's clock)."""

    created: dict[str, float] = field(default_factory=dict)
    dispatched: dict[str, float] = field(default_factory=dict)
    member_complete: dict[str, float] = field(default_factory=dict)
    hub_complete: dict[str, float] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    last_event: float = 0.0

    def first(self, times: dict[str, float], key: str, now: float) -> None:
        if key not in times:
            times[key] = now
            self.last_event = now

    def latencies(self, wanted: set[str]) -> tuple[list[float], list[float]]:
        """(dispatch, status) seconds of every wanted job that got that far."""
        dispatch = [
            self.dispatched[k] - self.created[k]
            for k in wanted
            if k in self.dispatched and k in self.created
        ]
        status = [
            self.hub_complete[k] - self.member_complete[k]
            for k in wanted
            if k in self.hub_complete and k in self.member_complete
        ]
        return dispatch, status


def is_complete(obj: dict[str, Any]) -> bool:
    """``status.conditions`` holds ``Complete`` = ``True`` (a GPUJob, a batch Job)."""
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
    what: Collection,
    on_event: Callable[[str, dict[str, Any]], None],
    on_request: Callable[[], None],
) -> None:
    """List+watch ``what`` forever (re-list on expiry); ``on_event(type, object)`` for every
    object; ``on_request()`` for every list and watch request sent."""
    if what.namespace is None:
        fn = api.list_cluster_custom_object
        args: tuple[Any, ...] = (what.group, what.version, what.plural)
    else:
        fn = api.list_namespaced_custom_object
        args = (what.group, what.version, what.namespace, what.plural)
    kwargs: dict[str, Any] = {}
    if what.label_selector:
        kwargs["label_selector"] = what.label_selector
    while True:
        try:
            on_request()
            listed = await fn(*args, **kwargs)
            for obj in listed.get("items", []):
                on_event("ADDED", obj)
            rv = listed["metadata"]["resourceVersion"]
            w = _dict_watch()
            on_request()
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


def _cpu_of(sandbox: Sandbox, components: tuple[str, ...]) -> float:
    """CPU seconds the ``components`` used so far (together)."""
    return sum(sandbox.supervisor.status(c).cpu_seconds for c in components)


def _own_cpu_seconds() -> float:
    t = psutil.Process().cpu_times()
    return float(t.user + t.system)


async def measure(
    sandbox: Sandbox,
    info: SandboxInfo,
    system: System,
    sizes: list[int],
    rate: float,
    duration_s: float,
    progress: Progress,
    *,
    trace: Path | None = None,
    stall_s: float = 60.0,
    idle_s: float = 10.0,
) -> dict[str, Any]:
    """Time ``len(sizes)`` jobs of ``sizes`` GPUs, each running ``duration_s`` seconds, created
    at ``rate`` per second through ``system`` in the running sandbox ``info`` (module
    docstring for the phases and the result). Gives up waiting once no job was dispatched or
    completed for ``stall_s`` seconds after the last create (the result says how many got
    there). ``idle_s``: the idle window before the jobs whose request rate is reported (10 s:
    one round of kwok's node-lease renewals).
    ``trace``: also write each job's four times (wall-clock seconds) there, one JSON
    line per job."""
    from kubernetes_asyncio import client

    clock = Clock()
    jobs = len(sizes)
    apis = {"hub": await async_api_client(info.kubeconfig, info.hub.context)}
    for m in info.members:
        apis[m] = await async_api_client(info.kubeconfig, info.clusters[m].context)
    custom: Any = client.CustomObjectsApi(apis["hub"])
    names = job_names(jobs)
    wanted = {f"{system.namespace}/{n}" for n in names}
    bench_requests = 0

    def count_request() -> None:
        nonlocal bench_requests
        bench_requests += 1

    def wanted_key(obj: dict[str, Any]) -> str | None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        return key if key in wanted else None

    def hub_event(_type: str, obj: dict[str, Any]) -> None:
        if (key := wanted_key(obj)) is None:
            return
        now = time.monotonic()
        clock.first(clock.created, key, now)
        if is_complete(obj) and key not in clock.hub_complete:
            clock.first(clock.hub_complete, key, now)
            if len(clock.hub_complete) == jobs:
                clock.done.set()

    def member_event(_type: str, obj: dict[str, Any]) -> None:
        if (key := wanted_key(obj)) is None:
            return
        now = time.monotonic()
        clock.first(clock.dispatched, key, now)
        if is_complete(obj):
            clock.first(clock.member_complete, key, now)

    core: Any = client.CoreV1Api(apis["hub"])
    with contextlib.suppress(client.ApiException):
        await core.create_namespace({"metadata": {"name": system.namespace}})
    watchers = [asyncio.create_task(_watch(custom, system.hub, hub_event, count_request))]
    for m in info.members:
        mapi = client.CustomObjectsApi(apis[m])
        watchers.append(
            asyncio.create_task(_watch(mapi, system.member, member_event, count_request))
        )
    rss: dict[str, int] = {}

    async def sample_rss() -> None:
        procs: dict[str, psutil.Process] = {}
        for c in system.components:
            if pid := sandbox.supervisor.pid(c):
                procs[c] = psutil.Process(pid)
        while True:
            for c, p in procs.items():
                with contextlib.suppress(psutil.Error):
                    rss[c] = max(rss.get(c, 0), p.memory_info().rss)
            await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample_rss())
    creates: list[asyncio.Task[Any]] = []
    h = system.hub
    try:
        await asyncio.sleep(1.0)  # the watches are listed and open
        # 2. Counters before (the reads themselves count as the benchmark's requests), and
        # the requests of an idle window: what the sandbox asks with no jobs (kwok's node
        # leases, controllers' resyncs, the system's own heartbeats).
        idle0 = await request_counts(apis)
        idle_cpu0 = _cpu_of(sandbox, system.components)
        idle_t0 = time.monotonic()
        await asyncio.sleep(idle_s)
        requests0 = await request_counts(apis)
        idle_wall = time.monotonic() - idle_t0
        idle_rate = sum(totals(counts_deltas(idle0, requests0)).values()) / idle_wall
        idle_cores = (_cpu_of(sandbox, system.components) - idle_cpu0) / idle_wall
        bench_requests = len(apis)
        cpu0 = {c.name: c.cpu_seconds for c in sandbox.supervisor.statuses()}
        own0 = _own_cpu_seconds()
        wall0 = time.monotonic()
        # 3. The job stream.
        progress(f"{system.name}: submitting {jobs} jobs at {rate:g}/s ...")
        t0 = time.monotonic()
        for i, (name, gpus) in enumerate(zip(names, sizes, strict=True)):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            count_request()
            body = system.manifest(name, gpus, duration_s)
            creates.append(
                asyncio.create_task(
                    custom.create_namespaced_custom_object(
                        h.group, h.version, system.namespace, h.plural, body
                    )
                )
            )
        await asyncio.gather(*creates)
        progress(
            f"{system.name}: submitted in {time.monotonic() - t0:.1f}s; "
            "waiting for them to complete ..."
        )
        # 4. Until all are Complete on the hub, or nothing moved for stall_s.
        clock.last_event = max(clock.last_event, time.monotonic())
        while not clock.done.is_set():
            if time.monotonic() - clock.last_event > stall_s:
                progress(
                    f"{system.name}: nothing moved for {stall_s:g}s; "
                    f"{len(clock.dispatched)} dispatched, {len(clock.hub_complete)} complete"
                )
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(clock.done.wait(), 1.0)
        # 5. Counters after.
        end = time.monotonic()
        wall = end - wall0
        own = _own_cpu_seconds() - own0
        statuses = sandbox.supervisor.statuses()
        by_kind = counts_deltas(requests0, await request_counts(apis))
        requests = totals(by_kind)
    finally:
        for t in [*watchers, sampler, *creates]:
            t.cancel()
        await asyncio.gather(*watchers, sampler, return_exceptions=True)
        for a in apis.values():
            await a.close()

    cpu = {c.name: c.cpu_seconds - cpu0.get(c.name, 0.0) for c in statuses}
    system_cpu = sum(cpu.get(c, 0.0) for c in system.components)
    cores = {n: round(s / wall, 2) for n, s in cpu.items()}
    cores["bench"] = round(own / wall, 2)
    dispatch, status = clock.latencies(wanted)
    if trace is not None:
        write_trace(trace, clock, wanted)
    first = min(clock.created.values(), default=0.0)
    last = max(clock.dispatched.values(), default=first)
    return {
        "jobs": jobs,
        "rate": rate,
        "dispatch_p50_ms": percentile_ms(dispatch, 0.50),
        "dispatch_p99_ms": percentile_ms(dispatch, 0.99),
        "status_p50_ms": percentile_ms(status, 0.50),
        "status_p99_ms": percentile_ms(status, 0.99),
        "jobs_per_s": round(len(dispatch) / (last - first), 1) if last > first else None,
        "dispatched": len(dispatch),
        "completed": len(clock.hub_complete),
        "cpu_per_job_ms": per_job(system_cpu, jobs, 1000.0),
        "api_requests_per_job": per_job(sum(requests.values()), jobs),
        "bench_cpu_per_job_ms": per_job(own, jobs, 1000.0),
        "bench_api_requests_per_job": per_job(bench_requests, jobs),
        "api_requests_per_job_by_cluster": {
            n: per_job(v, jobs, digits=1) for n, v in requests.items()
        },
        "api_requests_per_job_by_kind": requests_by_kind(by_kind, jobs),
        "api_conflicts_per_job": {
            n: per_job(sum(v for (_, code), v in c.items() if code == "409"), jobs, digits=2)
            for n, c in by_kind.items()
        },
        "api_requests_idle_per_s": round(idle_rate, 1),
        "cpu_idle_cores": round(idle_cores, 3),
        "rss_mib": {c: round(rss.get(c, 0) / 2**20) for c in system.components},
        "cpu_cores": dict(sorted(cores.items(), key=lambda kv: -kv[1])),
        "wall_s": round(wall, 1),
    }


def totals(counts: dict[str, Counts]) -> dict[str, float]:
    """Requests per cluster, every kind and code summed."""
    return {n: sum(c.values()) for n, c in counts.items()}


def requests_by_kind(
    counts: dict[str, Counts], jobs: int, *, floor: float = 0.05
) -> dict[str, dict[str, float | None]]:
    """``{cluster: {"PATCH gpujobs/status": per job, "PATCH gpujobs/status 409": per job,
    ...}}``: requests of each kind per job (every code), and apart, under the kind followed by
    its code, those answered with an error (4xx, 5xx); largest first. Rows of every code under
    ``floor`` per job are left out (the background of kwok's leases and controllers'
    resyncs); error rows never are."""
    out: dict[str, dict[str, float | None]] = {}
    for name, c in counts.items():
        rows: dict[str, float] = {}
        for (kind, code), v in c.items():
            rows[kind] = rows.get(kind, 0.0) + v
            if code[:1] in ("4", "5"):
                rows[f"{kind} {code}"] = rows.get(f"{kind} {code}", 0.0) + v
        out[name] = {
            k: per_job(v, jobs, digits=2)
            for k, v in sorted(rows.items(), key=lambda kv: (-kv[1], kv[0]))
            if jobs and (v / jobs >= floor or k.count(" ") == 2)
        }
    return out


def write_trace(path: Path, clock: Clock, wanted: set[str]) -> None:
    """One JSON line per job with its four times in wall-clock seconds (None where it did not
    get that far), to line up with the processes' logs."""
    offset = time.time() - time.monotonic()
    with path.open("w") as fh:
        for k in sorted(wanted):
            times = {
                "created": clock.created.get(k),
                "dispatched": clock.dispatched.get(k),
                "member_complete": clock.member_complete.get(k),
                "hub_complete": clock.hub_complete.get(k),
            }
            fh.write(
                json.dumps({"job": k, **{n: t + offset if t else None for n, t in times.items()}})
                + "\n"
            )


@contextlib.contextmanager
def fresh_sandbox(
    state_dir: Path | None, *, keep: bool = False, progress: Progress | None = None
) -> Iterator[Sandbox]:
    """A :class:`Sandbox` rooted at ``state_dir`` (default: a new temporary directory, removed
    afterwards), stopped on the way out unless ``keep``."""
    tmp = None
    if state_dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="gpufed-bench-e2e-"))
        state_dir = tmp / "state"
    sandbox = Sandbox(state_dir, progress=progress)
    try:
        yield sandbox
    finally:
        if not keep:
            sandbox.down()
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
