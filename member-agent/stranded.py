"""Stranded pods: a deleted copy's pods bound to a Node that no longer exists in the member.

Called by the work manager (:mod:`gpufed.agent.work`) when it deletes a copy for the hub (a
Delete work item: re-run, preemption, deletion), after the copy's objects are deleted and
before ``Deleted`` is acked. A pod whose Node object is gone has no kubelet that the API server
knows: nothing will ever stop it or confirm its end, so it stays (``Running``, or
``Terminating`` once the garbage collector asked) until the member's pod GC force-deletes it,
about 40 s after the node went. Meanwhile it holds its name, and an operator that names its
pods after the job (the training-operator's ``<job>-worker-0``) cannot create the re-run's pod
of that name in the same member (``object is being deleted: pods "<job>-worker-0" already
exists``); it retries for ~20 s and gives up, and the PyTorchJob succeeds on its Master alone.
So the agent force-deletes those pods itself (``gracePeriodSeconds: 0``): the pod GC's own rule
for pods on nonexistent nodes, without its 40 s quarantine, which only covers its lagging node
cache (the agent reads each node from the API server: only a 404 counts as gone).

Only pods this copy owns are touched (:func:`stranded_pods`): pods labelled with this hub's
origin and this job's UID (the labels gpufed puts on the copy's pod templates) and made by a
controller (a controller ``ownerReference``: the operator or Job controller that made them from
those templates). Each delete carries the listed pod's ``uid`` as a precondition, so a newer pod
of the same name is never deleted. Docs: docs/agent.md "Real workload operators".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from gpufed.sync.ownership import Holder, Owner, holder_of


class PodClient(Protocol):
    """What finding and force-deleting stranded pods needs of the member API (``MemberApi``)."""

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """The pods of ``namespace`` matching ``label_selector``."""
        ...

    async def node_exists(self, name: str) -> bool:
        """Whether the Node object ``name`` exists (read from the API server: 404 is False)."""
        ...

    async def force_delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Delete the pod with ``gracePeriodSeconds: 0`` if its uid is still ``uid``; False when
        it is gone already (404) or is another pod by now (409 on the uid precondition)."""
        ...


def node_of(pod: Mapping[str, Any]) -> str:
    """The node a pod is bound to (``spec.nodeName``; "" when not scheduled)."""
    spec = pod.get("spec")
    return str(spec.get("nodeName") or "") if isinstance(spec, Mapping) else ""


def made_for(pod: Mapping[str, Any], owner: Owner) -> bool:
    """Whether ``pod`` is one of ``owner``'s copy: it carries the job's ownership labels (this
    origin and job UID) and was made by a controller (a controller ownerReference), i.e. from
    the copy's labelled pod templates. A bare pod someone labelled by hand is not."""
    if holder_of(pod, owner) is not Holder.THIS_JOB:
        return False
    meta = pod.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    return isinstance(refs, list) and any(
        isinstance(r, Mapping) and r.get("controller") is True and r.get("uid") for r in refs
    )


def stranded_pods(
    pods: Iterable[Mapping[str, Any]], owner: Owner, *, gone_nodes: Iterable[str]
) -> list[Mapping[str, Any]]:
    """The pods of ``owner``'s copy (:func:`made_for`) bound to one of ``gone_nodes`` (Nodes
    the API server answered 404 for), in the order given."""
    gone = set(gone_nodes) - {""}
    return [p for p in pods if made_for(p, owner) and node_of(p) in gone]


async def force_delete_stranded(client: PodClient, namespace: str, owner: Owner) -> list[str]:
    """Force-delete ``owner``'s pods in ``namespace`` that are bound to a Node that no longer
    exists; returns the names of the pods deleted. API errors propagate (the caller logs them:
    the member's pod GC removes such pods later anyway)."""
    pods = [p for p in await client.list_pods(namespace, owner.selector) if made_for(p, owner)]
    gone = [n for n in sorted({node_of(p) for p in pods} - {""}) if not await client.node_exists(n)]
    deleted: list[str] = []
    for pod in stranded_pods(pods, owner, gone_nodes=gone):
        meta = pod.get("metadata") or {}
        name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
        if name and uid and await client.force_delete_pod(namespace, name, uid):
            deleted.append(name)
    return deleted
