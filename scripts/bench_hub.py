#!/usr/bin/env python3
"""Hub-only latency benchmark: a ``gpufed hub`` process, one fake agent, N jobs at R per second.

Usage::

    gpufed local up --fleet tests/fleets/small.yaml --state-dir /tmp/sb   # a hub API server
    .venv/bin/python scripts/bench_hub.py --state-dir /tmp/sb [--jobs 200] [--rate 25]

It registers a member with 200 idle 8-GPU nodes played by the fake agent of the hub tests
(tests/integration/hub/harness.py), which acknowledges every work item at once and reports it
Running. Prints one JSON line: ``dispatch`` = GPUJob create call started -> work item received
by the agent; ``status`` = agent reported Running -> the GPUJob watch shows Running; both on one
monotonic clock. The member objects are not created (that is the agent's part; see
``gpufed bench e2e``), so this isolates the hub and the hub API server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from kubernetes_asyncio import watch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpufed.hub.adapters.etcd import free_port  # noqa: E402
from gpufed.hub.edge import certs  # noqa: E402
from gpufed.sandbox.runtime import SandboxInfo  # noqa: E402
from tests.integration.hub.harness import FakeAgent, HubAPI, gpu_job, hgx_nodes  # noqa: E402

NAMESPACE = "team-a"


def pct(values: list[float], p: float) -> float | None:
    """The p-quantile in milliseconds (nearest rank)."""
    if not values:
        return None
    xs = sorted(values)
    return round(xs[min(len(xs) - 1, int(p * len(xs)))] * 1000, 1)


async def bench(state_dir: Path, jobs: int, rate: float, work: Path) -> dict[str, Any]:
    info = SandboxInfo.model_validate_json((state_dir / "sandbox.json").read_text())
    kubeconfig = info.hub.kubeconfig
    etcd = info.etcd_url.split("://", 1)[-1]
    api = await HubAPI.connect(kubeconfig)
    with contextlib.suppress(Exception):
        await api.core.create_namespace({"metadata": {"name": NAMESPACE}})
    with contextlib.suppress(Exception):
        await api.core.create_namespace({"metadata": {"name": "gpufed-system"}})
    name = "bench-" + uuid.uuid4().hex[:6]
    token = await api.register_member(name)
    tls = certs.generate(work / "tls")
    gport, hport = free_port(), free_port()
    with (work / "hub.log").open("wb") as log:
        hub = await asyncio.create_subprocess_exec(
            *[
                str(Path(sys.executable).parent / "gpufed"),
                "hub",
                f"--kubeconfig={kubeconfig}",
                f"--etcd={etcd}",
                f"--etcd-prefix=/bench/{name}/",
                f"--listen=127.0.0.1:{gport}",
                f"--http-listen=127.0.0.1:{hport}",
                f"--tls-cert={tls.server_cert}",
                f"--tls-key={tls.server_key}",
                f"--max-unacked={jobs}",
            ],
            stdout=log,
            stderr=log,
        )
    created: dict[str, float] = {}
    dispatched: dict[str, float] = {}
    reported: dict[str, float] = {}
    running: dict[str, float] = {}
    agent = FakeAgent(gport, name, token, tls.ca_cert)
    tasks: list[asyncio.Task[None]] = []
    all_running = asyncio.Event()
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                try:
                    async with http.get(f"http://127.0.0.1:{hport}/leaderz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        await agent.connect(nodes=hgx_nodes(name, 200))

        async def agent_loop() -> None:
            while True:
                msg = await agent.received.get()
                if msg.WhichOneof("body") == "work_item":
                    item = msg.work_item
                    dispatched[item.job] = time.monotonic()
                    await agent.ack(item)
                    reported[item.job] = time.monotonic()
                    await agent.report(item, "Running", active=1)

        async def watch_loop() -> None:
            w = watch.Watch()
            async for ev in w.stream(
                api.custom.list_namespaced_custom_object,
                "gpufed.io",
                "v1alpha1",
                NAMESPACE,
                "gpujobs",
            ):
                obj = ev["object"]
                if (obj.get("status") or {}).get("phase") == "Running":
                    running.setdefault(f"{NAMESPACE}/{obj['metadata']['name']}", time.monotonic())
                    if len(running) >= jobs:
                        all_running.set()

        tasks = [asyncio.create_task(agent_loop()), asyncio.create_task(watch_loop())]
        await asyncio.sleep(1)
        t0 = time.monotonic()
        for i in range(jobs):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            job = f"{name}-{i}"
            created[f"{NAMESPACE}/{job}"] = time.monotonic()
            tasks.append(asyncio.create_task(_create(api, job)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_running.wait(), 120)
        proc = psutil.Process(hub.pid)
        cpu = proc.cpu_times()
        rss = proc.memory_info().rss
    finally:
        for t in tasks:
            t.cancel()
        hub.terminate()
        await hub.wait()
        await agent.close()
        await api.cleanup()
        await api.close()
    d = [dispatched[k] - created[k] for k in created if k in dispatched]
    s = [running[k] - reported[k] for k in created if k in running and k in reported]
    last = max(dispatched.values(), default=t0 + 1)
    return {
        "jobs": jobs,
        "rate": rate,
        "dispatched": len(d),
        "running": len(s),
        "dispatch_p50_ms": pct(d, 0.5),
        "dispatch_p99_ms": pct(d, 0.99),
        "status_p50_ms": pct(s, 0.5),
        "status_p99_ms": pct(s, 0.99),
        "jobs_per_s": round(jobs / (last - t0), 1),
        "hub_cpu_s": round(cpu.user + cpu.system, 2),
        "hub_rss_mib": round(rss / 2**20),
    }


async def _create(api: HubAPI, job: str) -> None:
    await api.create_job(job, gpu_job(1), namespace=NAMESPACE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, required=True, help="a running sandbox")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rate", type=float, default=25.0)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/gpufed-bench-hub"))
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(bench(args.state_dir, args.jobs, args.rate, args.work_dir))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
