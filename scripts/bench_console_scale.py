#!/usr/bin/env python3
"""The console at fleet scale: how long its pages take to load, and screenshots, with M members
of N HGX nodes each (default 20 x 1,000 = 20,000 nodes, the fleet of
``gpufed bench scale --members 20 --nodes-per-member 1000``).

Usage: ``.venv/bin/python scripts/bench_console_scale.py --kubeconfig HUB_ADMIN_KUBECONFIG
OUT_DIR [--members 20] [--nodes-per-member 1000] [--jobs 1000]``

Against a hub API server with the gpufed CRDs (e.g. ``gpufed local up --clusters-only`` then
``gpufed hub install``), it creates M MemberClusters with their status and ``--jobs`` GPUJobs
(namespace ``console-scale``), serves the hub's real ``/fleet/members/<name>/blocks``
(``hub/edge/http.py``) from a placement snapshot of M x N 8-GPU nodes (a seeded random share
busy; reviews as the kubeconfig's identity), starts ``gpufed console --hub-url`` and runs
``scripts/console_shots.py`` on it. Prints that script's JSON line, plus the blocks endpoint's
answer size and time. Removes what it created at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config

from gpufed.api.inventory import ClusterInventory, MemberClusterState, NodeInventory
from gpufed.placement import FleetSnapshot

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.integration.console.harness import console, hub_blocks_endpoint  # noqa: E402
from tests.integration.hub.harness import gpu_job  # noqa: E402

H100 = "NVIDIA-H100-80GB-HBM3"
NS = "console-scale"
G, V = "gpufed.io", "v1alpha1"


def snapshot(members: int, nodes: int, seed: int) -> tuple[FleetSnapshot, dict[str, Any]]:
    rnd = random.Random(seed)
    states, stats = [], {}
    for m in range(members):
        name = f"scale-m{m:02d}"
        invs = []
        for i in range(nodes):
            used = rnd.choice((0, 0, 8, 8, 8, 4, 2, 6))
            invs.append(
                NodeInventory(
                    name=f"{name}-n{i:04d}",
                    gpu_product=H100,
                    nvlink_domain=f"node:{name}-n{i:04d}",
                    allocatable={"nvidia.com/gpu": 8},
                    requested={"nvidia.com/gpu": used} if used else {},
                    ready=rnd.random() > 0.005,
                )
            )
        states.append(
            MemberClusterState(
                name=name, inventory=ClusterInventory(cluster=name, nodes=tuple(invs))
            )
        )
    snap = FleetSnapshot(states)
    for st in states:
        stats[st.name] = snap.summary(st.name)
    return snap, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("out", type=Path)
    ap.add_argument("--members", type=int, default=20)
    ap.add_argument("--nodes-per-member", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    t0 = time.monotonic()
    snap, stats = snapshot(args.members, args.nodes_per_member, args.seed)
    api = config.new_client_from_config(config_file=str(args.kubeconfig))
    custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
    names = sorted(stats)
    with contextlib.suppress(k8s.ApiException):
        core.create_namespace({"metadata": {"name": NS}})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for name in names:
        s = stats[name]
        with contextlib.suppress(k8s.ApiException):
            custom.create_cluster_custom_object(
                G,
                V,
                "memberclusters",
                {
                    "apiVersion": f"{G}/{V}",
                    "kind": "MemberCluster",
                    "metadata": {"name": name},
                    "spec": {"joinTokenRef": {"name": f"{name}-join"}},
                },
            )
        custom.patch_cluster_custom_object_status(
            G,
            V,
            "memberclusters",
            name,
            {
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "AgentConnected",
                            "message": "",
                            "lastTransitionTime": now,
                        }
                    ],
                    "gpusTotal": s.gpus_total,
                    "gpusFree": s.gpus_free,
                    "largestFreeNVLinkBlock": s.largest_free_nvlink_block,
                    "largestFreeNVLinkBlockByProduct": s.largest_free_nvlink_block_by_product,
                    "nodes": args.nodes_per_member,
                }
            },
        )
    for j in range(args.jobs):
        with contextlib.suppress(k8s.ApiException):
            custom.create_namespaced_custom_object(
                G,
                V,
                NS,
                "gpujobs",
                {
                    "apiVersion": f"{G}/{V}",
                    "kind": "GPUJob",
                    "metadata": {"name": f"job-{j:05d}"},
                    "spec": {"template": gpu_job(8)},
                },
            )
    setup_s = time.monotonic() - t0

    token = yaml.safe_load(args.kubeconfig.read_text())["users"][0]["user"].get("token", "")
    try:
        with hub_blocks_endpoint(args.kubeconfig, snap) as hub_url:
            t = time.monotonic()
            req = urllib.request.Request(
                f"{hub_url}/fleet/members/{names[0]}/blocks",
                headers={"Authorization": f"Bearer {token}"},
            )
            with urllib.request.urlopen(req, timeout=30) as resp:
                body = resp.read()
            blocks_ms = (time.monotonic() - t) * 1000
            # the last --refresh wins: no live updates while the pages are timed
            with console(args.kubeconfig, "--hub-url", hub_url, "--refresh", "3600") as url:
                shots = subprocess.run(
                    [
                        sys.executable,
                        str(Path(__file__).with_name("console_shots.py")),
                        url,
                        str(args.out),
                        "--prefix",
                        f"scale{args.members}x{args.nodes_per_member}-",
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
        result = json.loads(shots.stdout.strip().splitlines()[-1])
    finally:
        for name in names:
            with contextlib.suppress(k8s.ApiException):
                custom.delete_cluster_custom_object(G, V, "memberclusters", name)
        with contextlib.suppress(k8s.ApiException):
            core.delete_namespace(NS)
    result.update(
        {
            "members": args.members,
            "nodes_per_member": args.nodes_per_member,
            "jobs": args.jobs,
            "setup_s": round(setup_s, 1),
            "blocks_answer_bytes": len(body),
            "blocks_answer_ms": round(blocks_ms, 1),
        }
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
