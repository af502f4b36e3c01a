"""The CLI's one way to a Kubernetes API server: kubectl's kubeconfig resolution
(:func:`gpufed.api.kubeconfig.resolve_kubeconfig`) and a sync client built from it.

Used by every command that talks to the hub cluster (``submit``, ``get``, ``explain``,
``delete``, ``hub install|join``, ``version``); ``hub`` and ``agent`` resolve here too and hand
the resolved file to their process. The options are shared so every command spells them alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufed.api.kubeconfig import KubeSource, resolve_kubeconfig

__all__ = ["Context", "HubClient", "Kubeconfig", "connect", "resolve"]

Kubeconfig = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig",
        help="kubeconfig file (default as kubectl: $KUBECONFIG, ~/.kube/config, in-cluster)",
    ),
]
Context = Annotated[str | None, typer.Option("--context", help="kubeconfig context")]


def resolve(kubeconfig: Path | None, context: str | None) -> KubeSource:
    """:func:`gpufed.api.kubeconfig.resolve_kubeconfig` (raises ``KubeconfigError``)."""
    return resolve_kubeconfig(kubeconfig, context)


@dataclass
class HubClient:
    """A sync ``kubernetes.client.ApiClient`` (``api``), the server URL and the context's
    namespace, and where the credentials came from (``source``)."""

    api: Any
    server: str
    namespace: str
    source: KubeSource


def connect(kubeconfig: Path | None, context: str | None) -> HubClient:
    """Resolve credentials and build a sync client (no request is sent yet).

    Raises ``KubeconfigError`` (resolution) or ``kubernetes.config.ConfigException`` (a
    kubeconfig whose context lacks a cluster or user); the CLI's error handler turns both into
    one line.
    """
    from kubernetes import client, config

    source = resolve(kubeconfig, context)
    cfg = client.Configuration()
    loader: Any = config  # the sync client's config loaders are untyped
    if source.path is None:
        loader.load_incluster_config(client_configuration=cfg)
    else:
        loader.load_kube_config(
            config_file=str(source.path),
            context=source.context,
            client_configuration=cfg,
            persist_config=False,
        )
    return HubClient(client.ApiClient(cfg), str(cfg.host), source.namespace, source)
