"""Any namespaced resource of the hub cluster (plain workloads and the GPUJobs made for them):
list in pages, watch, get, create, delete with a uid precondition, and status replace.

:class:`ResourceAPI` is a part of :class:`gpufed.hub.adapters.kube.KubeAPI` (split out of
``kube.py``, no behaviour change), used by :mod:`gpufed.hub.components.managed`. Calls retry
transient errors through :func:`gpufed.sync.retry.kube_retry`, except create and the status
replace (one attempt each, see each method); 409 and other 4xx surface to the caller.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpufed.hub.adapters.kubewire import (
    JSON_PATCH,
    check_and_read,
    check_and_release,
    get_or_none,
    read_json,
    resource_version_of,
    status_replacement,
    watch_events,
)
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.sync.retry import kube_retry

#: Objects per page of a list (``limit``/``continue``).
LIST_PAGE = 500


class ResourceAPI:
    """Generic calls on namespaced objects through the client's ``CustomObjectsApi``
    (``custom``, set by :class:`gpufed.hub.adapters.kube.KubeAPI`)."""

    custom: client.CustomObjectsApi

    async def list_resource(
        self, group: str, version: str, plural: str, *, label_selector: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object of ``group/version`` ``plural`` in all namespaces (``batch``, ``v1``,
        ``jobs``), matching ``label_selector``, and the list's resourceVersion. Read in pages of
        :data:`LIST_PAGE` (the API server serves every page at the first one's
        resourceVersion), so no single answer holds the whole collection. Raises
        ``ApiException`` 404 when the API server does not serve the resource (no CRD), 403
        without the RBAC rule (neither is retried), 410 when the continue token expired (the
        caller lists again)."""
        items: list[dict[str, Any]] = []
        token = ""
        rv = ""
        while True:
            page: dict[str, Any] = {"_continue": token} if token else {}
            async for attempt in kube_retry():
                with attempt:
                    resp = await read_json(
                        await self.custom.list_cluster_custom_object(
                            group,
                            version,
                            plural,
                            label_selector=label_selector,
                            limit=LIST_PAGE,
                            _preload_content=False,
                            **page,
                        )
                    )
            items.extend(resp.get("items") or [])
            meta = resp.get("metadata") or {}
            rv = rv or str(meta["resourceVersion"])
            token = str(meta.get("continue") or "")
            if not token:
                return items, rv

    def watch_resource(
        self,
        group: str,
        version: str,
        plural: str,
        resource_version: str,
        *,
        label_selector: str = "",
        timeout_s: int = 300,
    ) -> AsyncIterator[WatchEvent | str]:
        """Changes of what :meth:`list_resource` lists, as :meth:`gpufed.hub.adapters.kube.KubeAPI.watch_objects`."""
        return watch_events(
            self.custom.list_cluster_custom_object,
            group,
            version,
            plural,
            label_selector=label_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
        )

    async def get_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> dict[str, Any] | None:
        """One namespaced object, or None when it does not exist."""
        return await get_or_none(
            lambda: self.custom.get_namespaced_custom_object(
                group, version, namespace, plural, name
            )
        )

    async def create_object(
        self, group: str, version: str, namespace: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """Create ``body`` in ``namespace``; returns the object created. Raises
        ``ApiException`` (409 when the name is taken). Not retried: a create whose reply was
        lost would be refused as taken, and the caller reads again."""
        return await read_json(
            await self.custom.create_namespaced_custom_object(
                group, version, namespace, plural, body, _preload_content=False
            )
        )

    async def delete_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, uid: str
    ) -> bool:
        """Delete ``namespace/name`` if its uid is still ``uid`` (a precondition: an object
        created again under the name is never deleted by mistake). False when it was gone
        already; ``ApiException`` 409 when the uid differs."""
        body: Any = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            async for attempt in kube_retry():
                with attempt:
                    await check_and_release(
                        await self.custom.delete_namespaced_custom_object(
                            group,
                            version,
                            namespace,
                            plural,
                            name,
                            body=body,
                            _preload_content=False,
                        )
                    )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def replace_status(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        status: dict[str, Any],
        resource_version: str,
    ) -> str:
        """Replace ``status`` of one namespaced object (a JSON patch ``add /status`` on the
        status subresource, as :meth:`gpufed.hub.adapters.kube.KubeAPI.patch_member_status`) if it is still at
        ``resource_version``; returns its new resourceVersion. ``ApiException`` 409 when it
        changed, 422 when the API server refuses the status. One attempt."""
        resp: Any = await self.custom.patch_namespaced_custom_object_status(
            group,
            version,
            namespace,
            plural,
            name,
            status_replacement(status, resource_version),
            _content_type=JSON_PATCH,  # type: ignore[call-arg]
            _preload_content=False,
        )
        return resource_version_of(await check_and_read(resp))
