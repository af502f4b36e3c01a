"""What the console reads from the hub cluster, as the person who runs it: the one module of
:mod:`gpufed.console` that talks to the Kubernetes API (kubernetes_asyncio).

The console holds no credentials of its own: :meth:`HubReader.connect` resolves the user's
kubeconfig as kubectl does (:func:`gpufed.api.kubeconfig.resolve_kubeconfig`), and every read
goes to the hub cluster's API server with that identity, so the hub cluster's RBAC decides what
each page shows. A read the identity may not make is not an error: it comes back empty with a
:class:`Hidden` note naming what was not readable and the permission that would make it so.

GPUJobs are listed cluster-wide when the identity may; otherwise namespace by namespace over the
namespaces it might read (the context's namespace, those named with ``--namespace``, and those
the readable GPUQueues list), skipping each one RBAC refuses. Lists are paged (``limit``) and
capped at :data:`MAX_OBJECTS` objects per kind (a note says when the cap cut one).

Node- and block-level state lives in the hub process, not in API objects: with ``hub_url``,
:meth:`HubReader.blocks` asks the hub's ``GET /fleet/members/<name>/blocks`` with the same
identity's bearer token, and the hub asks the hub cluster (TokenReview, SubjectAccessReview)
whether that identity may ``get`` the MemberCluster: the same RBAC decides. A kubeconfig user
without a bearer token (client certificates, an exec plugin) gets totals only, and a note.

Who calls it: :mod:`gpufed.console.server` (every page), ``gpufed console`` (connect/close).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from gpufed.api.errors import TransientError
from gpufed.api.kubeconfig import KubeSource, resolve_kubeconfig
from gpufed.api.labels import GROUP, VERSION

__all__ = [
    "MAX_OBJECTS",
    "PAGE",
    "Hidden",
    "HubReadError",
    "HubReader",
    "Identity",
    "JobRead",
    "Listed",
    "configuration",
]

#: Objects read per request (``limit``) and most objects of one kind the console reads.
PAGE = 500
MAX_OBJECTS = 20_000
#: Most Events read for one job's timeline (the newest are kept).
MAX_EVENTS = 200
#: Largest answer accepted from the hub's blocks endpoint (a 5,000-node member is ~1 MB).
MAX_BLOCKS_BYTES = 8 * 1024 * 1024
#: Members whose blocks are asked for at once, and how long one answer may take (seconds).
BLOCKS_CONCURRENCY = 8
BLOCKS_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Hidden:
    """Something the identity may not read: ``what`` (``GPUJobs in namespace team-b``) and
    ``need`` (the RBAC rule that would show it: ``list gpujobs.gpufed.io``)."""

    what: str
    need: str


@dataclass
class Listed:
    """Objects as the API server returned them (dicts), and what could not be read."""

    items: list[dict[str, Any]] = field(default_factory=list)
    hidden: list[Hidden] = field(default_factory=list)
    #: True when :data:`MAX_OBJECTS` cut the list
    truncated: bool = False


@dataclass
class JobRead:
    """One GPUJob (None when absent or not readable), its Events, and what was hidden."""

    job: dict[str, Any] | None
    events: list[dict[str, Any]] = field(default_factory=list)
    hidden: list[Hidden] = field(default_factory=list)
    #: 404 (no such job) or 403 (not readable) when ``job`` is None
    status: int = 200


class HubReadError(TransientError):
    """The API server answered something other than 2xx, 401, 403 or 404 (the message says
    what); the page shows it and the next refresh tries again."""


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or b"")["message"])
    except (ValueError, KeyError, TypeError):
        return f"{exc.status} {exc.reason}"


async def configuration(
    kubeconfig: Path | None, context: str | None
) -> tuple[KubeSource, client.Configuration]:
    """The credentials resolved as kubectl does and the client configuration they give (the
    Pod's in-cluster one when no kubeconfig is found). Raises ``KubeconfigError`` (resolution)
    or ``kubernetes_asyncio.config.ConfigException`` (a context without a cluster or user)."""
    source = resolve_kubeconfig(kubeconfig, context)
    cfg = client.Configuration()
    if source.path is None:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(
            config_file=str(source.path),
            context=source.context,
            client_configuration=cfg,
            persist_config=False,
        )
    return source, cfg


class Identity(Protocol):
    """Who a reader reads as: :class:`gpufed.api.kubeconfig.KubeSource` (a kubeconfig or the
    Pod's service account) or :class:`gpufed.console.callers.CallerSource` (a caller's token)."""

    @property
    def namespace(self) -> str: ...

    def describe(self) -> str: ...


class HubReader:
    """Reads the hub cluster with one identity. ``namespaces``: extra namespaces to try when
    GPUJobs cannot be listed cluster-wide (the context's namespace is always tried)."""

    def __init__(
        self,
        api: client.ApiClient,
        source: Identity,
        namespaces: Iterable[str] = (),
        *,
        hub_url: str | None = None,
    ) -> None:
        self._api = api
        self.source = source
        self.server = str(api.configuration.host)
        self.namespaces = sorted({source.namespace, *namespaces})
        self.hub_url = hub_url.rstrip("/") if hub_url else None
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._http: aiohttp.ClientSession | None = None

    @classmethod
    async def connect(
        cls,
        kubeconfig: Path | None,
        context: str | None,
        namespaces: Iterable[str] = (),
        *,
        hub_url: str | None = None,
    ) -> HubReader:
        """Resolve credentials as kubectl does and build a client (no request is sent).

        Raises ``KubeconfigError`` (resolution) or ``kubernetes_asyncio.config.ConfigException``
        (a context without a cluster or user)."""
        source, cfg = await configuration(kubeconfig, context)
        return cls(client.ApiClient(configuration=cfg), source, namespaces, hub_url=hub_url)

    async def close(self) -> None:
        """Close the HTTP sessions."""
        await self._api.close()
        if self._http is not None:
            await self._http.close()

    # --- lists ------------------------------------------------------------------------------

    async def _pages(self, call: Any, *args: Any, **kw: Any) -> tuple[list[dict[str, Any]], bool]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            extra = {"_continue": token} if token else {}
            resp = await call(*args, limit=PAGE, **kw, **extra)
            body = resp if isinstance(resp, dict) else resp.to_dict()
            items.extend(body.get("items") or [])
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                return items, False
            if len(items) >= MAX_OBJECTS:
                return items[:MAX_OBJECTS], True

    async def _cluster_list(self, plural: str, kind: str) -> Listed:
        try:
            items, cut = await self._pages(
                self._custom.list_cluster_custom_object, GROUP, VERSION, plural
            )
        except ApiException as exc:
            if exc.status in (401, 403, 404):
                return Listed(hidden=[Hidden(f"{kind}s", f"list {plural}.{GROUP}")])
            raise HubReadError(f"listing {plural}.{GROUP}: {_message(exc)}") from exc
        return Listed(items, truncated=cut)

    async def clusters(self) -> Listed:
        """Every MemberCluster the identity may list (cluster-scoped)."""
        return await self._cluster_list("memberclusters", "MemberCluster")

    async def queues(self) -> Listed:
        """Every GPUQueue the identity may list (cluster-scoped)."""
        return await self._cluster_list("gpuqueues", "GPUQueue")

    async def jobs(self, queue_namespaces: Iterable[str] = ()) -> Listed:
        """Every GPUJob the identity may list: cluster-wide when allowed, else per namespace
        over :attr:`namespaces` and ``queue_namespaces`` (each refused one is left out,
        noted once for all)."""
        try:
            items, cut = await self._pages(
                self._custom.list_cluster_custom_object, GROUP, VERSION, "gpujobs"
            )
            return Listed(items, truncated=cut)
        except ApiException as exc:
            if exc.status not in (401, 403):
                raise HubReadError(f"listing gpujobs.{GROUP}: {_message(exc)}") from exc
        out = Listed()
        refused: list[str] = []
        for ns in sorted({*self.namespaces, *queue_namespaces}):
            try:
                items, cut = await self._pages(
                    self._custom.list_namespaced_custom_object, GROUP, VERSION, ns, "gpujobs"
                )
            except ApiException as exc:
                if exc.status in (401, 403, 404):
                    refused.append(ns)
                    continue
                raise HubReadError(f"listing gpujobs.{GROUP} in {ns}: {_message(exc)}") from exc
            out.items.extend(items)
            out.truncated |= cut
        out.hidden.append(Hidden("GPUJobs of all namespaces", f"list gpujobs.{GROUP} (cluster)"))
        if refused:
            out.hidden.append(
                Hidden(f"GPUJobs in {', '.join(refused)}", f"list gpujobs.{GROUP} there")
            )
        return out

    async def job(self, namespace: str, name: str) -> JobRead:
        """One GPUJob and its Events (newest :data:`MAX_EVENTS`), as far as readable."""
        try:
            job = await self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "gpujobs", name
            )
        except ApiException as exc:
            if exc.status in (401, 403, 404):
                return JobRead(None, status=404 if exc.status == 404 else 403)
            raise HubReadError(f"reading gpujob {namespace}/{name}: {_message(exc)}") from exc
        read = JobRead(job)
        selector = f"involvedObject.kind=GPUJob,involvedObject.name={name}"
        try:
            resp = await self._core.list_namespaced_event(namespace, field_selector=selector)
            body = self._api.sanitize_for_serialization(resp)
            events = [
                e
                for e in body.get("items") or []
                if (e.get("involvedObject") or {}).get("uid") in (None, job["metadata"].get("uid"))
            ]
            read.events = events[-MAX_EVENTS:]
        except ApiException as exc:
            if exc.status not in (401, 403):
                raise HubReadError(f"listing Events in {namespace}: {_message(exc)}") from exc
            read.hidden.append(Hidden(f"Events in {namespace}", "list events (core) there"))
        return read

    # --- the hub's blocks endpoint ----------------------------------------------------------

    def _bearer(self) -> str | None:
        cfg = self._api.configuration
        value = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        if not value:
            return None
        return value if str(value).lower().startswith("bearer ") else f"Bearer {value}"

    async def blocks(
        self, members: Iterable[str]
    ) -> tuple[dict[str, dict[str, Any]], list[Hidden]]:
        """Each member's NVLink blocks from the hub (member -> the hub's JSON answer, see
        :func:`gpufed.hub.rules.blocks.member_blocks`), and notes for what was not had: no
        ``hub_url``, no bearer token, refused (401/403), or the hub not answering. Never
        raises for the hub's or the network's failures: the fleet page then shows totals."""
        names = list(members)
        if self.hub_url is None or not names:
            return {}, []
        bearer = self._bearer()
        if bearer is None:
            return {}, [
                Hidden(
                    "NVLink blocks (your kubeconfig user has no bearer token)",
                    "a token user (the hub authenticates callers with a TokenReview)",
                )
            ]
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=BLOCKS_TIMEOUT_S)
            )
        http = self._http
        gate = asyncio.Semaphore(BLOCKS_CONCURRENCY)
        out: dict[str, dict[str, Any]] = {}
        refused: list[str] = []
        failed: list[str] = []

        async def one(name: str) -> None:
            url = f"{self.hub_url}/fleet/members/{name}/blocks"
            async with gate:
                try:
                    async with http.get(url, headers={"Authorization": bearer}) as resp:
                        if resp.status in (401, 403):
                            refused.append(name)
                            return
                        body = await _read_bounded(resp, MAX_BLOCKS_BYTES)
                        if resp.status != 200 or body is None:
                            failed.append(f"{name} ({resp.status})")
                        else:
                            out[name] = json.loads(body)
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    failed.append(f"{name} ({type(exc).__name__})")

        await asyncio.gather(*(one(n) for n in names))
        hidden = []
        if refused:
            hidden.append(
                Hidden(
                    f"NVLink blocks of {', '.join(sorted(refused))}",
                    f"get memberclusters.{GROUP} (the hub asks the hub cluster)",
                )
            )
        if failed:
            hidden.append(
                Hidden(
                    f"NVLink blocks of {', '.join(sorted(failed))}: the hub at {self.hub_url} "
                    "did not answer",
                    "a leader hub reachable at --hub-url",
                )
            )
        return out, hidden


async def _read_bounded(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body, or None once it grows past ``limit`` bytes (the rest is not read)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
