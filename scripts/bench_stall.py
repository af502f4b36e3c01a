"""The worst event-loop stall one GPUJob or one agent message can cause: prints one JSON line.

Each case is the hub's synchronous work on one input, as the event loop runs it: a GPUJob's
intake (``GPUJob.model_validate``, ``placement_request``, ``prepare_manifests``) or one agent
message (``AgentSession.receive``, the decode and checks of ``hub/adapters/sessions.py``). Any exception
is the hub refusing the input (its outcome is printed); the time is what the loop was held.

    .venv/bin/python scripts/bench_stall.py            # every case
    .venv/bin/python scripts/bench_stall.py --quick    # without the 30-second quantity case

Runs against whichever gpufed the interpreter imports (so a venv of another checkout measures
that checkout). Output: ``{"cases": {name: {"ms": float, "outcome": str}}, "worst": {...}}``;
the multi-part case (``msg.member_15000_nodes_as_sent``: a member of 15,000 GFD-labelled nodes,
split into snapshot parts as the agent splits them for the hub's default 16 MiB messages) gives
the worst part as ``ms`` and adds ``parts``, ``nodes_per_part``, ``part_bytes`` and
``total_ms``; ``hub.member_15000_nodes_applied`` (that snapshot, complete, applied to the
hub's state and fleet snapshot) gives the worst step between two turns of the loop and adds
``steps`` and ``total_ms``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from gpufed.agent.hub_stream import split_by_size
from gpufed.api.gpujob import GPUJob
from gpufed.api.inventory import NodeInventory
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol.codec import node_from_pb, node_to_pb
from gpufed.api.stream import InventorySnapshot
from gpufed.hub.adapters.sessions import AgentSession
from gpufed.hub.rules.podsets import placement_request
from gpufed.sync.manifests import prepare_manifests


def job(template_extra: dict[str, Any] | None = None, **limits: Any) -> dict[str, Any]:
    container = {
        "name": "c",
        "image": "i",
        "resources": {"limits": limits or {"nvidia.com/gpu": 8}},
    }
    spec: dict[str, Any] = {"template": {"spec": {"containers": [container]}}}
    spec.update(template_extra or {})
    return {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "GPUJob",
        "metadata": {"name": "worst", "namespace": "team-a", "uid": "u-1"},
        "spec": {"template": {"apiVersion": "batch/v1", "kind": "Job", "spec": spec}},
    }


def nested(depth: int) -> list[Any]:
    """A list ``depth`` lists deep, built inside out."""
    root: list[Any] = []
    for _ in range(depth - 1):
        root = [root]
    return root


def intake(obj: dict[str, Any]) -> str:
    gj = GPUJob.model_validate(obj)
    placement_request(gj, submitted_at=0.0)
    prepare_manifests(
        gj.spec.template, job_uid="u-1", job_name="worst", namespace="team-a", origin="hub"
    )
    return "accepted"


def snapshot(nodes: list[pb.Node]) -> pb.AgentMessage:
    return pb.AgentMessage(
        inventory_snapshot=pb.InventorySnapshot(seq=1, part=0, final=True, nodes=nodes)
    )


def node(name: str, **labels: str) -> pb.Node:
    msg = node_to_pb(
        NodeInventory(
            name=name,
            nvlink_domain=f"node:{name}",
            allocatable={"nvidia.com/gpu": 8, "cpu": 128_000, "memory": 2**40},
            requested={"nvidia.com/gpu": 2},
        )
    )
    msg.labels.update(labels)
    return msg


def receive(msg: pb.AgentMessage) -> str:
    AgentSession(cluster="m1").receive(msg)
    return "accepted"


def gfd_node(i: int) -> pb.Node:
    """A node as a real agent reports it: GFD, topology and well-known labels, a taint, the
    usual allocatable resources and a few jobs' requests (about 1 KiB encoded)."""
    name = f"gpu-node-{i:05d}.us-east-1.compute.internal"
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.machine": "DGX-H100",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "54",
        "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "4",
        "nvidia.com/gfd.timestamp": "1719000000",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "none",
        "kubernetes.io/hostname": name,
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": "us-east-1a",
        "cloud.provider.com/topology-rack": f"rack-{i // 16}",
        "cloud.provider.com/topology-block": f"block-{i // 512}",
        "feature.node.kubernetes.io/rdma.available": "true",
    }
    inv = NodeInventory(
        name=name,
        labels=labels,
        gpu_product="NVIDIA-H100-80GB-HBM3",
        nvlink_domain=f"node:{name}",
        rack=f"rack-{i // 16}",
        block=f"block-{i // 512}",
        allocatable={
            "nvidia.com/gpu": 8,
            "cpu": 190_000,
            "memory": 2_000 * 2**30,
            "pods": 110,
            "ephemeral-storage": 28 * 2**40,
            "vpc.amazonaws.com/efa": 32,
        },
        requested={"nvidia.com/gpu": 8, "cpu": 96_000, "memory": 1_000 * 2**30, "pods": 4},
        job_requests={
            f"0f3c2a9e-5b1d-4c7a-9e2f-{j:012d}": {"nvidia.com/gpu": 4, "cpu": 48_000}
            for j in range(2)
        },
    )
    return node_to_pb(inv)


def snapshot_as_sent(count: int, max_message_bytes: int) -> list[pb.AgentMessage]:
    """The snapshot parts a real agent sends for ``count`` nodes to a hub whose Welcome
    allows ``max_message_bytes`` (the hub's default: 16 MiB)."""
    nodes = [gfd_node(i) for i in range(count)]
    parts = split_by_size(nodes, max_message_bytes)
    return [
        pb.AgentMessage(
            inventory_snapshot=pb.InventorySnapshot(
                seq=1, part=i, final=i == len(parts) - 1, nodes=chunk
            )
        )
        for i, chunk in enumerate(parts)
    ]


