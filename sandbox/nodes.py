"""The fleet's nodes as Kubernetes Node objects for kwok to manage, and their creation.

:func:`node_manifest` is the Node for one :class:`~gpufed.api.fleet.NodeSpec` (the expansion
the placement simulator also reads); :meth:`gpufed.sandbox.runtime.Sandbox.up` creates them on
each member with :func:`create_nodes`, the kind provider (:mod:`gpufed.sandbox.kind`) writes
them to a manifest file, and ``scripts/bench_agent.py`` builds its benchmark nodes from it.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gpufed.api.fleet import NodeSpec
from gpufed.sandbox.state import SandboxError


def node_manifest(spec: NodeSpec) -> dict[str, Any]:
    """A kwok-managed Node for ``spec``: labels, taints, and status capacity/allocatable set on
    create (allowed for Nodes), which kwok's node-initialize stage keeps."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": dict(spec.labels),
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        "spec": {"taints": [t.model_dump() for t in spec.taints]},
        "status": {
            "capacity": dict(spec.capacity),
            "allocatable": dict(spec.allocatable),
            # Empty fields are filled in by kwok's node-initialize stage.
            "nodeInfo": {
                "architecture": spec.labels.get("kubernetes.io/arch", "amd64"),
                "operatingSystem": "linux",
                **dict.fromkeys(
                    (
                        "bootID",
                        "containerRuntimeVersion",
                        "kernelVersion",
                        "kubeProxyVersion",
                        "kubeletVersion",
                        "machineID",
                        "osImage",
                        "systemUUID",
                    ),
                    "",
                ),
            },
        },
    }


def create_nodes(api: k8s.ApiClient, specs: list[NodeSpec]) -> None:
    """Create ``specs`` as Nodes through ``api`` (8 at a time); a node that exists already is
    left as it is. 5xx, 429 and connection errors are retried up to 5 times per node; any
    other refusal raises :class:`SandboxError` naming the node and the API server's answer."""
    core = k8s.CoreV1Api(api)

    def create(spec: NodeSpec) -> None:
        for attempt in range(5):
            try:
                # A plain dict body is sent as JSON unchanged (status included, which the
                # API server accepts on Node create).
                body: Any = node_manifest(spec)
                core.create_node(body, _request_timeout=30)
                return
            except ApiException as exc:
                if exc.status == 409:
                    return
                if exc.status and exc.status < 500 and exc.status != 429:
                    raise SandboxError(
                        f"sandbox failed to start: the API server refused node {spec.name}: "
                        f"{exc.status} {exc.reason}: {exc.body}"
                    ) from None
            except (HTTPError, OSError):
                pass
            time.sleep(0.5 * (attempt + 1))
        raise SandboxError(f"sandbox failed to start: could not create node {spec.name}")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, specs))
