"""The chaos soak's fleet, queues and job stream: what ``gpufed bench soak`` runs, seeded.

* :func:`soak_fleet`: two small members sized for a 2-core machine: ``soak-hgx`` (3 HGX H100
  nodes of 8 GPUs, one NVLink domain each) and ``soak-mix`` (2 GB200 trays of 4 GPUs sharing
  one NVLink clique, one A100 node with 2 of 8 GPUs split into 7 MIG 1g.10gb slices each);
* :func:`soak_queues`: ``soak-org`` (root, 32 whole GPUs, 14 MIG slices) over ``soak-a``
  (namespace ``soak-a``, 16 GPUs, may borrow 8) and ``soak-b`` (namespace ``soak-b``, 16
  GPUs, lends at most 8), MIG slices 7 each;
* :func:`job_schedule`: a Poisson stream of jobs (``rate_per_min``) with mixed priorities
  (PriorityClasses ``soak-high`` 1000, ``soak-low`` 100, or none) and kinds: ``plain`` (1-8
  whole GPUs, any product), ``nvlink`` (a 2-pod gang of 4 GB200 GPUs each, NVLink
  Required), ``mig`` (1-2 MIG 1g.10gb slices), ``fail`` (exits 1 after a few seconds, the
  sandbox's ``gpufed.io/sim-exit-code`` annotation: an application failure, never re-run).
  Pure: same seed, same list.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from gpufed.api.fleet import FleetSpec
from gpufed.api.labels import GROUP, SIM_DURATION_ANNOTATION, SIM_EXIT_CODE_ANNOTATION, VERSION

NAMESPACES = ("soak-a", "soak-b")
PRIORITY_CLASSES = {"soak-high": 1000, "soak-low": 100}
MIG = "nvidia.com/mig-1g.10gb"
KIND_WEIGHTS = {"plain": 6, "nvlink": 1, "mig": 2, "fail": 1}


def soak_fleet() -> FleetSpec:
    """The soak's two members (module docstring)."""
    return FleetSpec.model_validate(
        {
            "clusters": [
                {
                    "name": "soak-hgx",
                    "labels": {"region": "us-east"},
                    "nodePools": [
                        {
                            "name": "h100",
                            "nodes": 3,
                            "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8},
                            "nvlink": "node",
                        }
                    ],
                },
                {
                    "name": "soak-mix",
                    "labels": {"region": "eu-west"},
                    "nodePools": [
                        {
                            "name": "gb200",
                            "nodes": 2,
                            "gpu": {"product": "NVIDIA-GB200", "count": 4},
                            "nvlink": {"nodesPerDomain": 2},
                        },
                        {
                            "name": "a100",
                            "nodes": 1,
                            "gpu": {"product": "NVIDIA-A100-SXM4-80GB", "count": 8},
                            "nvlink": "node",
                            "mig": {"strategy": "mixed", "gpus": 2, "profiles": {"1g.10gb": 7}},
                        },
                    ],
                },
            ]
        }
    )


def _queue(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def soak_queues() -> list[dict[str, Any]]:
    """The soak's GPUQueues (module docstring), parents first."""
    return [
        _queue(
            "soak-org",
            {"quotas": [{"gpuProduct": "*", "nominal": 32}, {"gpuProduct": MIG, "nominal": 14}]},
        ),
        _queue(
            "soak-a",
            {
                "parent": "soak-org",
                "namespaces": ["soak-a"],
                "quotas": [
                    {"gpuProduct": "*", "nominal": 16, "borrowingLimit": 8},
                    {"gpuProduct": MIG, "nominal": 7},
                ],
            },
        ),
        _queue(
            "soak-b",
            {
                "parent": "soak-org",
                "namespaces": ["soak-b"],
                "quotas": [
                    {"gpuProduct": "*", "nominal": 16, "lendingLimit": 8},
                    {"gpuProduct": MIG, "nominal": 7},
                ],
            },
        ),
    ]


@dataclass(frozen=True)
class SoakJob:
    """One job of the stream: created ``at_s`` after the start in ``namespace``; ``expect``:
    ``succeed`` or ``fail`` (its own exit code)."""

    at_s: float
    name: str
    namespace: str
    kind: str
    expect: str
    manifest: dict[str, Any] = field(hash=False, compare=True)


def _template(
    pods: int, resource: str, count: int, run_s: int, exit_code: int | None
) -> dict[str, Any]:
    annotations = {SIM_DURATION_ANNOTATION: f"{run_s}s"}
    if exit_code is not None:
        annotations[SIM_EXIT_CODE_ANNOTATION] = str(exit_code)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "soak:1.0",
                            "resources": {"limits": {resource: count}},
                        }
                    ],
                },
            },
        },
    }


def job_schedule(seed: int, duration_s: float, rate_per_min: float = 6.0) -> list[SoakJob]:
    """The seeded job stream over ``duration_s`` seconds (module docstring). Pure."""
    rng = random.Random(seed * 7919 + 17)
    kinds = list(KIND_WEIGHTS)
    weights = list(KIND_WEIGHTS.values())
    out: list[SoakJob] = []
    t = rng.uniform(2.0, 8.0)
    i = 0
    while t < duration_s:
        kind = rng.choices(kinds, weights)[0]
        ns = NAMESPACES[rng.randrange(len(NAMESPACES))]
        run_s = rng.randint(15, 75)
        prio = rng.choice([None, "soak-low", "soak-high"])
        placement: dict[str, Any] = {"retry": {"onInfrastructureFailure": 6}}
        if kind == "nvlink":
            tmpl = _template(2, "nvidia.com/gpu", 4, run_s, None)
            placement |= {"gpuProducts": ["GB200"], "topology": {"nvlink": "Required"}}
        elif kind == "mig":
            tmpl = _template(1, MIG, rng.randint(1, 2), run_s, None)
        elif kind == "fail":
            tmpl = _template(1, "nvidia.com/gpu", rng.choice([1, 2]), rng.randint(3, 15), 1)
        else:
            tmpl = _template(1, "nvidia.com/gpu", rng.choice([1, 2, 4, 8]), run_s, None)
        if prio is not None:
            placement["priorityClassName"] = prio
        name = f"soak-{seed}-{i:04d}-{kind}"
        manifest = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "GPUJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"template": tmpl, "placement": placement},
        }
        out.append(
            SoakJob(round(t, 2), name, ns, kind, "fail" if kind == "fail" else "succeed", manifest)
        )
        i += 1
        t += rng.expovariate(rate_per_min / 60.0)
    return out
