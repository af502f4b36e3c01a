"""The hub at fleet scale (``gpufed bench scale``): one real hub, many simulated agents.

1. A clusters-only sandbox (etcd, the hub API server and one idle one-node member the sandbox
   needs; its API server is never used), the CRDs from ``gpufed hub install`` and ``members``
   MemberClusters with join tokens from ``gpufed hub join``'s code (``joiner``, in-process and
   a few at a time: a ``gpufed hub join`` process per member took 10 s each on the loaded
   2-core machine, 100 members half an hour); the hub runs as its ServiceAccount with the
   shipped RBAC.
2. A real ``gpufed hub`` process on the sandbox's etcd (own prefix), gRPC with TLS signed by
   the sandbox CA.
3. Watches in this process, stamped with :func:`time.monotonic` (one clock for every process
   on the machine): MemberClusters and the benchmark's GPUJobs.
4. ``workers`` processes of :mod:`gpufed.sandbox.simagent`, each running its share of the
   agents; agent ``i`` dials at ``t0 + i / join_rate``; ``churn`` background pod starts per
   second across the fleet (each pod finishes 10 s later) as inventory deltas.
5. Once every member is Ready with all its nodes, ``jobs`` GPUJobs (one pod of 1-8 GPUs,
   seeded, running ``duration_s``) at ``rate`` per second.

Output (:func:`run_scale_bench`, percentiles by nearest rank, milliseconds):

- ``registration_p50_ms`` / ``registration_p99_ms``: the agent wrote its ``Hello`` -> the
  MemberCluster watch shows it Ready with every node;
- ``dispatch_p99_ms``: the GPUJob create call started -> the simulated agent wrote its
  ``APPLIED`` ack;
- ``status_p99_ms``: the agent wrote ``Succeeded`` -> the GPUJob watch shows ``Succeeded``;
- ``placement_p99_ms``: the hub's own ``status.timings.placementMs`` (intake -> decision);
- ``hub_rss_mib``: peak resident memory of the hub process (sampled every 0.5 s);
- ``etcd_db_mib``: ``etcd_mvcc_db_total_size_in_bytes`` from etcd's ``/metrics`` at the end
  (the sandbox's one etcd: the hub's keys and the hub API server's objects);
- ``members``, ``nodes_per_member``, ``jobs``, ``registered``, ``dispatched``, ``completed``,
  ``churn_pods``, ``hub_cpu_s``, ``seconds`` (wall time of the measured part) and
  ``cpu_s`` (CPU seconds in that time of the hub, the hub API server, etcd, this process and
  the workers: which of them the latencies wait for), ``cpu_wait_s`` (seconds the same
  processes' threads were runnable but waiting for a CPU, from Linux schedstat: a process
  that waits about as long as it runs is starved by the machine, not slow) and
  ``load_avg_1m`` at the end;
- the hub's own costs (:func:`~gpufed.sandbox.scale_clock.hub_figures`):
  ``hub_cpu_s_per_1000_nodes`` (hub CPU seconds from the first Hello to every member Ready,
  per 1,000 nodes registered), ``hub_cpu_ms_per_job`` (hub CPU in the job phase per job
  dispatched), ``loop_stall_max_ms`` (the longest the hub's event loop was held,
  ``gpufed_hub_event_loop_stall_max_seconds``; ``loop_stall_cpu_max_ms``: the part of a stall
  the loop's thread was on the CPU, not waiting for one), ``lease_renewals_missed`` and
  ``incremental_drift`` (``gpufed_hub_incremental_drift_total``: must be 0).

Left in the state dir's ``scale/`` folder: ``jobs.jsonl`` (each job's stages as wall-clock
seconds: :func:`trace_lines`; they compare with ``hub.log``'s timestamps), ``hub-metrics.txt``
(the hub's ``/metrics`` at the end) and the hub's and workers' logs.

With ``GPUFED_SCALE_PROFILE=<file>`` in the environment the hub runs under cProfile and writes
its statistics there when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import structlog
from pydantic import BaseModel, Field

from gpufed.api.fleet import HUB_CLUSTER_NAME, FleetSpec
from gpufed.api.labels import GROUP, VERSION
from gpufed.sandbox import e2e_bench, identities
from gpufed.sandbox.controlplane import TOKEN_NAMESPACE, gpufed_command, wait_crds_established
from gpufed.sandbox.e2e_bench import job_sizes
from gpufed.sandbox.kube import async_api_client
from gpufed.sandbox.pki import issue_server_cert, load_pki
from gpufed.sandbox.runtime import Sandbox, SandboxInfo, free_ports
from gpufed.sandbox.scale_clock import (
    Clock,
    etcd_db_bytes,
    hub_figures,
    ready_with_nodes,
    runqueue_wait_s,
    summarize,
    trace_lines,
)
from gpufed.sandbox.supervisor import Supervisor, http_ok

log = structlog.get_logger("gpufed.sandbox.scale_bench")
Progress = Callable[[str], None]
#: Registers one member on the hub through a sync ``ApiClient``; returns its join token
#: (``gpufed.cli.hubadmin.register_member``, what ``gpufed hub join`` runs: the CLI passes it in,
#: since the sandbox imports no other gpufed component).
Joiner = Callable[[Any, str], str]
NAMESPACE = "scale"
#: ``gpufed hub join`` processes at a time.
JOIN_CONCURRENCY = 8


#: Bounds of :class:`ScaleOptions` (and of ``gpufed bench scale``'s flags).
MAX_JOBS = 1_000_000
MAX_CHURN = 100_000.0
MAX_DURATION_S = 86_400.0


class ScaleOptions(BaseModel):
    """What :func:`run_scale_bench` runs (see the module docstring)."""

    # Upper bounds keep a run finite (an infinite duration never ends, an infinite churn
    # overflows the churn clock); they are far above what one machine can drive.
    members: int = Field(ge=1, le=1000)
    nodes_per_member: int = Field(ge=1, le=15_000)
    join_rate: float = Field(default=10.0, gt=0, le=1000)
    jobs: int = Field(default=2000, ge=0, le=MAX_JOBS)
    rate: float = Field(default=25.0, gt=0, le=1000)
    churn: float = Field(default=100.0, ge=0, le=MAX_CHURN)
    duration_s: float = Field(default=5.0, ge=0, le=MAX_DURATION_S)
    workers: int = Field(default=4, ge=1, le=64)
    seed: int = 1
    ready_timeout_s: float = Field(default=600.0, gt=0, le=7200)


def gpujob(name: str, gpus: int, duration_s: float) -> dict[str, Any]:
    """The e2e benchmark's GPUJob (one pod of ``gpus`` GPUs running ``duration_s`` seconds, as
    :func:`gpufed.sandbox.e2e_bench.gpujob`) in :data:`NAMESPACE`."""
    return e2e_bench.gpujob(name, gpus, duration_s, namespace=NAMESPACE)


def member_names(members: int) -> list[str]:
    width = max(3, len(str(members - 1)))
    return [f"sim-{i:0{width}d}" for i in range(members)]


def assign(names: list[str], workers: int) -> list[list[tuple[int, str]]]:
    """Round-robin ``(index, name)`` per worker (every worker gets early and late joiners);
    no empty worker."""
    k = max(1, min(workers, len(names)))
    out: list[list[tuple[int, str]]] = [[] for _ in range(k)]
    for i, name in enumerate(names):
        out[i % k].append((i, name))
    return out


# --- the run -----------------------------------------------------------------------------------


def run_scale_bench(
    opts: ScaleOptions,
    *,
    state_dir: Path | None = None,
    keep: bool = False,
    progress: Progress | None = None,
    joiner: Joiner | None = None,
) -> dict[str, Any]:
    """Run the benchmark in a fresh sandbox (``state_dir``, default a temporary directory),
    stop it afterwards (unless ``keep``) and return the result line (module docstring).
    ``joiner``: how members are registered (default: one ``gpufed hub join`` process each).
    Raises :class:`gpufed.sandbox.runtime.SandboxError` when the sandbox does not start and
    ``RuntimeError`` naming the step when the hub or a worker fails."""
    say = progress or (lambda _m: None)
    tmp = None
    if state_dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="gpufed-bench-scale-"))
        state_dir = tmp / "state"
    sandbox = Sandbox(state_dir, progress=say)
    fleet = FleetSpec.model_validate(
        {
            "clusters": [
                {
                    "name": "idle",
                    "nodePools": [
                        {
                            "name": "h100",
                            "nodes": 1,
                            "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8},
                        }
                    ],
                }
            ]
        }
    )
    try:
        info = sandbox.up(fleet)
        return asyncio.run(_Bench(info, opts, say, joiner).run())
    finally:
        if not keep:
            sandbox.down()
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)


class _Bench:
    def __init__(
        self, info: SandboxInfo, opts: ScaleOptions, say: Progress, joiner: Joiner | None
    ) -> None:
        self.info, self.opts, self.say, self.joiner = info, opts, say, joiner
        self.dir = info.state_dir / "scale"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.clock = Clock()
        self.names = member_names(opts.members)
        self.tokens: dict[str, str] = {}
        self.hub_rss = 0
        self.tasks: list[asyncio.Task[Any]] = []

    # 1. hub cluster: CRDs, joins, identity

    async def _gpufed(self, *args: str) -> None:
        log_file = self.dir / "setup.log"
        with log_file.open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                *gpufed_command(), *args, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out
            )
            code = await asyncio.wait_for(proc.wait(), 300)
        if code != 0:
            raise RuntimeError(f"gpufed {' '.join(args[:2])} exited with {code} (log: {log_file})")

    async def prepare(self) -> None:
        kc = f"--kubeconfig={self.info.hub.kubeconfig}"
        await self._gpufed("hub", "install", kc)
        await asyncio.to_thread(wait_crds_established, self.info.api_client(HUB_CLUSTER_NAME), 180)
        tokens = self.dir / "tokens"
        tokens.mkdir(mode=0o700, exist_ok=True)
        sem = asyncio.Semaphore(JOIN_CONCURRENCY)

        hub_api = self.info.api_client(HUB_CLUSTER_NAME, pool_size=JOIN_CONCURRENCY)

        async def join(name: str) -> None:
            async with sem:
                if self.joiner is not None:
                    self.tokens[name] = await asyncio.to_thread(self.joiner, hub_api, name)
                    return
                f = tokens / f"{name}.token"
                await self._gpufed("hub", "join", name, kc, f"--token-file={f}")
                self.tokens[name] = await asyncio.to_thread(lambda: f.read_text().strip())

        t0 = time.monotonic()
        await asyncio.gather(*(join(n) for n in self.names))
        self.say(f"  {len(self.names)} members joined in {time.monotonic() - t0:.1f}s")
        pki = load_pki(self.info.state_dir / "pki")
        await asyncio.to_thread(
            identities.install,
            self.info.api_client(HUB_CLUSTER_NAME),
            self.info.hub,
            pki,
            identities.kubeconfig_path(self.info.state_dir, HUB_CLUSTER_NAME),
            component="hub",
            account=identities.HUB_ACCOUNT,
        )

    # 2. the hub process

    async def start_hub(self) -> asyncio.subprocess.Process:
        pki = load_pki(self.info.state_dir / "pki")
        crt, key = issue_server_cert(pki, "scale-hub")
        self.grpc_port, self.http_port = free_ports(2)
        argv = [
            "hub",
            f"--kubeconfig={identities.kubeconfig_path(self.info.state_dir, HUB_CLUSTER_NAME)}",
            f"--etcd={self.info.etcd_url.split('://', 1)[-1]}",
            f"--etcd-prefix=/gpufed/scale/{uuid.uuid4().hex[:8]}/",
            f"--listen=127.0.0.1:{self.grpc_port}",
            f"--http-listen=127.0.0.1:{self.http_port}",
            f"--tls-cert={crt}",
            f"--tls-key={key}",
            f"--data-dir={self.dir / 'hub'}",
            f"--token-namespace={TOKEN_NAMESPACE}",
        ]
        profile = os.environ.get("GPUFED_SCALE_PROFILE")
        cmd = (
            [sys.executable, "-m", "cProfile", "-o", profile, "-m", "gpufed.cli", *argv]
            if profile
            else [*gpufed_command(), *argv]
        )
        self.hub_log = self.dir / "hub.log"
        with self.hub_log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out
            )
        url = f"http://127.0.0.1:{self.http_port}/leaderz"
        deadline = time.monotonic() + 120
        while not await asyncio.to_thread(http_ok, url):
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the hub did not lead within 120 s (log: {self.hub_log})")
            await asyncio.sleep(0.3)
        self.hub_proc = psutil.Process(proc.pid)
        return proc

    # 3. watches

    async def watch(
        self, api: Any, args: tuple[Any, ...], fn: str, on: Callable[[dict[str, Any]], None]
    ) -> None:
        from kubernetes_asyncio import watch

        class DictWatch(watch.Watch):  # events as decoded once (no re-encoding)
            def get_return_type(self, func: object) -> str:
                return ""

        lister = getattr(api, fn)
        while True:
            try:
                listed = await lister(*args)
                for obj in listed.get("items", []):
                    on(obj)
                rv = listed["metadata"]["resourceVersion"]
                async for ev in DictWatch().stream(lister, *args, resource_version=rv):
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        on(ev["object"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("scale.watch.restart", error=str(exc)[:200])
                await asyncio.sleep(0.2)

    def on_member(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        fresh = name in self.tokens and name not in self.clock.registered
        if fresh and ready_with_nodes(obj, self.opts.nodes_per_member):
            self.clock.registered[name] = time.monotonic()
            if len(self.clock.registered) == len(self.names):
                self.clock.all_registered.set()

    def on_job(self, obj: dict[str, Any]) -> None:
        key = f"{NAMESPACE}/{obj['metadata']['name']}"
        st = obj.get("status") or {}
        ms = (st.get("timings") or {}).get("placementMs")
        if ms is not None:
            self.clock.placement_ms.setdefault(key, float(ms))
            self.clock.placed.setdefault(key, time.monotonic())
        if st.get("phase") == "Succeeded" and key not in self.clock.succeeded:
            self.clock.succeeded[key] = time.monotonic()
            if len(self.clock.succeeded) >= self.opts.jobs:
                self.clock.all_done.set()

    # 4. workers

    async def start_workers(self, ca: Path) -> list[asyncio.subprocess.Process]:
        procs = []
        for w, share in enumerate(assign(self.names, self.opts.workers)):
            cfg = {
                "hub": f"127.0.0.1:{self.grpc_port}",
                "ca_file": str(ca),
                "nodes_per_member": self.opts.nodes_per_member,
                "join_rate": self.opts.join_rate,
                "churn_per_s": self.opts.churn * len(share) / len(self.names),
                "seed": self.opts.seed + w,
                "agents": [{"index": i, "name": n, "token": self.tokens[n]} for i, n in share],
            }
            path = self.dir / f"worker-{w}.json"
            path.write_text(json.dumps(cfg))
            path.chmod(0o600)
            with (self.dir / f"worker-{w}.log").open("wb") as err:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "gpufed.sandbox.simagent",
                    str(path),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=err,
                    limit=2**20,
                )
            procs.append(proc)
        built = [asyncio.Event() for _ in procs]
        self.tasks += [
            asyncio.create_task(self.read_worker(p, b)) for p, b in zip(procs, built, strict=True)
        ]
        for p, b in zip(procs, built, strict=True):
            waiter = asyncio.create_task(b.wait())
            exited = asyncio.create_task(p.wait())
            await asyncio.wait([waiter, exited], timeout=600, return_when=asyncio.FIRST_COMPLETED)
            exited.cancel()
            if not b.is_set():
                raise RuntimeError(
                    f"a simulated-agent worker did not start (logs: {self.dir}/worker-*.log)"
                )
        return procs

    async def read_worker(self, proc: asyncio.subprocess.Process, built: asyncio.Event) -> None:
        assert proc.stdout is not None
        c = self.clock
        while line := await proc.stdout.readline():
            ev = json.loads(line)
            kind = ev.get("ev")
            if kind == "first":
                c.first[ev["m"]] = ev["t"]
            elif kind == "ack":
                c.acked.setdefault(ev["job"], ev["t"])
            elif kind == "done":
                c.reported.setdefault(ev["job"], ev["t"])
            elif kind == "closed":
                c.closed.append(ev)
                log.warning(
                    "scale.stream_closed", **{k: ev.get(k) for k in ("m", "code", "details")}
                )
            elif kind == "churn":
                c.churn += int(ev.get("started", 0))
            elif kind == "built":
                built.set()

    async def sample_rss(self) -> None:
        while True:
            with contextlib.suppress(psutil.Error):
                rss = self.hub_proc.memory_info().rss
                for child in self.hub_proc.children(recursive=True):
                    if "python" in child.name():  # the profiler's child, never etcd
                        rss = max(rss, child.memory_info().rss)
                self.hub_rss = max(self.hub_rss, rss)
            await asyncio.sleep(0.5)

    # 5. the measured run

    async def run(self) -> dict[str, Any]:
        from kubernetes_asyncio import client

        opts, say, c = self.opts, self.say, self.clock
        await self.prepare()
        hub = await self.start_hub()
        api = await async_api_client(self.info.kubeconfig, self.info.hub.context)
        custom: Any = client.CustomObjectsApi(api)
        core: Any = client.CoreV1Api(api)
        with contextlib.suppress(client.ApiException):
            await core.create_namespace({"metadata": {"name": NAMESPACE}})
        workers: list[asyncio.subprocess.Process] = []
        extra: dict[str, Any] = {}
        cpu0 = cpu_joined = cpu1 = None
        try:
            self.tasks += [
                asyncio.create_task(self.sample_rss()),
                asyncio.create_task(
                    self.watch(
                        custom,
                        (GROUP, VERSION, "memberclusters"),
                        "list_cluster_custom_object",
                        self.on_member,
                    )
                ),
                asyncio.create_task(
                    self.watch(
                        custom,
                        (GROUP, VERSION, NAMESPACE, "gpujobs"),
                        "list_namespaced_custom_object",
                        self.on_job,
                    )
                ),
            ]
            say(
                f"building {opts.members} x {opts.nodes_per_member} simulated nodes in {opts.workers} workers ..."
            )
            workers = await self.start_workers(load_pki(self.info.state_dir / "pki").ca_crt)
            cpu0 = self.hub_proc.cpu_times()
            others0 = self._cpu(workers)
            waits0 = self._waits(workers)
            wall0 = time.monotonic()
            go = json.dumps({"t0": time.monotonic() + 0.5}).encode() + b"\n"
            for w in workers:
                assert w.stdin is not None
                w.stdin.write(go)
                await w.stdin.drain()
            say(f"agents joining at {opts.join_rate:g}/s ...")
            limit = opts.members / opts.join_rate + opts.ready_timeout_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(c.all_registered.wait(), limit)
            say(
                f"  {len(c.registered)}/{opts.members} members Ready in {time.monotonic() - wall0:.1f}s"
            )
            cpu_joined = self.hub_proc.cpu_times()
            if opts.jobs:
                await self.submit(custom)
            cpu1 = self.hub_proc.cpu_times()
            extra["hub_cpu_s"] = round(sum(cpu1[:2]) - sum(cpu0[:2]), 1)
            others1 = self._cpu(workers)
            extra["cpu_s"] = {
                "hub": extra["hub_cpu_s"],
                **{k: round(v - others0.get(k, 0.0), 1) for k, v in others1.items()},
            }
            waits1 = self._waits(workers)
            extra["cpu_wait_s"] = {k: round(v - waits0.get(k, 0.0), 1) for k, v in waits1.items()}
            extra["load_avg_1m"] = round(os.getloadavg()[0], 1)
            extra["seconds"] = round(time.monotonic() - wall0, 1)
        finally:
            for w in workers:
                if w.stdin is not None:
                    w.stdin.close()
            for w in workers:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(w.wait(), 30)
                if w.returncode is None:
                    w.kill()
            await asyncio.sleep(0.2)  # the readers take the last lines
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            metrics = await asyncio.to_thread(_get, f"http://127.0.0.1:{self.http_port}/metrics")
            if metrics:
                (self.dir / "hub-metrics.txt").write_text(metrics)
            if cpu0 is not None and cpu_joined is not None and cpu1 is not None:
                extra.update(
                    hub_figures(
                        metrics,
                        ingest_cpu_s=sum(cpu_joined[:2]) - sum(cpu0[:2]),
                        nodes=len(c.registered) * opts.nodes_per_member,
                        jobs_cpu_s=sum(cpu1[:2]) - sum(cpu_joined[:2]),
                        jobs=len(c.acked),
                    )
                )
            hub.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hub.wait(), 60)
            if hub.returncode is None:
                hub.kill()
            await api.close()
        trace = trace_lines(c, time.time() - time.monotonic())
        (self.dir / "jobs.jsonl").write_text("".join(f"{line}\n" for line in trace))
        db = await asyncio.to_thread(_get, f"{self.info.etcd_url}/metrics")
        size = etcd_db_bytes(db) if db else None
        extra["hub_rss_mib"] = round(self.hub_rss / 2**20)
        extra["etcd_db_mib"] = round(size / 2**20, 1) if size is not None else None
        return summarize(c, opts, extra)

    def _pids(self, workers: list[asyncio.subprocess.Process]) -> dict[str, list[int]]:
        """The processes whose CPU the run reports: the hub, the hub API server, etcd, this
        process and the workers."""
        sup = Supervisor(self.info.state_dir)
        pids: dict[str, list[int]] = {"hub": [self.hub_proc.pid]}
        for name, key in (("hub_apiserver", f"apiserver/{HUB_CLUSTER_NAME}"), ("etcd", "etcd")):
            with contextlib.suppress(TypeError, ValueError):
                pid = sup.pid(key)
                if pid is not None:
                    pids[name] = [int(pid)]
        pids["bench"] = [os.getpid()]
        pids["workers"] = [w.pid for w in workers]
        return pids

    def _cpu(self, workers: list[asyncio.subprocess.Process]) -> dict[str, float]:
        """CPU seconds so far of the hub API server, etcd, this process and the workers."""
        out: dict[str, float] = {}
        for name, pids in self._pids(workers).items():
            if name == "hub":
                continue
            total, seen = 0.0, False
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    total += sum(psutil.Process(pid).cpu_times()[:2])
                    seen = True
            if seen or name == "workers":
                out[name] = total
        return out

    def _waits(self, workers: list[asyncio.subprocess.Process]) -> dict[str, float]:
        """Seconds so far each process's threads spent runnable but waiting for a CPU
        (:func:`runqueue_wait_s`); processes it cannot read are left out."""
        out: dict[str, float] = {}
        for name, pids in self._pids(workers).items():
            waits = [runqueue_wait_s(pid) for pid in pids]
            got = [w for w in waits if w is not None]
            if got:
                out[name] = sum(got)
        return out

    async def submit(self, custom: Any) -> None:
        opts, c = self.opts, self.clock
        sizes = job_sizes(opts.jobs, opts.seed)
        self.say(f"submitting {opts.jobs} GPUJobs at {opts.rate:g}/s ...")

        async def create(name: str, gpus: int) -> None:
            # Stamped when the call starts: the API server's write is part of what is measured.
            c.created[f"{NAMESPACE}/{name}"] = time.monotonic()
            await custom.create_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, "gpujobs", gpujob(name, gpus, opts.duration_s)
            )

        t0 = time.monotonic()
        creates = []
        for i, gpus in enumerate(sizes):
            await asyncio.sleep(max(0.0, t0 + i / opts.rate - time.monotonic()))
            creates.append(asyncio.create_task(create(f"job-{i:05d}", gpus)))
        await asyncio.gather(*creates)
        self.say(f"  submitted in {time.monotonic() - t0:.1f}s; waiting for them to finish ...")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(c.all_done.wait(), opts.duration_s + 120)
        self.say(f"  {len(c.succeeded)}/{opts.jobs} Succeeded")


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            text: str = resp.read().decode()
            return text
    except OSError:
        return None
