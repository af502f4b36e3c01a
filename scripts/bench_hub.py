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

``--apply [--nodes 5000]`` needs no sandbox either: the hub's CPU time per node to apply a new
member's first full snapshot to placement's fleet snapshot (:func:`apply_bench`), JSON.

``--decode [--nodes 5000]`` needs no sandbox: it measures the hub's CPU time (process time, not
wall clock) per node to take one member's full inventory snapshot as the gRPC server hands it
over (bytes parsed, then :meth:`AgentSession.receive`), in the version-1 form (a Node message
each, 32 a part) and in the packed form of protocol version 2 (512 a part); best of
``--repeat`` runs. The nodes are those of ``gpufed bench scale``'s simulated members (GB200
NVL72 cliques and HGX racks) with random GPUs requested by a few jobs.
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

from gpufed.api.inventory import NodeInventory  # noqa: E402
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


def bench_nodes(nodes: int) -> list[NodeInventory]:
    """The nodes of ``gpufed bench scale``'s simulated member ``bench`` (GB200 NVL72 cliques,
    HGX racks) with random GPUs requested by a few jobs (seeded: the same every run)."""
    import random

    from gpufed.api.fleetnodes import node_specs
    from gpufed.api.inventory import node_from_labels
    from gpufed.api.resources import resource_list
    from gpufed.sandbox.simagent import sim_cluster

    rng = random.Random(7)
    out = []
    for spec in node_specs(sim_cluster("bench", nodes)):
        alloc = resource_list(spec.allocatable, field="allocatable")
        gpus = rng.randint(0, alloc.get("nvidia.com/gpu", 0))
        jobs = {f"job-{rng.randint(0, 99)}": {"nvidia.com/gpu": gpus}} if gpus else {}
        out.append(
            node_from_labels(
                spec.name,
                spec.labels,
                taints=spec.taints,
                allocatable=alloc,
                requested={"nvidia.com/gpu": gpus, "cpu": 4000 * gpus},
                job_requests=jobs,
            )
        )
    return out


def apply_bench(nodes: int, repeat: int) -> dict[str, Any]:
    """CPU µs per node of applying one member's first full snapshot (:func:`bench_nodes`) to
    the fleet snapshot, as the hub does (a member with no nodes, then chunks of
    ``SNAPSHOT_STEP_NODES``): ``node_by_node`` (``upsert_node`` per node, the path before
    ``upsert_nodes``), ``chunked`` (``upsert_nodes`` per chunk, the hub's path) and ``bulk``
    (``set_member`` with every node: the floor, in one step); ``hub`` is the hub's whole
    apply (``Members.on_snapshot``: diff, GPU summary, etcd bookkeeping and the chunked
    placement apply) in a leader term over the unit tests' fakes. Best of ``repeat`` runs
    each, interleaved."""
    import gc
    import logging

    import structlog

    from gpufed.api.inventory import ClusterHealth, ClusterInventory, MemberClusterState
    from gpufed.api.stream import InventorySnapshot
    from gpufed.hub.components.members import SNAPSHOT_STEP_NODES
    from gpufed.placement import FleetSnapshot
    from tests.unit.hub.builders import membercluster_obj
    from tests.unit.hub.term import Term

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    invs = bench_nodes(nodes)
    step = SNAPSHOT_STEP_NODES
    chunks = [invs[i : i + step] for i in range(0, len(invs), step)]

    def state(with_nodes: tuple[NodeInventory, ...] = ()) -> MemberClusterState:
        return MemberClusterState(
            name="bench",
            health=ClusterHealth(ready=True),
            inventory=ClusterInventory(cluster="bench", nodes=with_nodes),
        )

    def node_by_node() -> float:
        s = FleetSnapshot([state()])
        t0 = time.process_time()
        for chunk in chunks:
            for n in chunk:
                s.upsert_node("bench", n)
        return time.process_time() - t0

    def chunked() -> float:
        s = FleetSnapshot([state()])
        t0 = time.process_time()
        for chunk in chunks:
            s.upsert_nodes("bench", chunk)
        return time.process_time() - t0

    def bulk() -> float:
        s = FleetSnapshot()
        every = tuple(invs)
        t0 = time.process_time()
        s.set_member(state(every))
        return time.process_time() - t0

    def hub() -> float:
        t = Term()
        t.ctrl.members.on_event("ADDED", membercluster_obj("bench"))
        m = t.ctrl.state.member("bench")
        snap = InventorySnapshot(seq=1, nodes=tuple(invs))
        t0 = time.process_time()
        t.ctrl.members.on_snapshot(m, snap)
        spent = time.process_time() - t0
        assert len(t.ctrl.snapshot.cluster("bench").nodes) == nodes
        return spent

    runs = {"node_by_node": node_by_node, "chunked": chunked, "bulk": bulk, "hub": hub}
    if not hasattr(FleetSnapshot, "upsert_nodes"):  # an older checkout (a "before" run)
        del runs["chunked"]
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for name, run in runs.items():
            gc.collect()
            best[name] = min(best[name], run())
    out: dict[str, Any] = {"nodes": nodes, "chunk": step}
    out |= {f"{k}_us_per_node": round(v / nodes * 1e6, 2) for k, v in best.items()}
    if "chunked" in best:
        out["speedup"] = round(best["node_by_node"] / best["chunked"], 2)
    out["clock"] = f"process_time, best of {repeat}"
    return out


