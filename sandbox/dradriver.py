"""A simulated NVIDIA DRA driver for the sandbox: what the real one publishes that pods depend on.

NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu) cannot run here (no GPUs, no
kubelet plugin under kwok), so, like kwok's simulated nodes, this module stands in for it and is
no part of the product: for every node of a ``dra: true`` pool it publishes the node's
ResourceSlice of driver ``gpu.nvidia.com`` (pool named after the node, generation 1, devices
``gpu-<minor>`` with the driver's attribute names and ``memory`` capacity), and it installs the
driver's DeviceClasses (``gpu.nvidia.com``: ``type == 'gpu'``; ``mig.nvidia.com``:
``type == 'mig'``). The member's real kube-scheduler then allocates claims against the slices,
its kube-controller-manager makes a pod's claims from their templates, and kwok runs the pods.
What a real install differs in: the kubelet plugin also prepares each allocated device on its
node (CDI, the container sees the GPU) and republishes slices when GPUs change; neither is
needed by pods that only sleep.

Called by :meth:`gpufed.sandbox.runtime.Sandbox.up` after the nodes are created.
"""

from __future__ import annotations

import uuid
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpufed.api.fleet import NodeSpec
from gpufed.api.fleetnodes import dra_group
from gpufed.api.labels import DRA_GPU_DRIVER, DRA_MIG_CLASS
from gpufed.sandbox.state import SandboxError

_GROUP, _VERSION = "resource.k8s.io", "v1"


def device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses the driver's Helm chart installs for GPUs and MIG devices."""
    return [
        {
            "apiVersion": f"{_GROUP}/{_VERSION}",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            "expression": f"device.driver == '{DRA_GPU_DRIVER}' && "
                            f"device.attributes['{DRA_GPU_DRIVER}'].type == '{kind}'"
                        }
                    }
                ]
            },
        }
        for name, kind in ((DRA_GPU_DRIVER, "gpu"), (DRA_MIG_CLASS, "mig"))
    ]


def _attr(value: object) -> dict[str, object]:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def node_slice(spec: NodeSpec) -> dict[str, Any] | None:
    """The ResourceSlice the driver publishes for ``spec``'s GPUs (None without DRA GPUs)."""
    group = dra_group(spec)
    if group is None:
        return None
    devices = []
    for minor in range(group.count):
        attributes: dict[str, Any] = {k: _attr(v) for k, v in group.attributes.items()}
        attributes |= {k: {"version": v} for k, v in group.versions.items()}
        attributes |= {
            "uuid": _attr(f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{spec.name}/{minor}')}"),
            "minor": _attr(minor),
            "index": _attr(minor),
            "resource.kubernetes.io/pciBusID": _attr(f"0000:{0x18 + minor:02x}:00.0"),
        }
        devices.append(
            {
                "name": f"gpu-{minor}",
                "attributes": attributes,
                "capacity": {"memory": {"value": str(group.capacity["memory"])}},
            }
        )
    return resource_slice(spec.name, DRA_GPU_DRIVER, devices)


def resource_slice(node: str, driver: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    """The one ResourceSlice of ``driver`` on ``node``: pool named after the node, generation 1,
    named ``<node>-<driver>`` (as NVIDIA's kubelet plugins publish them)."""
    return {
        "apiVersion": f"{_GROUP}/{_VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def publish(api: k8s.ApiClient, specs: list[NodeSpec]) -> int:
    """Install the DeviceClasses and publish the slices of ``specs``' DRA nodes (objects that
    exist are left as they are); returns the slices published. Does nothing for a member
    without DRA nodes. Raises :class:`SandboxError` naming the object the API server refused."""
    slices = [s for s in (node_slice(spec) for spec in specs) if s is not None]
    if not slices:
        return 0
    custom = k8s.CustomObjectsApi(api)
    for obj, plural in [(c, "deviceclasses") for c in device_classes()] + [
        (s, "resourceslices") for s in slices
    ]:
        try:
            custom.create_cluster_custom_object(_GROUP, _VERSION, plural, obj, _request_timeout=30)
        except ApiException as exc:
            if exc.status != 409:
                raise SandboxError(
                    f"sandbox failed to start: the API server refused {obj['kind']} "
                    f"{obj['metadata']['name']}: {exc.status} {exc.reason}"
                ) from None
    return len(slices)
