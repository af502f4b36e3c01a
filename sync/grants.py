"""Workload grants: the RoleBinding that gives the agent its rights in one member namespace.

Owns the shape of the one RBAC object the agent writes (docs/agent.md "What the agent's token
can do"). The agent's cluster-wide ClusterRole (``manifests/agent/rbac.yaml``) reads Nodes, Pods,
Namespaces and the workload kinds, and may create RoleBindings and ``bind`` exactly the
ClusterRole :data:`WORKLOAD_ROLE`, which holds the rights on the kinds a work item carries
(Secrets, ConfigMaps, Services, Jobs …). In each namespace a job lands in,
:func:`gpufed.sync.apply.ensure_namespace` creates the RoleBinding :func:`grant_manifest`
describes, binding :data:`WORKLOAD_ROLE` to the agent's own ServiceAccount there and nowhere
else; the agent's reads of Secrets and ConfigMaps then iterate the namespaces holding such a
grant (:data:`GRANT_SELECTOR`), never all namespaces. Grants are never changed or deleted by
gpufed (they go with their namespace).

Pure: no I/O. Used by :mod:`gpufed.sync.apply` and the agent's member client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufed.api.labels import ORIGIN_LABEL
from gpufed.sync.manifests import label_value

#: The ClusterRole a grant binds (``manifests/agent/rbac.yaml``): the rights on the kinds the
#: agent applies; the agent's ``bind`` verb is restricted to exactly this name.
WORKLOAD_ROLE = "gpufed-agent-workload"
#: The agent's ServiceAccount (as in ``manifests/agent/``): the one subject of every grant.
AGENT_NAMESPACE = "gpufed-system"
AGENT_ACCOUNT = "gpufed-agent"
#: ``app.kubernetes.io/managed-by`` on every grant; with it, the selector of all grants.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpufed-agent"
GRANT_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
#: Namespaces where the agent never writes, grants included (the ones the
#: ValidatingAdmissionPolicy of ``manifests/agent/admission.yaml`` names).
RESERVED_NAMESPACES: frozenset[str] = frozenset(
    {"kube-system", "kube-public", "kube-node-lease", AGENT_NAMESPACE}
)
RBAC_API_VERSION = "rbac.authorization.k8s.io/v1"


def grant_name(origin: str) -> str:
    """The RoleBinding's name for a hub ``origin``: ``gpufed-agent-workload.<origin>`` (the
    origin as its label value, at most 63 characters)."""
    return f"{WORKLOAD_ROLE}.{label_value(origin)}"


def grant_manifest(namespace: str, origin: str) -> dict[str, Any]:
    """The RoleBinding binding :data:`WORKLOAD_ROLE` to ServiceAccount
    ``gpufed-system/gpufed-agent`` in ``namespace``, labelled with the hub ``origin``
    (``gpufed.io/origin``) and ``app.kubernetes.io/managed-by=gpufed-agent``."""
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "RoleBinding",
        "metadata": {
            "name": grant_name(origin),
            "namespace": namespace,
            "labels": {ORIGIN_LABEL: label_value(origin), MANAGED_BY_LABEL: MANAGED_BY},
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": WORKLOAD_ROLE,
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": AGENT_ACCOUNT, "namespace": AGENT_NAMESPACE}
        ],
    }


def is_grant(obj: Mapping[str, Any]) -> bool:
    """True when ``obj`` (a RoleBinding as read) is a gpufed grant: the managed-by label, the
    workload role and the agent's account as its only subject. Anything else of that name is
    someone else's and is left as it is."""
    meta = obj.get("metadata") or {}
    labels = (meta.get("labels") or {}) if isinstance(meta, Mapping) else {}
    want = grant_manifest("", "")
    return (
        isinstance(labels, Mapping)
        and labels.get(MANAGED_BY_LABEL) == MANAGED_BY
        and obj.get("roleRef") == want["roleRef"]
        and obj.get("subjects") == want["subjects"]
    )