def decode_bench(nodes: int, repeat: int) -> dict[str, Any]:
    """CPU µs per node of a full snapshot, version-1 form and packed (module docstring)."""
    from gpufed.api.inventory import MAX_NODES_PER_PART
    from gpufed.api.protocol import agent_pb2 as pb
    from gpufed.api.protocol.codec import node_to_pb
    from gpufed.api.protocol.packed import ShapeTable, packed_parts
    from gpufed.hub.adapters.sessions import AgentSession

    encoded = [node_to_pb(n) for n in bench_nodes(nodes)]

    def snapshot(bodies: list[dict[str, Any]]) -> list[bytes]:
        return [
            pb.AgentMessage(
                inventory_snapshot=pb.InventorySnapshot(
                    seq=1, part=i, final=i == len(bodies) - 1, **body
                )
            ).SerializeToString()
            for i, body in enumerate(bodies)
        ]

    v1 = snapshot(
        [
            {"nodes": encoded[i : i + MAX_NODES_PER_PART]}
            for i in range(0, nodes, MAX_NODES_PER_PART)
        ]
    )
    v2 = snapshot([{"packed": p} for p in packed_parts(encoded, ShapeTable(), 4 * 2**20)])

    def run(parts: list[bytes], version: int) -> float:
        best = float("inf")
        for _ in range(repeat):
            session = AgentSession(cluster="bench", protocol_version=version)
            t0 = time.process_time()
            for raw in parts:
                done = session.receive(pb.AgentMessage.FromString(raw))
            best = min(best, time.process_time() - t0)
            assert done is not None
            assert len(done.nodes) == nodes
        return best

    cpu1, cpu2 = run(v1, 1), run(v2, 2)
    return {
        "nodes": nodes,
        "v1_parts": len(v1),
        "v1_bytes": sum(map(len, v1)),
        "v1_cpu_us_per_node": round(cpu1 / nodes * 1e6, 2),
        "v2_parts": len(v2),
        "v2_bytes": sum(map(len, v2)),
        "v2_cpu_us_per_node": round(cpu2 / nodes * 1e6, 2),
        "speedup": round(cpu1 / cpu2, 1),
        "clock": f"process_time, best of {repeat}",
    }


def persist_bench(nodes: int, repeat: int, etcd: str | None) -> dict[str, Any]:
    """Hub CPU µs per node to persist one member's inventory to etcd (module docstring)."""

    from gpufed.api.protocol.codec import node_to_pb
    from gpufed.api.protocol.packed import ShapeBook, ShapeTable, packed_parts, unpack_nodes

    plain = bench_nodes(nodes)
    book, packed = ShapeBook(), []
    for part in packed_parts([node_to_pb(n) for n in plain], ShapeTable(), 4 * 2**20):
        packed += unpack_nodes(part, book)
    return asyncio.run(_persist(packed, plain, repeat, etcd))


