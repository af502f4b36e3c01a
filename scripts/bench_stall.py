"""The worst event-loop stall one GPUJob or one agent message can cause: prints one JSON line.

Each case is the hub's synchronous work on one input, as the event loop runs it: a GPUJob's
intake (``GPUJob.model_validate``, ``placement_request``, ``prepare_manifests``) or one agent
message (``AgentSession.receive``, the decode and checks of ``hub/sessions.py``). Any exception
is the hub refusing the input (its outcome is printed); the time is what the loop was held.

    .venv/bin/python scripts/bench_stall.py            # every case
    .venv/bin/python scripts/bench_stall.py --quick    # without the 30-second quantity case

Runs against whichever gpufed the interpreter imports (so a venv of another checkout measures
that checkout). Output: ``{"cases": {name: {"ms": float, "outcome": str}}, "worst": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from gpufed.api.gpujob import GPUJob
from gpufed.api.inventory import NodeInventory
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol.codec import node_to_pb
from gpufed.hub.podsets import placement_request
from gpufed.hub.sessions import AgentSession
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
    worst = max(results, key=lambda k: results[k]["ms"])
    print(json.dumps({"cases": results, "worst": {"case": worst, **results[worst]}}))


if __name__ == "__main__":
    main()
