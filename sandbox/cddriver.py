"""A simulated ComputeDomain controller for the sandbox: what NVIDIA's does that the pods need.

NVIDIA's ComputeDomain controller and IMEX daemons (kubernetes-sigs/dra-driver-nvidia-gpu,
``cmd/compute-domain-controller``, ``cmd/compute-domain-kubelet-plugin``) cannot run here: no
GPUs, no IMEX, no kubelet plugin under kwok, and the driver's Go module is not served. Like
kwok's simulated nodes, this module stands in for them and is no part of the product. For a
member with ``computeDomains: true`` (fleet file) it:

* installs the ComputeDomain CRD (:func:`crd`, ``resource.nvidia.com/v1beta1``, written here from
  the driver's documented fields: ``spec.numNodes``, ``spec.channel.resourceClaimTemplate.name``,
  ``spec.channel.allocationMode``; ``status.status`` Ready | NotReady, ``status.nodes``) and the
  DeviceClass ``compute-domain-default-channel.nvidia.com``;
* publishes, per GPU node, a ResourceSlice of driver ``compute-domain.nvidia.com`` with one
  channel device ``channel-0`` (``type: channel``, ``id: 0``) (:func:`channel_slice`);
* runs a loop (:func:`reconcile`, ``python -m gpufed.sandbox.cddriver --kubeconfig F --context C``, one
  process per member, supervised as ``cd-driver/<member>``) that, for every ComputeDomain,
  creates the channel ResourceClaimTemplate its spec names (owned by the domain, so the garbage
  collector deletes it with the domain; opaque config carrying the domain's UID, as the real
  controller writes), finds the nodes where claims made from it are allocated, labels them
  ``resource.nvidia.com/computeDomain=<uid>``, writes ``status.nodes`` and sets ``status.status``
  to ``Ready`` once ``spec.numNodes`` nodes joined; labels of domains that are gone are removed.

The member's real kube-controller-manager makes each pod's claim from the template, and its
real kube-scheduler allocates the channel on the pod's node. What a real install differs in:
IMEX daemons run on the joined nodes (a DaemonSet) and a node joins when its daemon is up, not
when a claim is allocated; the kubelet plugin prepares the channel (CDI device
``/dev/nvidia-caps-imex-channels/channel0``); real nodes publish 2,048 channel devices.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpufed.api.fleet import NodeSpec
from gpufed.api.labels import (
    COMPUTE_DOMAIN_API_VERSION,
    COMPUTE_DOMAIN_NODE_LABEL,
    DRA_CHANNEL_CLASS,
    DRA_COMPUTE_DOMAIN_DRIVER,
    GPU_CLIQUE_LABEL,
    GPU_RESOURCE,
)
from gpufed.sandbox.dradriver import resource_slice
from gpufed.sandbox.kube import api_client, list_nodes_raw
from gpufed.sandbox.state import SandboxError

_CD_GROUP, _CD_VERSION = COMPUTE_DOMAIN_API_VERSION.split("/")
_RES_GROUP, _RES_VERSION = "resource.k8s.io", "v1"
_PLURAL = "computedomains"


def crd() -> dict[str, Any]:
    """The ComputeDomain CustomResourceDefinition (namespaced; spec immutable; status subresource)."""
    node_status = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "ipAddress": {"type": "string"},
            "cliqueID": {"type": "string"},
            "index": {"type": "integer"},
            "status": {"type": "string", "enum": ["Ready", "NotReady"]},
        },
    }
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-validations": [
                    {"rule": "self == oldSelf", "message": "A computeDomain.spec is immutable"}
                ],
                "properties": {
                    "numNodes": {"type": "integer", "minimum": 0},
                    "channel": {
                        "type": "object",
                        "required": ["resourceClaimTemplate"],
                        "properties": {
                            "resourceClaimTemplate": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {"name": {"type": "string"}},
                            },
                            "allocationMode": {
                                "type": "string",
                                "enum": ["Single", "All"],
                                "default": "Single",
                            },
                        },
                    },
                },
            },
            "status": {
                "type": "object",
                "properties": {
                    "status": {"type": "string", "enum": ["Ready", "NotReady"]},
                    "nodes": {"type": "array", "items": node_status},
                },
            },
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{_PLURAL}.{_CD_GROUP}"},
        "spec": {
            "group": _CD_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": "ComputeDomain",
                "listKind": "ComputeDomainList",
                "plural": _PLURAL,
                "singular": "computedomain",
            },
            "versions": [
                {
                    "name": _CD_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": schema},
                    "additionalPrinterColumns": [
                        {"name": "Status", "type": "string", "jsonPath": ".status.status"},
                        {"name": "Nodes", "type": "integer", "jsonPath": ".spec.numNodes"},
                    ],
                }
            ],
        },
    }


def channel_class() -> dict[str, Any]:
    """The DeviceClass of a domain's default channel, as the driver's chart installs it."""
    d = DRA_COMPUTE_DOMAIN_DRIVER
    return {
        "apiVersion": f"{_RES_GROUP}/{_RES_VERSION}",
        "kind": "DeviceClass",
        "metadata": {"name": DRA_CHANNEL_CLASS},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": f"device.driver == '{d}' && "
                        f"device.attributes['{d}'].type == 'channel' && "
                        f"device.attributes['{d}'].id == 0"
                    }
                }
            ]
        },
    }


def channel_slice(spec: NodeSpec) -> dict[str, Any] | None:
    """The channel ResourceSlice of a GPU node (None for a node without GPUs)."""
    if not spec.dra_gpus and not int(spec.allocatable.get(GPU_RESOURCE) or 0):
        return None
    channel = {"name": "channel-0", "attributes": {"type": {"string": "channel"}, "id": {"int": 0}}}
    return resource_slice(spec.name, DRA_COMPUTE_DOMAIN_DRIVER, [channel])


def install(api: k8s.ApiClient, specs: list[NodeSpec]) -> int:
    """Install the CRD and the channel DeviceClass and publish the channel slices of ``specs``
    (objects that exist are left as they are); returns the slices published. Raises
    :class:`SandboxError` naming the object the API server refused."""
    custom = k8s.CustomObjectsApi(api)
    ext = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    _create(lambda: custom.create_cluster_custom_object(*ext, crd(), _request_timeout=30), "CRD")
    slices = [s for s in (channel_slice(n) for n in specs) if s is not None]
    for obj, plural in [(channel_class(), "deviceclasses")] + [
        (s, "resourceslices") for s in slices
    ]:
        _create(
            lambda o=obj, p=plural: custom.create_cluster_custom_object(
                _RES_GROUP, _RES_VERSION, p, o, _request_timeout=30
            ),
            f"{obj['kind']} {obj['metadata']['name']}",
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # served before the agents' discovery runs
        got: Any = custom.get_cluster_custom_object(*ext, f"{_PLURAL}.{_CD_GROUP}")
        conds = {c["type"]: c["status"] for c in (got.get("status") or {}).get("conditions") or []}
        if conds.get("Established") == "True":
            break
        time.sleep(0.2)
    return len(slices)


def _create(call: Any, what: str) -> None:
    try:
        call()
    except ApiException as exc:
        if exc.status != 409:
            raise SandboxError(
                f"sandbox failed to start: the API server refused {what}: {exc.status} {exc.reason}"
            ) from None


def channel_template(domain: dict[str, Any]) -> dict[str, Any]:
    """The ResourceClaimTemplate the controller creates for ``domain`` (owned by it)."""
    meta = domain["metadata"]
    return {
        "apiVersion": f"{_RES_GROUP}/{_RES_VERSION}",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": domain["spec"]["channel"]["resourceClaimTemplate"]["name"],
            "namespace": meta["namespace"],
            "ownerReferences": [
                {
                    "apiVersion": COMPUTE_DOMAIN_API_VERSION,
                    "kind": "ComputeDomain",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "channel",
                            "exactly": {
                                "deviceClassName": DRA_CHANNEL_CLASS,
                                "allocationMode": "ExactCount",
                                "count": 1,
                            },
                        }
                    ],
                    "config": [
                        {
                            "requests": ["channel"],
                            "opaque": {
                                "driver": DRA_COMPUTE_DOMAIN_DRIVER,
                                "parameters": {
                                    "apiVersion": COMPUTE_DOMAIN_API_VERSION,
                                    "kind": "ComputeDomainChannelConfig",
                                    "domainID": meta["uid"],
                                    "allocationMode": domain["spec"]["channel"].get(
                                        "allocationMode", "Single"
                                    ),
                                },
                            },
                        }
                    ],
                }
            }
        },
    }


def joined_nodes(claims: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Domain UID -> nodes where a claim carrying its channel config is allocated."""
    out: dict[str, set[str]] = {}
    for claim in claims:
        devices = (claim.get("spec") or {}).get("devices") or {}
        uid = next(
            (
                ((c.get("opaque") or {}).get("parameters") or {}).get("domainID")
                for c in devices.get("config") or []
                if (c.get("opaque") or {}).get("driver") == DRA_COMPUTE_DOMAIN_DRIVER
            ),
            None,
        )
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if uid and result.get("driver") == DRA_COMPUTE_DOMAIN_DRIVER:
                out.setdefault(uid, set()).add(str(result.get("pool")))
    return out


