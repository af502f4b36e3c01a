#!/usr/bin/env python3
"""Benchmark the member agent at scale; prints one JSON object.

What it does (about 3-6 minutes on 2 cores):

1. starts a sandbox with one member ``bench`` (one kwok node), then stops that member's kwok,
   scheduler and controller manager so only etcd + its API server remain: the objects below
   are created directly through the API and nothing else rewrites them;
2. creates ``--nodes`` GPU nodes (Ready, from a fleet spec: 80 % HGX H100, 20 % GB200 NVL72
   trays) and ``--pods`` pods bound to them through ``spec.nodeName`` (Pending: no kubelet;
   bound and unfinished, so they all count in ``requested``);
3. starts the agent as its own process (``gpufed agent``), talking to a test hub over real
   gRPC on loopback, and measures: time to the first complete snapshot, the agent's RSS
   (psutil) and CPU (process cpu times / wall time, in millicores) idle and under churn;
4. binding latency: creates an unbound pod, binds it with the ``pods/binding`` subresource
   (what kube-scheduler does) and times until the hub's inventory shows the node's requested
   GPUs grow; isolated bindings, then bindings under churn of ``--churn`` pods/s.

Usage: scripts/bench_agent.py [--nodes 5000] [--pods 20000] [--idle-s 60] [--samples 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.integration.agent.hub_peer

from gpufed.agent.kube import MemberApi  # noqa: E402
from gpufed.api.fleet import FleetSpec, node_specs  # noqa: E402
from gpufed.sandbox.runtime import Sandbox, node_manifest  # noqa: E402
from tests.integration.agent.hub_peer import HubPeer  # noqa: E402

GPU = "nvidia.com/gpu"
NS = "bench"


def fleet(nodes: int) -> FleetSpec:
    gb = nodes // 5 // 18 * 18  # whole NVL72 domains of 18 trays
    hgx = nodes - gb
    return FleetSpec.model_validate(
        {
            "clusters": [
                {
                    "name": "bench",
                    "nodePools": [
                        {
                            "name": "h100",
                            "nodes": hgx,
                            "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8},
                            "nvlink": "node",
                            "rackSize": 8,
                            "racksPerBlock": 16,
                        },
                        {
                            "name": "gb200",
                            "nodes": gb,
                            "gpu": {"product": "NVIDIA-GB200", "count": 4},
                            "nvlink": {"nodesPerDomain": 18},
                        },
                    ],
                }
            ]
        }
    )


def ready_node(manifest: dict[str, Any]) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    manifest["metadata"]["name"] = "b-" + manifest["metadata"]["name"]
    manifest["metadata"]["labels"]["kubernetes.io/hostname"] = manifest["metadata"]["name"]
    manifest["status"]["conditions"] = [
        {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "bench",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
    ]
    return manifest


def pod(name: str, node: str | None, gpus: int, job: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "train",
                "image": "trainer:1",
                "resources": {"limits": {GPU: gpus, "cpu": "8", "memory": "64Gi"}},
            }
        ],
    }
    if node:
        spec["nodeName"] = node
    labels = {"gpufed.io/job-uid": job} if job else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": spec,
    }


async def create_all(
    api: MemberApi, path: str, bodies: list[dict[str, Any]], concurrency: int = 48
) -> float:
    sem = asyncio.Semaphore(concurrency)
    start = time.monotonic()

    async def one(body: dict[str, Any]) -> None:
        async with sem:
            for attempt in range(8):
                try:
                    await api.request("POST", path, body=body)
                    return
                except Exception as exc:
                    if getattr(exc, "status", None) == 409:
                        return
                    if attempt == 7:
                        raise
                    await asyncio.sleep(0.2 * (attempt + 1))

    await asyncio.gather(*(one(b) for b in bodies))
    return time.monotonic() - start


class CpuMeter:
    def __init__(self, proc: psutil.Process) -> None:
        self.proc = proc
        self.reset()

    def reset(self) -> None:
        t = self.proc.cpu_times()
        self.cpu0, self.wall0 = t.user + t.system, time.monotonic()

    def millicores(self) -> float:
        t = self.proc.cpu_times()
        return round(1000 * (t.user + t.system - self.cpu0) / (time.monotonic() - self.wall0), 1)


def rss_mib(proc: psutil.Process) -> float:
    return round(proc.memory_info().rss / 2**20, 1)


async def bind_latencies(
    api: MemberApi, hub: HubPeer, nodes: list[str], samples: int, gap_s: float, tag: str
) -> list[float]:
    view = hub.view("bench")
    out: list[float] = []
    for i in range(samples):
        node = nodes[(i * 7919) % len(nodes)]
        name = f"bind-{tag}-{i}"
        await api.request("POST", f"/api/v1/namespaces/{NS}/pods", body=pod(name, None, 1))
        before = view.nodes[node].requested.get(GPU, 0)
        t0 = time.monotonic()
        await api.request(
            "POST",
            f"/api/v1/namespaces/{NS}/pods/{name}/binding",
            body={
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            },
        )
        await hub.wait_for(
            lambda node=node, before=before: view.nodes[node].requested.get(GPU, 0) > before,
            within=30,
        )
        out.append(round((time.monotonic() - t0) * 1000, 1))
        await asyncio.sleep(gap_s)
    return out


async def churn(api: MemberApi, nodes: list[str], per_s: float, stop: asyncio.Event) -> int:
    """Create a bound pod and delete an older one, ``per_s`` times a second."""
    n = 0
    live: list[str] = []
    while not stop.is_set():
        name = f"churn-{n}"
        await api.request(
            "POST", f"/api/v1/namespaces/{NS}/pods", body=pod(name, nodes[n % len(nodes)], 1)
        )
        live.append(name)
        if len(live) > 50:
            old = live.pop(0)
            await api.request(
                "DELETE",
                f"/api/v1/namespaces/{NS}/pods/{old}",
                body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
            )
        n += 1
        await asyncio.sleep(1 / per_s)
    return n


def summary(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    return {
        "n": len(s),
        "p50_ms": s[len(s) // 2],
        "p95_ms": s[min(len(s) - 1, int(len(s) * 0.95))],
        "max_ms": s[-1],
        "mean_ms": round(statistics.fmean(s), 1),
    }


async def run(args: argparse.Namespace, info: Any) -> dict[str, Any]:
    result: dict[str, Any] = {"nodes": args.nodes, "pods": args.pods}
    kubeconfig = info.clusters["bench"].kubeconfig
    api = await MemberApi.connect(kubeconfig=str(kubeconfig))
    try:
        return await measure(args, api, kubeconfig, result)
    finally:
        await api.close()


async def measure(
    args: argparse.Namespace, api: MemberApi, kubeconfig: Path, result: dict[str, Any]
) -> dict[str, Any]:
    specs = node_specs(fleet(args.nodes).clusters[0])
    node_bodies = [ready_node(node_manifest(s)) for s in specs]
    names = [b["metadata"]["name"] for b in node_bodies]
    result["create_nodes_s"] = round(await create_all(api, "/api/v1/nodes", node_bodies), 1)
    await api.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
    )
    pod_bodies = []
    for i in range(args.pods):
        node = names[i % len(names)]
        gpus = 1 if "gb200" in node else 2  # 4 pods per node: H100 8/8 used, GB200 4/4 used
        pod_bodies.append(pod(f"p-{i:05d}", node, gpus, job=f"job-{i // 8}"))
    result["create_pods_s"] = round(
        await create_all(api, f"/api/v1/namespaces/{NS}/pods", pod_bodies), 1
    )
    del pod_bodies, node_bodies

    token = Path(tempfile.mkdtemp()) / "token"
    token.write_text("bench-token")
    hub = HubPeer({"bench-token": "bench"}, heartbeat_ms=5000, max_message_bytes=4 * 2**20)
    await hub.start()
    cmd = [
        str(Path(sys.executable).parent / "gpufed"),
        "agent",
        "--cluster",
        "bench",
        "--hub",
        hub.address,
        "--token-file",
        str(token),
        "--kubeconfig",
        str(kubeconfig),
        "--health-port",
        "-1",
        "--log-level",
        "warning",
    ]
    t0 = time.monotonic()
    log_fd = os.open(token.parent / "agent.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    agent = await asyncio.create_subprocess_exec(*cmd, stderr=log_fd)
    os.close(log_fd)
    proc = psutil.Process(agent.pid)
    try:
        view = hub.view("bench")
        peak = 0.0

        async def sample_peak() -> None:
            nonlocal peak
            while True:
                peak = max(peak, rss_mib(proc))
                await asyncio.sleep(0.1)

        sampler = asyncio.create_task(sample_peak())
        await hub.wait_for(lambda: view.snapshots, within=600, what="snapshot")
        result["first_snapshot_s"] = round(time.monotonic() - t0, 1)
        result["snapshot_nodes"] = len(view.nodes)
        result["snapshot_gpus_requested"] = sum(
            n.requested.get(GPU, 0) for n in view.nodes.values()
        )
        result["rss_after_snapshot_mib"] = rss_mib(proc)
        result["startup_cpu_s"] = round(sum(proc.cpu_times()[:2]), 1)

        await asyncio.sleep(10)
        meter = CpuMeter(proc)
        await asyncio.sleep(args.idle_s)
        result["idle"] = {
            "window_s": args.idle_s,
            "cpu_millicores": meter.millicores(),
            "rss_mib": rss_mib(proc),
        }

        result["bind_isolated"] = summary(
            await bind_latencies(api, hub, names, args.samples, 0.5, "iso")
        )

        stop = asyncio.Event()
        meter.reset()
        churner = asyncio.create_task(churn(api, names, args.churn, stop))
        under = await bind_latencies(api, hub, names, args.samples, 0.5, "churn")
        stop.set()
        churned = await churner
        result["bind_under_churn"] = {**summary(under), "churn_pods_per_s": args.churn}
        result["churn"] = {
            "pods_created": churned,
            "cpu_millicores": meter.millicores(),
            "rss_mib": rss_mib(proc),
        }
        sampler.cancel()
        result["rss_peak_mib"] = peak
        result["seq_errors"] = view.seq_errors
        result["deltas"] = view.deltas
    finally:
        agent.terminate()
        await asyncio.wait_for(agent.wait(), 10)
        await hub.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=20000)
    parser.add_argument("--idle-s", type=float, default=60)
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument(
        "--churn", type=float, default=10.0, help="pods created (and deleted) per second"
    )
    parser.add_argument("--state-dir", type=Path, default=None)
    args = parser.parse_args()
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="gpufed-bench-agent-"))
    sb = Sandbox(state)
    tiny = FleetSpec.model_validate(
        {
            "clusters": [
                {
                    "name": "bench",
                    "nodePools": [
                        {
                            "name": "seed",
                            "nodes": 1,
                            "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8},
                        }
                    ],
                }
            ]
        }
    )
    info = sb.up(tiny)
    try:
        for comp in ("kwok/bench", "scheduler/bench", "controller-manager/bench"):
            sb.supervisor.stop(comp, grace_s=2.0)
        result = asyncio.run(run(args, info))
        apiserver = sb.supervisor.pid("apiserver/bench")
        if apiserver:
            result["member_apiserver_rss_mib"] = rss_mib(psutil.Process(apiserver))
    finally:
        sb.down()
    result["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
