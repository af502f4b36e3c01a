"""The agent's one door to its member API server (the only module importing the client).

Owns authentication and TLS (kubeconfig or in-cluster service account, through
``kubernetes_asyncio``), raw JSON requests, paginated lists, watch streams, API discovery (the
REST mapping of a manifest's ``apiVersion``/``kind`` and the workload kinds the member serves)
and the :class:`gpufed.sync.apply.ObjectClient` implementation the apply strategies use.

Objects travel as plain dicts parsed straight from the response bytes: the generated model
classes are never built, which keeps CPU and memory low with tens of thousands of pods. Errors
are the client's ``ApiException`` (``status``, ``reason``, ``body``, ``headers``), which
:mod:`gpufed.sync.retry` classifies by shape; nothing here retries.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from gpufed.api.errors import PermanentError
from gpufed.api.kubeconfig import resolve_kubeconfig
from gpufed.sync.apply import ObjectRef, ref_of
from gpufed.sync.grants import GRANT_SELECTOR, RBAC_API_VERSION, is_grant
from gpufed.sync.manifests import WORKLOAD_KINDS

__all__ = ["ApiException", "KindNotServedError", "MemberApi", "ResourceInfo"]

_JSON = "application/json"
_APPLY_PATCH = "application/apply-patch+yaml"


def _api_error(resp: aiohttp.ClientResponse, data: bytes) -> ApiException:
    """The client's ``ApiException`` for a non-2xx response (status, reason, body, headers)."""
    exc = ApiException(status=resp.status, reason=resp.reason)
    exc.body = data
    exc.headers = resp.headers
    return exc


class KindNotServedError(PermanentError, LookupError):
    """The member's API does not serve this ``apiVersion``/``kind`` (CRD not installed)."""


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """REST mapping of one kind: ``/api[s]/<group_version>/[namespaces/<ns>/]<plural>``."""

    group_version: str
    kind: str
    plural: str
    namespaced: bool

    def collection_path(self, namespace: str | None = None) -> str:
        """List/create path; all namespaces when ``namespace`` is None."""
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        if self.namespaced and namespace:
            return f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{base}/{self.plural}"

    def object_path(self, namespace: str, name: str) -> str:
        return f"{self.collection_path(namespace)}/{name}"


