"""The one kube-scheduler configuration of every sandbox member: bin-pack GPUs.

Both ways of running a member use it: the process sandbox (:mod:`gpufed.sandbox.runtime`
writes it to ``clusters/<member>/scheduler.yaml`` for its kube-scheduler) and the kind provider
(:mod:`gpufed.sandbox.kind` mounts it into each member's control plane). Only the kubeconfig
path differs between them.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

#: How ``NodeResourcesFit`` scores nodes: MostAllocated, with ``nvidia.com/gpu`` weighing five
#: times cpu or memory, so pods fill partly used GPU nodes first and whole nodes and NVLink
#: domains stay free for large jobs.
GPU_BIN_PACKING = {
    "type": "MostAllocated",
    "resources": [
        {"name": "nvidia.com/gpu", "weight": 5},
        {"name": "cpu", "weight": 1},
        {"name": "memory", "weight": 1},
    ],
}


def scheduler_configuration(kubeconfig: Path | str) -> dict[str, Any]:
    """``KubeSchedulerConfiguration`` (``kubescheduler.config.k8s.io/v1``) for a member whose
    scheduler reaches its API server through ``kubeconfig`` (a path on the host that runs it):
    one ``default-scheduler`` profile scoring with :data:`GPU_BIN_PACKING`, client rate limits
    of 100 qps / 200 burst, no leader election (one scheduler per member). A new dict each
    call."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 100, "burst": 200},
        "leaderElection": {"leaderElect": False},
        "profiles": [
            {
                "schedulerName": "default-scheduler",
                "pluginConfig": [
                    {
                        "name": "NodeResourcesFit",
                        "args": {"scoringStrategy": copy.deepcopy(GPU_BIN_PACKING)},
                    },
                ],
            }
        ],
    }
