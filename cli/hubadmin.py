"""``gpufed hub certs | install | join``: the admin commands around the hub.

- ``certs``: a sandbox CA and server certificate for the agent listener;
- ``install``: the gpufed CRDs (and the join-token namespace) in the hub cluster;
- ``join``: a member's join-token Secret and its MemberCluster, and the token the agent presents.

``cli/hub.py`` registers these functions as commands of ``gpufed hub``. Kubeconfig resolution is
kubectl's (``cli/kube.py``).
"""

from __future__ import annotations

import base64
import secrets
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufed.api.crdgen import all_crds
from gpufed.api.labels import API_VERSION, JOIN_TOKEN_LABEL
from gpufed.cli import kube
from gpufed.hub.edge import certs as hub_certs

Kubeconfig = kube.Kubeconfig
Context = kube.Context


def certs(
    out: Annotated[Path, typer.Option("--out", help="directory for ca.crt, server.crt/.key")],
    host: Annotated[
        list[str] | None, typer.Option("--host", help="extra DNS name or IP (repeat)")
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="replace existing files")] = False,
) -> None:
    """Generate a sandbox CA and a server certificate for the agent gRPC listener."""
    files = hub_certs.generate(out, hosts=tuple(host or ()), overwrite=overwrite)
    typer.echo(f"CA:          {files.ca_cert}   (agents: --ca-file)")
    typer.echo(f"certificate: {files.server_cert}   (hub: --tls-cert)")
    typer.echo(f"key:         {files.server_key}   (hub: --tls-key)")


def _client(kubeconfig: Path | None, context: str | None) -> Any:
    return kube.connect(kubeconfig, context).api


def install_crds(api: Any) -> list[str]:
    """Create or update the gpufed CRDs through a sync ``ApiClient``; returns what happened,
    one ``kubectl``-style line per CRD."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    ext: Any = client.ApiextensionsV1Api(api)
    done = []
    for crd in all_crds().values():
        name = crd["metadata"]["name"]
        try:
            current = ext.read_custom_resource_definition(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            ext.create_custom_resource_definition(crd)
            done.append(f"customresourcedefinition/{name} created")
            continue
        meta = {**crd["metadata"], "resourceVersion": current.metadata.resource_version}
        ext.replace_custom_resource_definition(name, {**crd, "metadata": meta})
        done.append(f"customresourcedefinition/{name} configured")
    return done


def install(
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    token_namespace: Annotated[
        str, typer.Option(help="namespace of join tokens")
    ] = "gpufed-system",
) -> None:
    """Apply the gpufed CRDs and create the join-token namespace in the hub cluster."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = _client(kubeconfig, context)
    for line in install_crds(api):
        typer.echo(line)
    try:
        core: Any = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": token_namespace}})
        typer.echo(f"namespace/{token_namespace} created")
    except ApiException as exc:
        if exc.status != 409:
            raise


def register_member(
    api: Any,
    cluster: str,
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    token_namespace: str = "gpufed-system",
) -> str:
    """What ``gpufed hub join`` does, through a sync ``ApiClient``: a fresh join token in Secret
    ``<token_namespace>/gpufed-join-<cluster>`` (replaced when it exists) and MemberCluster
    ``cluster`` referencing it (its spec patched when it exists). Returns the token. Raises the
    client's ``ApiException`` for anything but 409. ``gpufed bench scale`` joins its simulated
    members with it, in-process."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    labels = labels or {}
    taints = taints or []
    token = secrets.token_urlsafe(32)
    core: Any = client.CoreV1Api(api)
    secret_name = f"gpufed-join-{cluster}"
    body = {
        # The hub watches only Secrets with JOIN_TOKEN_LABEL (hub/components/tokens.py).
        "metadata": {
            "name": secret_name,
            "labels": {"gpufed.io/member": cluster, JOIN_TOKEN_LABEL: "true"},
        },
        "type": "Opaque",
        "data": {"token": base64.b64encode(token.encode()).decode()},
    }
    try:
        core.create_namespaced_secret(token_namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        core.replace_namespaced_secret(secret_name, token_namespace, body)
    member = {
        "apiVersion": API_VERSION,
        "kind": "MemberCluster",
        "metadata": {"name": cluster},
        "spec": {
            "labels": labels,
            "taints": taints,
            "joinTokenRef": {"name": secret_name, "namespace": token_namespace},
        },
    }
    custom: Any = client.CustomObjectsApi(api)
    try:
        custom.create_cluster_custom_object("gpufed.io", "v1alpha1", "memberclusters", member)
    except ApiException as exc:
        if exc.status != 409:
            raise
        custom.patch_cluster_custom_object(
            "gpufed.io", "v1alpha1", "memberclusters", cluster, {"spec": member["spec"]}
        )
    return token


def join(
    cluster: Annotated[str, typer.Argument(help="member cluster name")],
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="member label key=value (repeat)")
    ] = None,
    taint: Annotated[
        list[str] | None, typer.Option("--taint", help="member taint key=value:Effect (repeat)")
    ] = None,
    token_namespace: Annotated[str, typer.Option(help="namespace of the Secret")] = "gpufed-system",
    token_file: Annotated[
        Path | None, typer.Option(help="write the token here (mode 0600) instead of printing")
    ] = None,
) -> None:
    """Register a member: a join-token Secret on the hub and a MemberCluster referencing it."""
    labels = dict(_pair(item, "=", "--label") for item in label or [])
    taints = []
    for item in taint or []:
        kv, _, effect = item.rpartition(":")
        key, _, value = kv.partition("=")
        if not key or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise typer.BadParameter(f"--taint {item!r}: use key=value:NoSchedule")
        taints.append({"key": key, "value": value, "effect": effect})
    token = register_member(
        _client(kubeconfig, context),
        cluster,
        labels=labels,
        taints=taints,
        token_namespace=token_namespace,
    )
    if token_file:
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        typer.echo(f"membercluster/{cluster} joined; token written to {token_file}")
    else:
        typer.echo(token)


def _pair(item: str, sep: str, flag: str) -> tuple[str, str]:
    key, found, value = item.partition(sep)
    if not found or not key:
        raise typer.BadParameter(f"{flag} {item!r}: use key{sep}value")
    return key, value