def apply_member(count: int) -> dict[str, Any]:
    """The hub applying a complete ``count``-node snapshot of a new member to its state and
    the fleet snapshot (``hub/components/members.py``, on the unit tests' fakes for etcd and the hub API,
    which it does not call): the worst step between two turns of the loop is the stall (one
    step where the checkout applies a snapshot in one go)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.unit.hub.builders import membercluster_obj
    from tests.unit.hub.term import Term

    # The hub's info lines would break the one JSON line this script prints.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    term = Term()
    term.ctrl.members.on_event("ADDED", membercluster_obj("m1"))
    member = term.ctrl.state.member("m1")
    snap = InventorySnapshot(seq=1, nodes=tuple(node_from_pb(gfd_node(i)) for i in range(count)))
    members: Any = term.ctrl.members
    steps = getattr(members, "_snapshot_steps", None)
    times: list[float] = []
    if steps is None:
        t0 = time.perf_counter()
        members.on_snapshot(member, snap)
        times.append((time.perf_counter() - t0) * 1000)
    else:
        it, end = iter(steps(member, snap)), object()
        while True:
            t0 = time.perf_counter()
            got = next(it, end)
            times.append((time.perf_counter() - t0) * 1000)
            if got is end:
                break
    return {
        "ms": round(max(times), 3),
        "outcome": f"{len(member.nodes)} nodes",
        "p50_ms": round(sorted(times)[len(times) // 2], 3),
        "steps": len(times),
        "total_ms": round(sum(times), 3),
    }


def receive_parts(parts: list[pb.AgentMessage]) -> dict[str, Any]:
    """Each part through one session, as the servicer passes them (the loop runs between two
    parts): the worst part's time is the stall; ``total_ms`` is the sum."""
    session = AgentSession(cluster="m1")
    times: list[float] = []
    outcome = "accepted"
    kept: list[object] = []  # the hub keeps what it receives: freeing it is not part of the receive
    before = gc.get_stats()[2]["collections"]
    for msg in parts:
        t0 = time.perf_counter()
        try:
            kept.append(session.receive(msg))
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {str(exc)[:120]}"
            times.append((time.perf_counter() - t0) * 1000)
            break
        times.append((time.perf_counter() - t0) * 1000)
    gen2 = gc.get_stats()[2]["collections"] - before  # full collections: they hold the loop too
    return {
        "ms": round(max(times), 3),
        "outcome": outcome,
        "parts": len(parts),
        "p50_ms": round(sorted(times)[len(times) // 2], 3),
        "gen2_gc": gen2,
        "nodes_per_part": max(len(p.inventory_snapshot.nodes) for p in parts),
        "part_bytes": max(p.ByteSize() for p in parts),
        "total_ms": round(sum(times), 3),
    }


def cases(quick: bool) -> dict[str, tuple[Callable[[Any], str], Callable[[], Any]]]:
    """name -> (the timed step, what builds its input, untimed)."""
    negative = node("hgx-0")
    negative.requested["nvidia.com/gpu"] = -1000
    out: dict[str, tuple[Callable[[Any], str], Callable[[], Any]]] = {
        "job.quantity_1e99999": (intake, lambda: job(**{"nvidia.com/gpu": "1e99999"})),
        "job.quantity_1e6_digits": (intake, lambda: job(**{"nvidia.com/gpu": "9" * 1_000_000})),
        "job.depth_900": (intake, lambda: job({"x": nested(900)})),
        "job.depth_5000": (intake, lambda: job({"x": nested(5000)})),
        "job.values_200k": (intake, lambda: job({"x": {str(i): i for i in range(200_000)}})),
        "job.parallelism_2e62": (intake, lambda: job({"parallelism": 2**62})),
        "job.legit_large_3000_env": (
            intake,
            lambda: job({"x": [{"name": f"E{i}", "value": "v"} for i in range(3000)]}),
        ),
        "msg.negative_requested": (receive, lambda: snapshot([negative])),
        "msg.node_100k_labels": (
            receive,
            lambda: snapshot([node("hgx-0", **{f"l{i}": "v" for i in range(100_000)})]),
        ),
        "msg.snapshot_1000_nodes": (
            receive,
            lambda: snapshot([node(f"n{i}") for i in range(1000)]),
        ),
        "msg.bad_name_empty": (receive, lambda: snapshot([node("")])),
    }
    if not quick:
        out["job.quantity_1e999999"] = (intake, lambda: job(**{"nvidia.com/gpu": "1e999999"}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="leave out the 1e999999 case")
    args = parser.parse_args()
    sys.setrecursionlimit(1000)
    results: dict[str, dict[str, Any]] = {}
    for name, (run, build) in cases(args.quick).items():
        given = build()
        t0 = time.perf_counter()
        try:
            outcome = run(given)
        except Exception as exc:  # the hub refusing the input, or crashing on it
            outcome = f"{type(exc).__name__}: {str(exc)[:120]}"
        ms = (time.perf_counter() - t0) * 1000
        results[name] = {"ms": round(ms, 3), "outcome": outcome}
    # A member of 15,000 nodes (the most one member may report), split as the agent splits it.
    results["msg.member_15000_nodes_as_sent"] = receive_parts(
        snapshot_as_sent(15_000, 16 * 1024 * 1024)
    )
    results["hub.member_15000_nodes_applied"] = apply_member(15_000)
    worst = max(results, key=lambda k: results[k]["ms"])
    print(json.dumps({"cases": results, "worst": {"case": worst, **results[worst]}}))


if __name__ == "__main__":
    main()
