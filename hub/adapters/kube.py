"""The hub cluster's API server: with :mod:`.kuberesources` and :mod:`.kubewire`, the only hub
modules that import a Kubernetes client.

Implements :class:`gpufed.hub.adapters.ports.HubAPI` for the leader's components: intake (list+watch
of GPUJobs, MemberClusters, GPUQueues, Namespaces and PriorityClasses), plain workloads and the
GPUJobs made for them (any namespaced resource: list+watch, get, create, delete with a uid
precondition, status replace: :class:`gpufed.hub.adapters.kuberesources.ResourceAPI`, a part of
:class:`KubeAPI`), status writes (with a resourceVersion precondition), finalizers, Events and the list+watch of join-token Secrets; and, for the hub's
HTTP endpoints that serve people (``hub/edge/http.py``), who presents a bearer token and whether
the hub cluster's RBAC lets them read something (:meth:`KubeAPI.review_access`).
Objects cross this edge as plain dicts (the JSON form); callers validate them into
:mod:`gpufed.api.gpujob` / :mod:`gpufed.api.membercluster` models. Calls retry transient errors through :func:`gpufed.sync.retry.kube_retry` (the one
retry policy), except status writes, whose one retry layer is the coalescing writer; 409 and
other 4xx surface to the caller.

Config resolution is kubectl's (:func:`gpufed.api.kubeconfig.resolve_kubeconfig`, the one rule
every gpufed command uses): ``--kubeconfig``, else ``$KUBECONFIG`` (the first file with the
context), else ``~/.kube/config``, else in a pod the in-cluster service account; ``--context``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from gpufed.api.kubeconfig import resolve_kubeconfig
from gpufed.api.labels import GROUP, VERSION
from gpufed.hub.adapters.kuberesources import ResourceAPI
from gpufed.hub.adapters.kubewire import (
    JSON_PATCH,
    check_and_read,
    check_and_release,
    deep_decoding,
    get_or_none,
    read_json,
    resource_version_of,
    status_replacement,
    watch_events,
)
from gpufed.hub.adapters.ownwrites import OwnWrites
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.sync.retry import kube_retry

log = structlog.get_logger("gpufed.hub.adapters.kube")

MERGE_PATCH = "application/merge-patch+json"
#: The parts of a GPUJob the hub writes apart (:class:`gpufed.hub.adapters.ownwrites.OwnWrites`).
STATUS, FINALIZERS = "status", "finalizers"
#: The core resources intake lists and watches besides the gpufed ones.
NAMESPACES = "namespaces"
PRIORITYCLASSES = "priorityclasses"


class KubeAPI(ResourceAPI):
    """Async access to the hub cluster (one ``ApiClient``; close with :meth:`close`); the
    calls on any namespaced resource are :class:`~gpufed.hub.adapters.kuberesources.ResourceAPI`'s."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._api = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)
        self.authn = client.AuthenticationV1Api(api_client)
        self.authz = client.AuthorizationV1Api(api_client)
        #: this client's own GPUJob writes: their preconditions skip over each other
        self.own = OwnWrites()

    @classmethod
    async def connect(cls, kubeconfig: Path | None = None, context: str | None = None) -> KubeAPI:
        """Load kubectl-style configuration and build the client (see module docstring)."""
        cfg = client.Configuration()
        source = resolve_kubeconfig(kubeconfig, context)
        if source.path is None:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            await config.load_kube_config(
                config_file=str(source.path),
                context=source.context,
                client_configuration=cfg,
                persist_config=False,
            )
        return cls(client.ApiClient(configuration=cfg))

    async def close(self) -> None:
        """Close the HTTP session."""
        await self._api.close()

    # --- list + watch -----------------------------------------------------------------------

    async def list_objects(self, plural: str) -> tuple[list[dict[str, Any]], str]:
        """Every object of a gpufed resource (all namespaces), or every Namespace /
        PriorityClass when ``plural`` is ``namespaces`` / ``priorityclasses``, and the list
        resourceVersion."""
        async for attempt in kube_retry():
            with attempt:
                if plural == NAMESPACES:
                    resp = await read_json(await self.core.list_namespace(_preload_content=False))
                elif plural == PRIORITYCLASSES:
                    resp = await read_json(
                        await self.scheduling.list_priority_class(_preload_content=False)
                    )
                else:
                    resp = await read_json(
                        await self.custom.list_cluster_custom_object(
                            GROUP,
                            VERSION,
                            plural,
                            _preload_content=False,
                        )
                    )
        items: list[dict[str, Any]] = resp.get("items") or []
        return items, str(resp["metadata"]["resourceVersion"])

    def watch_objects(
        self, plural: str, resource_version: str, *, timeout_s: int = 300
    ) -> AsyncIterator[WatchEvent | str]:
        """Changes since ``resource_version``; yields events and, for bookmarks, the new
        resourceVersion as a ``str``. Ends when the server closes the watch (about
        ``timeout_s``); raises ``ApiException`` 410 when ``resource_version`` is too old (the
        caller lists again: :attr:`gpufed.sync.retry.Verdict.GONE`)."""
        if plural in (NAMESPACES, PRIORITYCLASSES):
            return watch_events(
                self.core.list_namespace
                if plural == NAMESPACES
                else self.scheduling.list_priority_class,
                resource_version=resource_version,
                timeout_seconds=timeout_s,
            )
        return watch_events(
            self.custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            plural,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
        )

    # --- join-token Secrets -----------------------------------------------------------------

    async def list_secrets(
        self, namespace: str, label_selector: str
    ) -> tuple[list[dict[str, Any]], str]:
        """The Secrets of ``namespace`` that match ``label_selector`` (JSON form, values still
        base64) and the list's resourceVersion."""
        async for attempt in kube_retry():
            with attempt:
                # Raw JSON: the typed V1Secret models would be turned back into dicts anyway.
                resp: Any = await self.core.list_namespaced_secret(
                    namespace, label_selector=label_selector, _preload_content=False
                )
                body = json.loads(await check_and_read(resp))
        items: list[dict[str, Any]] = body.get("items") or []
        return items, str(body["metadata"]["resourceVersion"])

    def watch_secrets(
        self, namespace: str, resource_version: str, label_selector: str, *, timeout_s: int = 300
    ) -> AsyncIterator[WatchEvent | str]:
        """Changes of the matching Secrets since ``resource_version`` (as
        :meth:`watch_objects`; a Secret that loses the label arrives as DELETED)."""
        return watch_events(
            self.core.list_namespaced_secret,
            namespace,
            label_selector=label_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
        )

    # --- GPUJobs ----------------------------------------------------------------------------

    async def patch_job_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> str:
        """Merge-patch ``status`` of one GPUJob (``null`` values remove fields) if the object is
        still at ``resource_version``, or changed since only by this client's own writes (its
        finalizer patches and earlier status writes: :class:`~gpufed.hub.adapters.ownwrites.OwnWrites`;
        one write of a GPUJob at a time); returns its new resourceVersion.

        Raises ``ApiException`` 409 when anyone else changed it meanwhile (the caller re-reads:
        a status computed from an older view must not overwrite a newer one), 404 when it is
        gone. One attempt: status writes go through
        :class:`gpufed.hub.adapters.writer.CoalescingWriter`, which is their one retry layer (it
        writes the latest value again after a failure).
        """
        key = (namespace, name)
        async with self.own.serial(key):
            rv = self.own.rebase(key, resource_version, (STATUS, FINALIZERS))
            body = {"metadata": {"resourceVersion": rv}, "status": status}
            try:
                resp: Any = await self.custom.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    namespace,
                    "gpujobs",
                    name,
                    body,
                    _content_type=MERGE_PATCH,  # type: ignore[call-arg]
                    _preload_content=False,
                )
                new_rv = resource_version_of(await check_and_read(resp))
            except ApiException as exc:
                if exc.status == 404:
                    self.own.forget(key)
                raise
            self.own.record(key, STATUS, rv, new_rv)
        return new_rv

    async def set_job_finalizers(
        self, namespace: str, name: str, finalizers: list[str], resource_version: str
    ) -> dict[str, Any]:
        """Replace ``metadata.finalizers`` if the object is still at ``resource_version``, or
        changed since only by this client's own status writes (which leave the finalizers as
        they were; one write of a GPUJob at a time).

        Returns the updated object. Raises ``ApiException`` 409 when anything else changed it
        meanwhile (re-read and try again), 404 when it is gone.
        """
        key = (namespace, name)
        async with self.own.serial(key):
            rv = self.own.rebase(key, resource_version, (STATUS,))
            body = {"metadata": {"finalizers": finalizers, "resourceVersion": rv}}
            async for attempt in kube_retry():
                # the client decodes the reply inside the call: with deep_decoding
                with attempt, deep_decoding():
                    obj: dict[str, Any] = await self.custom.patch_namespaced_custom_object(
                        GROUP,
                        VERSION,
                        namespace,
                        "gpujobs",
                        name,
                        body,
                        _content_type=MERGE_PATCH,  # type: ignore[call-arg]
                    )
            self.own.record(
                key, FINALIZERS, rv, str(obj.get("metadata", {}).get("resourceVersion", ""))
            )
        return obj

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One GPUJob, or None when it does not exist."""
        return await get_or_none(
            lambda: self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "gpujobs", name
            )
        )

    # --- Namespaces -------------------------------------------------------------------------

    async def get_namespace(self, name: str) -> dict[str, Any] | None:
        """One Namespace as JSON, or None when it does not exist."""

        async def read() -> dict[str, Any]:
            return await read_json(await self.core.read_namespace(name, _preload_content=False))

        return await get_or_none(read)

    # --- MemberClusters ---------------------------------------------------------------------

    async def get_member(self, name: str) -> dict[str, Any] | None:
        """One MemberCluster, or None when it does not exist."""
        return await get_or_none(
            lambda: self.custom.get_cluster_custom_object(GROUP, VERSION, "memberclusters", name)
        )

    async def patch_member_status(
        self, name: str, status: dict[str, Any], resource_version: str
    ) -> str:
        """Replace ``status`` of one MemberCluster (a JSON patch ``add /status``) if it is still
        at ``resource_version``; returns its new resourceVersion (409 when it changed).

        Not a merge patch: the status holds maps keyed by GPU product (``gpusReserved`` …),
        and a merge patch never removes a key the new status no longer has (reserved GPUs
        would stay shown after their reservation ended). The precondition is the patch's
        ``replace /metadata/resourceVersion``, which the API server checks like an update's.
        One attempt, as for :meth:`patch_job_status`.
        """
        return await self._replace_cluster_status("memberclusters", name, status, resource_version)

    # --- GPUQueues --------------------------------------------------------------------------

    async def get_queue(self, name: str) -> dict[str, Any] | None:
        """One GPUQueue, or None when it does not exist."""
        return await get_or_none(
            lambda: self.custom.get_cluster_custom_object(GROUP, VERSION, "gpuqueues", name)
        )

    async def patch_queue_status(
        self, name: str, status: dict[str, Any], resource_version: str
    ) -> str:
        """Replace ``status`` of one GPUQueue if it is still at ``resource_version`` (as
        :meth:`patch_member_status`: ``usage`` rows of a key that is gone must go too)."""
        return await self._replace_cluster_status("gpuqueues", name, status, resource_version)

    async def _replace_cluster_status(
        self, plural: str, name: str, status: dict[str, Any], resource_version: str
    ) -> str:
        resp: Any = await self.custom.patch_cluster_custom_object_status(
            GROUP,
            VERSION,
            plural,
            name,
            status_replacement(status, resource_version),
            _content_type=JSON_PATCH,  # type: ignore[call-arg]
            _preload_content=False,
        )
        return resource_version_of(await check_and_read(resp))

    # --- the replica's own Pod ------------------------------------------------------------------

    async def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        """Merge ``labels`` into the metadata of Pod ``namespace/name`` (the replica's own Pod:
        :mod:`gpufed.hub.edge.podrole`). Retries transient errors; a 4xx (403 without the Role
        ``gpufed-hub-pod-role``, 404 outside a Pod) raises ``ApiException``."""
        body = {"metadata": {"labels": labels}}
        async for attempt in kube_retry(attempts=3):
            with attempt:
                await self.core.patch_namespaced_pod(
                    name,
                    namespace,
                    body,
                    _content_type=MERGE_PATCH,  # type: ignore[call-arg]
                )

    # --- Events -----------------------------------------------------------------------------

    async def emit_event(
        self, involved: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None:
        """Create a core/v1 Event about ``involved`` (apiVersion, kind, name, namespace, uid).

        Best effort: a failure is logged, never raised (events are for people, not state).
        """
        namespace = involved.get("namespace") or "default"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ref = {
            "apiVersion": involved.get("api_version"),
            "kind": involved.get("kind"),
            "name": involved.get("name"),
            "namespace": involved.get("namespace"),
            "uid": involved.get("uid"),
        }
        # Plain JSON in, raw response out: the typed models cost more CPU than the request
        # itself (the hub emits several Events per job).
        body: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": {k: v for k, v in ref.items() if v is not None},
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": "gpufed-hub"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": "gpufed-hub",
        }
        try:
            resp: Any = await self.core.create_namespaced_event(
                namespace, body, _preload_content=False
            )
            await check_and_release(resp)
        except (TimeoutError, ApiException, OSError) as exc:
            log.warning("hub.event.failed", reason=reason, error=str(exc))

    # --- callers of the hub's HTTP endpoints --------------------------------------------------

    async def review_access(
        self, token: str, attributes: dict[str, str]
    ) -> tuple[bool | None, str]:
        """Who presents ``token`` (a TokenReview) and whether the hub cluster's RBAC lets them
        do ``attributes`` (a SubjectAccessReview's ``resourceAttributes``: ``verb``,
        ``group``, ``resource``, ``name`` ...). Returns ``(True, username)``, ``(False,
        reason)`` when denied, ``(None, reason)`` when the token is not valid. Raises
        ``ApiException`` / ``OSError`` when the API server cannot answer (the hub's
        ServiceAccount needs ``create`` on tokenreviews and subjectaccessreviews)."""
        review: Any = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        got = await read_json(await self.authn.create_token_review(review, _preload_content=False))
        status = got.get("status") or {}
        if not status.get("authenticated"):
            return None, str(status.get("error") or "the token was not accepted")
        user = status.get("user") or {}
        sar: Any = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user.get("username", ""),
                "uid": user.get("uid", ""),
                "groups": user.get("groups") or [],
                "extra": user.get("extra") or {},
                "resourceAttributes": attributes,
            },
        }
        got = await read_json(
            await self.authz.create_subject_access_review(sar, _preload_content=False)
        )
        status = got.get("status") or {}
        if status.get("allowed"):
            return True, str(user.get("username", ""))
        return False, str(status.get("reason") or "RBAC allows no such access")