async def _persist(
    packed: list[NodeInventory], plain: list[NodeInventory], repeat: int, etcd: str | None
) -> dict[str, Any]:
    import statistics
    import tempfile

    from gpufed.hub.adapters.etcd import EmbeddedEtcd
    from gpufed.hub.adapters.store import Store

    async with contextlib.AsyncExitStack() as stack:
        if etcd is None:
            from gpufed.cli.hub import resolve_etcd_binary

            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            etcd = (
                await stack.enter_async_context(EmbeddedEtcd(resolve_etcd_binary(), tmp))
            ).endpoint
        store = await Store.connect(
            [etcd], prefix=f"/bench-persist/{uuid.uuid4().hex}/", hub_id="b"
        )
        stack.push_async_callback(store.close)
        assert await store.try_acquire(await store.grant_lease(60))
        tx = store._client.transactions

        async def per_node_keys(cluster: str, nodes: list[NodeInventory]) -> None:
            # what the release before did: one key a node, pydantic JSON, 100 puts a txn
            for i in range(0, len(nodes), 100):
                await store._guarded(
                    [
                        tx.put(
                            store._k("clusters", cluster, "nodes", n.name),
                            n.model_dump_json().encode(),
                        )
                        for n in nodes[i : i + 100]
                    ]
                )

        async def cpu(fn: Any) -> float:
            t0 = time.process_time()
            await fn
            return time.process_time() - t0

        out: dict[str, Any] = {"nodes": len(packed), "clock": f"process_time, median of {repeat}"}
        for form, nodes in (("packed", packed), ("v1", plain)):
            n = len(nodes)
            by_name = {x.name: x for x in nodes}
            churn = nodes[:: max(1, n // 50)]  # 2 % of the nodes change
            changed = {
                x.name: x.model_copy(update={"requested": {**x.requested, "cpu": 1}}) for x in churn
            }
            after = {**by_name, **changed}
            runs: dict[str, list[float]] = {
                k: [] for k in ("keys", "chunks", "keys_delta", "chunks_delta")
            }
            for r in range(repeat):  # alternated
                c = f"{form}-{r}"
                runs["keys"].append(await cpu(per_node_keys(c + "k", nodes)) / n)
                runs["chunks"].append(await cpu(store.write_nodes(c, by_name, by_name)) / n)
                runs["keys_delta"].append(
                    await cpu(per_node_keys(c + "k", list(changed.values()))) / len(churn)
                )
                runs["chunks_delta"].append(
                    await cpu(store.write_nodes(c, after, changed)) / len(churn)
                )
            for k, v in runs.items():
                out[f"{form}_{k}_cpu_us_per_node"] = round(statistics.median(v) * 1e6, 2)
            loaded = (await store.load()).nodes[f"{form}-0"]
            assert loaded == after, "the chunks do not load back as written"
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decode", action="store_true", help="snapshot decode CPU per node")
    parser.add_argument(
        "--apply", action="store_true", help="a new member's first snapshot: apply CPU per node"
    )
    parser.add_argument(
        "--nodes", type=int, default=5000, help="--decode/--apply: nodes in the snapshot"
    )
    parser.add_argument(
        "--repeat", type=int, default=5, help="--decode/--apply: runs (best is kept)"
    )
    parser.add_argument(
        "--persist", action="store_true", help="persisting a member's inventory: CPU per node"
    )
    parser.add_argument("--etcd", help="--persist: host:port of an etcd (default: start one)")
    parser.add_argument("--state-dir", type=Path, help="a running sandbox")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rate", type=float, default=25.0)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/gpufed-bench-hub"))
    args = parser.parse_args()
    if args.decode:
        print(json.dumps(decode_bench(args.nodes, args.repeat)))
        return
    if args.apply:
        print(json.dumps(apply_bench(args.nodes, args.repeat)))
        return
    if args.persist:
        print(json.dumps(persist_bench(args.nodes, args.repeat, args.etcd)))
        return
    if args.state_dir is None:
        parser.error("--state-dir is required (or --decode)")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(bench(args.state_dir, args.jobs, args.rate, args.work_dir))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
