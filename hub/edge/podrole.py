"""The replica's role on its own Pod: the ``gpufed.io/hub-role`` label, ``leader`` or ``standby``.

Called by the hub process (:mod:`gpufed.hub.edge.app`): ``standby`` at start and whenever a leader
term ends, ``leader`` once elected. The hub Service selects ``gpufed.io/hub-role: leader``
(``manifests/hub/deployment.yaml``), so agents reach the leader whichever replica is Ready,
and every replica can answer ``/readyz`` 200 (a two-replica Deployment's rollout completes, a
PodDisruptionBudget counts both). The pattern is CloudNativePG's and Patroni's (the primary
labels itself, a Service selects the label).

Best effort, never a safety rule: a failed patch is logged (``hub.pod_role.failed``) and
retried every ``retry_s`` until it lands; a replica whose stale ``leader`` label survives
(killed before relabelling) answers agents UNAVAILABLE as every standby does, and they dial
again through the Service. Without a Pod (``--pod-name`` unset: the sandbox, a laptop) nothing
is labelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Literal, Protocol

import structlog

from gpufed.api.labels import HUB_ROLE_LABEL

log = structlog.get_logger("gpufed.hub.edge.podrole")

Role = Literal["leader", "standby"]


class PodLabeller(Protocol):
    """The one call this module needs (:meth:`gpufed.hub.adapters.kube.KubeAPI.label_pod`)."""

    async def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None: ...


class PodRole:
    """Keeps ``gpufed.io/hub-role`` of Pod ``namespace/name`` at the role last asked for.

    :meth:`set` records the wanted role and returns at once; a background task (started by
    :meth:`start`, ended by :meth:`stop`) patches the Pod, retrying every ``retry_s`` seconds.
    :attr:`applied` is the role the Pod was last labelled with (None: not yet).
    """

    def __init__(
        self, kube: PodLabeller, namespace: str, name: str, *, retry_s: float = 5.0
    ) -> None:
        self._kube = kube
        self.namespace, self.name = namespace, name
        self._retry_s = retry_s
        self._wanted: Role = "standby"
        self.applied: Role | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def set(self, role: Role) -> None:
        """Ask for ``role`` (patched soon, in the background)."""
        self._wanted = role
        self._changed.set()

    def start(self) -> None:
        self._changed.set()
        self._task = asyncio.create_task(self._run())

    async def stop(self, *, final: Role | None = "standby") -> None:
        """End the background task; label ``final`` once more first (None: leave the label)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if final is not None and self.applied != final:
            await self._apply(final)

    async def _run(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            role = self._wanted
            if role != self.applied and not await self._apply(role):
                await asyncio.sleep(self._retry_s)
                self._changed.set()

    async def _apply(self, role: Role) -> bool:
        try:
            await self._kube.label_pod(self.namespace, self.name, {HUB_ROLE_LABEL: role})
        except Exception as exc:
            log.warning(
                "hub.pod_role.failed",
                pod=f"{self.namespace}/{self.name}",
                role=role,
                error=str(exc)[:300],
            )
            return False
        self.applied = role
        log.info("hub.pod_role.labelled", pod=f"{self.namespace}/{self.name}", role=role)
        return True
