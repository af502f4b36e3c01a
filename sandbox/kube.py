"""Kubernetes clients for sandbox clusters, the raw Node reads the sandbox relies on, and one
raw request (:func:`kube_request`) for what the sandbox applies by REST path.

The sandbox writes one kubeconfig with a context per cluster (``hub`` and each member); these
helpers build a synchronous ``kubernetes`` client for a context without touching the process-wide
default configuration, so several clusters can be used side by side (tests, the demo).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from gpufed.api.labels import DRA_GPU_DRIVER

#: REST path parts (prefix, plural, namespaced) of the non-custom kinds the sandbox applies raw
#: (MultiKueue's and the workload operators' setup).
CORE_PATHS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Secret": ("/api/v1", "secrets", True),
    "CustomResourceDefinition": (
        "/apis/apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        False,
    ),
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        False,
    ),
    "ValidatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        False,
    ),
}


def kube_request(
    api: k8s.ApiClient,
    method: str,
    path: str,
    *,
    body: str | None = None,
    query: list[tuple[str, str]] | None = None,
    content_type: str | None = None,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """One raw request through ``api`` (its credentials and TLS), e.g. ``kube_request(api,
    "GET", "/apis/kueue.x-k8s.io/v1beta2/namespaces/bench/workloads")`` (a Workload's
    ``status.clusterName`` names the member MultiKueue chose); the decoded JSON answer.
    ``timeout_s``: seconds. Raises :class:`ApiException` for a non-2xx status."""
    headers = {"Accept": "application/json"}
    if content_type:
        headers["Content-Type"] = content_type
    m, url, hdrs, payload, _ = api.param_serialize(
        method,
        path,
        query_params=query,
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(m, url, header_params=hdrs, body=payload, _request_timeout=timeout_s)
    data = resp.read()  # type: ignore[no-untyped-call]
    if not 200 <= resp.status <= 299:
        text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
        raise ApiException(status=resp.status, reason=resp.reason, body=text)
    decoded = json.loads(data) if data else {}
    return decoded if isinstance(decoded, dict) else {}


def server_side_apply(api: k8s.ApiClient, path: str, obj: Mapping[str, Any]) -> None:
    """Server-side apply ``obj`` at REST ``path`` (field manager ``gpufed-sandbox``, forced).
    Raises :class:`ApiException` for a non-2xx status."""
    kube_request(
        api,
        "PATCH",
        path,
        body=json.dumps(obj),
        query=[("fieldManager", "gpufed-sandbox"), ("force", "true")],
        content_type="application/apply-patch+yaml",
    )


def api_client(kubeconfig: str | Path, context: str, *, pool_size: int = 8) -> k8s.ApiClient:
    """A ``kubernetes.client.ApiClient`` for ``context`` of ``kubeconfig`` (e.g. the sandbox's
    ``<state>/kubeconfig`` and ``"hub"`` or a member name). ``pool_size``: HTTP connections kept
    open (raise it for many threads)."""
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig), context=context, client_configuration=configuration
    )
    configuration.connection_pool_maxsize = pool_size
    return k8s.ApiClient(configuration)


def list_nodes_raw(api: k8s.ApiClient, *, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """All Nodes as plain JSON dicts (skips the client's slow model deserialisation, which
    matters with thousands of nodes)."""
    # With _preload_content=False the client returns the raw urllib3 response.
    resp: Any = k8s.CoreV1Api(api).list_node(_preload_content=False, _request_timeout=timeout_s)
    items: list[dict[str, Any]] = json.loads(resp.data)["items"]
    return items


def dra_gpus_by_node(api: k8s.ApiClient, *, timeout_s: float = 30.0) -> dict[str, int]:
    """Node name -> whole GPUs (``type: gpu`` devices) its ResourceSlices of driver
    ``gpu.nvidia.com`` publish, newest pool generation only; empty when the API server does
    not serve ``resource.k8s.io/v1``."""
    try:
        resp: Any = k8s.CustomObjectsApi(api).list_cluster_custom_object(
            "resource.k8s.io",
            "v1",
            "resourceslices",
            _preload_content=False,
            _request_timeout=timeout_s,
        )
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    slices = [
        s for s in json.loads(resp.data)["items"] if s["spec"].get("driver") == DRA_GPU_DRIVER
    ]
    newest: dict[str, int] = {}
    for s in slices:
        pool = s["spec"]["pool"]
        newest[pool["name"]] = max(newest.get(pool["name"], 0), int(pool.get("generation", 0)))
    out: dict[str, int] = {}
    for s in slices:
        spec = s["spec"]
        node = spec.get("nodeName")
        if not node or int(spec["pool"].get("generation", 0)) != newest[spec["pool"]["name"]]:
            continue
        whole = sum(
            1
            for d in spec.get("devices") or []
            if ((d.get("attributes") or {}).get("type") or {}).get("string") == "gpu"
        )
        out[node] = out.get(node, 0) + whole
    return out


def node_is_ready(node: dict[str, Any]) -> bool:
    """Condition Ready is True and the node lifecycle controller has removed the
    ``node.kubernetes.io/not-ready`` taint that admission puts on every new Node."""
    conds = node.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
    taints = node.get("spec", {}).get("taints") or []
    return ready and not any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints)


async def async_api_client(kubeconfig: str | Path, context: str) -> Any:
    """A ``kubernetes_asyncio`` ``ApiClient`` for ``context`` of ``kubeconfig`` (close it with
    ``await client.close()``). Typed ``Any``: kubernetes_asyncio ships no type information."""
    from kubernetes_asyncio import client as aclient
    from kubernetes_asyncio import config as aconfig

    configuration = aclient.Configuration()
    await aconfig.load_kube_config(
        config_file=str(kubeconfig), context=context, client_configuration=configuration
    )
    return aclient.ApiClient(configuration=configuration)