def reconcile(api: k8s.ApiClient) -> None:
    """One pass over the member (module doc): templates, node labels, domain statuses."""
    custom = k8s.CustomObjectsApi(api)
    core = k8s.CoreV1Api(api)
    listed: Any = custom.list_cluster_custom_object(_CD_GROUP, _CD_VERSION, _PLURAL)
    domains: list[dict[str, Any]] = listed["items"]
    listed = custom.list_cluster_custom_object(_RES_GROUP, _RES_VERSION, "resourceclaims")
    joined = joined_nodes(listed["items"])
    labels: dict[str, dict[str, str]] = {
        n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in list_nodes_raw(api)
    }
    live: dict[str, set[str]] = {}
    for domain in domains:
        meta = domain["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        uid, ns = meta["uid"], meta["namespace"]
        with contextlib.suppress(ApiException):  # 409: made on an earlier pass
            custom.create_namespaced_custom_object(
                _RES_GROUP, _RES_VERSION, ns, "resourceclaimtemplates", channel_template(domain)
            )
        members = sorted(n for n in joined.get(uid, set()) if n in labels)
        live[uid] = set(members)
        want = int(domain["spec"].get("numNodes") or 0)
        status = {
            "status": "Ready" if members and len(members) >= want else "NotReady",
            "nodes": [
                {
                    "name": n,
                    "ipAddress": "10.0.0.1",
                    "cliqueID": labels[n].get(GPU_CLIQUE_LABEL, ""),
                    "index": i,
                    "status": "Ready",
                }
                for i, n in enumerate(members)
            ],
        }
        if domain.get("status") != status:
            with contextlib.suppress(ApiException):  # deleted meanwhile
                custom.patch_namespaced_custom_object_status(
                    _CD_GROUP, _CD_VERSION, ns, _PLURAL, meta["name"], {"status": status}
                )
    for name, node_labels in labels.items():
        have = node_labels.get(COMPUTE_DOMAIN_NODE_LABEL)
        want_uid = next((u for u, ns in live.items() if name in ns), None)
        if have != want_uid:
            with contextlib.suppress(ApiException):
                core.patch_node(
                    name, {"metadata": {"labels": {COMPUTE_DOMAIN_NODE_LABEL: want_uid}}}
                )


def main(argv: list[str] | None = None) -> None:
    """Run :func:`reconcile` every ``--interval`` seconds against ``--kubeconfig``'s cluster."""
    parser = argparse.ArgumentParser(prog="gpufed.sandbox.cddriver", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--context", required=True)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    api = api_client(args.kubeconfig, args.context)
    while True:
        try:
            reconcile(api)
        except (ApiException, OSError) as exc:  # the API server restarting: try again
            print(f"cd-driver: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    main()