class MemberApi:
    """Raw JSON access to one member API server.

    Build with :meth:`connect`; close with :meth:`close` (or ``async with``).
    """

    def __init__(self, api_client: k8s.ApiClient, *, server: str) -> None:
        self._client = api_client
        self.server = server
        self._resources: dict[str, dict[str, ResourceInfo]] = {}  # groupVersion -> kind -> info
        self._groups: dict[str, list[str]] | None = None  # group -> versions, preferred first

    @classmethod
    async def connect(
        cls, *, kubeconfig: str | None = None, context: str | None = None
    ) -> MemberApi:
        """Load credentials as kubectl does (:func:`gpufed.api.kubeconfig.resolve_kubeconfig`):
        ``kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``, else the in-cluster
        service account (``KUBERNETES_SERVICE_HOST`` and the mounted token); ``context``.

        Raises ``KubeconfigError`` (a ``ValueError``) with the fix when none is available.
        """
        cfg = k8s.Configuration()
        source = resolve_kubeconfig(kubeconfig, context)
        if source.path is None:
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            await k8s_config.load_kube_config(
                config_file=str(source.path),
                context=source.context,
                client_configuration=cfg,
                persist_config=False,
            )
        return cls(k8s.ApiClient(configuration=cfg), server=str(cfg.host))

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> MemberApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- raw requests ------------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = _JSON,
        request_timeout: aiohttp.ClientTimeout | float | None = 60.0,
    ) -> aiohttp.ClientResponse:
        resp: aiohttp.ClientResponse = await self._client.call_api(
            path,
            method,
            query_params=list(query),
            header_params={"Content-Type": content_type, "Accept": _JSON},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=request_timeout,
        )
        return resp

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = _JSON,
    ) -> dict[str, Any]:
        """One request; the decoded JSON body. Raises ``ApiException`` on a non-2xx status."""
        resp = await self._send(method, path, query=query, body=body, content_type=content_type)
        try:
            data = await resp.read()
        finally:
            resp.release()
        if not 200 <= resp.status < 300:
            raise _api_error(resp, data)
        parsed = json.loads(data) if data else {}
        return parsed if isinstance(parsed, dict) else {}

    async def list_pages(
        self,
        path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        """Pages of a consistent list (``limit``/``continue``): (items, resourceVersion).

        The resourceVersion of the last page is where a watch continues.
        """
        token = ""
        while True:
            query = [("limit", str(limit))]
            if label_selector:
                query.append(("labelSelector", label_selector))
            if field_selector:
                query.append(("fieldSelector", field_selector))
            if token:
                query.append(("continue", token))
            page = await self.request("GET", path, query=query)
            meta = page.get("metadata") or {}
            yield page.get("items") or [], str(meta.get("resourceVersion", ""))
            token = str(meta.get("continue") or "")
            if not token:
                return

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events (``{"type", "object"}``) from ``resource_version``, with bookmarks.

        Ends normally when the server closes the watch (``timeoutSeconds``). An ``ERROR``
        event (410 Gone when the version is too old) raises ``ApiException`` with its code.
        """
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=15, sock_read=timeout_seconds + 60)
        resp = await self._send("GET", path, query=query, request_timeout=timeout)
        try:
            if resp.status != 200:
                raise _api_error(resp, await resp.read())
            async for line in resp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    obj = event.get("object") or {}
                    exc = ApiException(status=int(obj.get("code") or 500), reason=obj.get("reason"))
                    exc.body = json.dumps(obj).encode()
                    raise exc
                yield event
        finally:
            resp.release()

    # --- discovery ---------------------------------------------------------------------------

    async def _group_versions(self) -> dict[str, list[str]]:
        if self._groups is None:
            groups: dict[str, list[str]] = {"": ["v1"]}
            listing = await self.request("GET", "/apis")
            for g in listing.get("groups") or []:
                preferred = (g.get("preferredVersion") or {}).get("version")
                versions = [v.get("version") for v in g.get("versions") or [] if v.get("version")]
                versions.sort(key=lambda v: v != preferred)
                groups[str(g.get("name"))] = versions
            self._groups = groups
        return self._groups

    async def _resources_of(self, group_version: str) -> dict[str, ResourceInfo]:
        if group_version not in self._resources:
            path = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
            try:
                listing = await self.request("GET", path)
            except ApiException as exc:
                if exc.status == 404:
                    self._resources[group_version] = {}
                    return {}
                raise
            infos: dict[str, ResourceInfo] = {}
            for r in listing.get("resources") or []:
                name = str(r.get("name", ""))
                if "/" in name:  # subresource (jobs/status)
                    continue
                kind = str(r.get("kind", ""))
                infos.setdefault(
                    kind,
                    ResourceInfo(
                        group_version=group_version,
                        kind=kind,
                        plural=name,
                        namespaced=bool(r.get("namespaced")),
                    ),
                )
            self._resources[group_version] = infos
        return self._resources[group_version]

    async def resources_of(self, group_version: str) -> dict[str, ResourceInfo]:
        """The kinds a group version serves (``resource.k8s.io/v1``), by kind; empty when the
        member does not serve the version. Cached until :meth:`forget_discovery`."""
        return await self._resources_of(group_version)

    def forget_discovery(self) -> None:
        """Drop cached discovery (CRDs may have been installed or removed)."""
        self._resources.clear()
        self._groups = None

    async def resource_for(self, api_version: str, kind: str) -> ResourceInfo:
        """REST mapping of ``apiVersion``/``kind``; raises :class:`KindNotServedError`.

        A miss refreshes discovery once (a CRD installed after the agent started).
        """
        for attempt in range(2):
            info = (await self._resources_of(api_version)).get(kind)
            if info is not None:
                return info
            if attempt == 0:
                self._resources.pop(api_version, None)
        raise KindNotServedError(
            f"{kind} in {api_version} is not served by this member's API server"
        )

    async def resource_for_kind_group(self, kind_group: str) -> ResourceInfo | None:
        """REST mapping of a ``Kind.group`` in the group's preferred served version, or None
        when the member does not serve it."""
        kind, _, group = kind_group.partition(".")
        versions = (await self._group_versions()).get(group)
        for version in versions or []:
            gv = f"{group}/{version}" if group else version
            info = (await self._resources_of(gv)).get(kind)
            if info is not None:
                return info
        return None

    async def served_kinds(self, candidates: Iterable[str]) -> list[str]:
        """Which of the ``Kind.group`` ``candidates`` the member serves (fresh discovery)."""
        self.forget_discovery()
        return sorted([c for c in candidates if await self.resource_for_kind_group(c)])

    # --- ObjectClient (gpufed.sync.apply) ----------------------------------------------------

    async def _path(self, ref: ObjectRef) -> str:
        info = await self.resource_for(ref.api_version, ref.kind)
        if not info.namespaced:
            raise KindNotServedError(
                f"{ref.kind_group} is cluster-scoped; gpufed applies namespaced kinds only"
            )
        return info.object_path(ref.namespace, ref.name)

    async def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        try:
            return await self.request("GET", await self._path(ref))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        ref = ref_of(obj)
        info = await self.resource_for(ref.api_version, ref.kind)
        return await self.request(
            "POST",
            info.collection_path(ref.namespace),
            query=[("fieldManager", "gpufed")],
            body=dict(obj),
        )

    async def apply(
        self, obj: Mapping[str, Any], *, field_manager: str, force: bool
    ) -> dict[str, Any]:
        query = [("fieldManager", field_manager)]
        if force:
            query.append(("force", "true"))
        return await self.request(
            "PATCH",
            await self._path(ref_of(obj)),
            query=query,
            body=dict(obj),
            content_type=_APPLY_PATCH,
        )

    async def delete(self, ref: ObjectRef, *, propagation: str, uid: str | None = None) -> bool:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": propagation,
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", await self._path(ref), body=body)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # --- stranded pods (gpufed.agent.stranded.PodClient) ---------------------------------------

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The pods of ``namespace`` matching ``label_selector`` (paginated)."""
        out: list[dict[str, Any]] = []
        async for items, _ in self.list_pages(
            f"/api/v1/namespaces/{namespace}/pods", label_selector=label_selector
        ):
            out.extend(items)
        return out

    async def node_exists(self, name: str) -> bool:
        """Whether the Node ``name`` exists: only a 404 is False; other errors raise."""
        try:
            await self.request("GET", f"/api/v1/nodes/{name}")
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def force_delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Delete a pod at once (``gracePeriodSeconds: 0``) if its uid is still ``uid``; False
        when it is gone (404) or is another pod by now (409: the uid precondition failed)."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid},
        }
        try:
            await self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=body)
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def get_namespace(self, name: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", f"/api/v1/namespaces/{name}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def create_namespace(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request(
            "POST", "/api/v1/namespaces", query=[("fieldManager", "gpufed")], body=dict(obj)
        )

    async def allowed(self, verb: str, resource: str, namespace: str) -> bool:
        """A SelfSubjectAccessReview: may this client ``verb`` core ``resource`` in
        ``namespace`` now (the authorizer's answer, RBAC cache included)."""
        review = await self.request(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {
                    "resourceAttributes": {
                        "verb": verb,
                        "resource": resource,
                        "namespace": namespace,
                    }
                },
            },
        )
        return bool((review.get("status") or {}).get("allowed"))

    async def list_labelled(
        self, kinds: Iterable[str], label_selector: str
    ) -> list[dict[str, Any]]:
        """Objects of the given ``Kind.group`` s matching ``label_selector``; kinds the member
        does not serve are skipped.

        The workload kinds (Jobs, JobSets, PyTorchJobs: the agent's ClusterRole reads them
        everywhere, for status) are listed in all namespaces; every other kind (Secrets,
        ConfigMaps, Services) only in the namespaces that hold an agent grant
        (:meth:`granted_namespaces`), the only ones where the agent may read them and the only
        ones where it can have created them.
        """
        out: list[dict[str, Any]] = []
        granted: list[str] | None = None
        for kind in sorted(kinds):
            info = await self.resource_for_kind_group(kind)
            if info is None or not info.namespaced:
                continue
            if kind in WORKLOAD_KINDS:
                out.extend(await self.list_all(info, label_selector=label_selector))
                continue
            if granted is None:
                granted = await self.granted_namespaces()
            for namespace in granted:
                out.extend(
                    await self.list_all(info, label_selector=label_selector, namespace=namespace)
                )
        return out

    async def granted_namespaces(self) -> list[str]:
        """The namespaces holding a gpufed agent grant (a RoleBinding labelled
        ``app.kubernetes.io/managed-by=gpufed-agent`` that binds ``gpufed-agent-workload`` to
        the agent's ServiceAccount: :func:`gpufed.sync.grants.is_grant`), sorted; one
        cluster-wide list of RoleBindings by label. Grants of every origin count: each gives
        this agent's account the same rights, and the caller's selector picks the origin."""
        info = ResourceInfo(RBAC_API_VERSION, "RoleBinding", "rolebindings", namespaced=True)
        found = {
            str((rb.get("metadata") or {}).get("namespace") or "")
            for rb in await self.list_all(info, label_selector=GRANT_SELECTOR)
            if is_grant(rb)
        }
        return sorted(found - {""})

    async def list_all(
        self,
        info: ResourceInfo,
        *,
        label_selector: str | None = None,
        namespace: str | None = None,
    ) -> list[dict[str, Any]]:
        """Every object of one resource in ``namespace`` (all namespaces when None;
        paginated), with ``apiVersion`` and ``kind`` set."""
        out: list[dict[str, Any]] = []
        async for items, _ in self.list_pages(
            info.collection_path(namespace), label_selector=label_selector
        ):
            for item in items:  # list items of built-in kinds carry no apiVersion/kind
                item.setdefault("apiVersion", info.group_version)
                item.setdefault("kind", info.kind)
                out.append(item)
        return out
