"""Where pods are pinned: the required node affinity that
:func:`gpufed.sync.manifests.pin_pod_template` writes, read back.

Owns reading the pins, for failure classification (:mod:`gpufed.sync.failure`) and the
agent's status caches (:mod:`gpufed.agent.status_watch`): the nodes an unbound pod is pinned
to by name (:func:`pinned_nodes`: a replacement pod pinned to a node that no longer exists
waits for ever), and where a workload object's own pod templates pin its pods
(:func:`template_pins`: a failed copy whose pods were collected is judged by it). A pod set
on one node is pinned by ``matchFields`` ``metadata.name In``; one on several nodes by
``kubernetes.io/hostname In`` (label values, which only the member's nodes map to names).
Pure: plain dicts as the API server returns them, no I/O; never raises on odd input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from gpufed.api.labels import HOSTNAME_LABEL

_FINISHED = frozenset({"Succeeded", "Failed"})


def pinned_nodes(pod: Mapping[str, Any]) -> frozenset[str]:
    """The nodes an unbound, unfinished pod is pinned to by name (``matchFields``
    ``metadata.name In``, as :func:`gpufed.sync.manifests.pin_pod_template` pins a one-node pod
    set); empty when it is bound or finished, or when any term of its required node affinity
    does not pin it by name (it may go elsewhere)."""
    spec = pod.get("spec")
    status = pod.get("status")
    if not isinstance(spec, Mapping) or spec.get("nodeName"):
        return frozenset()
    if isinstance(status, Mapping) and status.get("phase") in _FINISHED:
        return frozenset()
    return _terms_pin(_required_terms(spec), "matchFields", "metadata.name")


class Pins(NamedTuple):
    """Where a workload object's pod templates pin its pods (:func:`template_pins`): node
    ``names`` (``matchFields`` ``metadata.name In``: a one-node pod set) and ``hostnames``
    (``kubernetes.io/hostname In``: a several-node pod set, label values, which the caller
    maps to nodes)."""

    names: frozenset[str] = frozenset()
    hostnames: frozenset[str] = frozenset()


def template_pins(obj: Mapping[str, Any]) -> Pins:
    """Where a workload object's pod templates pin its pods, as
    :func:`gpufed.sync.manifests.pin_pod_template` pins them: every pod spec found under
    ``spec`` that has an ``affinity`` (any kind: a Job's ``spec.template.spec``, a JobSet's or
    a PyTorchJob's nested templates) whose required node affinity pins it in every term by node
    name (:func:`pinned_nodes`) or by hostname label. Bounded walk; never raises."""
    names: set[str] = set()
    hostnames: set[str] = set()
    stack: list[tuple[Any, int]] = [(obj.get("spec"), 0)]
    while stack:
        node, depth = stack.pop()
        if depth > 12:
            continue
        if isinstance(node, Mapping):
            if isinstance(node.get("affinity"), Mapping) and not node.get("nodeName"):
                names |= pinned_nodes({"spec": node})
                hostnames |= _terms_pin(_required_terms(node), "matchExpressions", HOSTNAME_LABEL)
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node[:64])
    return Pins(frozenset(names), frozenset(hostnames))


def _required_terms(pod_spec: Mapping[str, Any]) -> list[Any] | None:
    """The ``nodeSelectorTerms`` of a pod spec's required node affinity (None without)."""
    node: Any = pod_spec
    for key in ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"):
        node = node.get(key) if isinstance(node, Mapping) else None
    terms = node.get("nodeSelectorTerms") if isinstance(node, Mapping) else None
    return terms if isinstance(terms, list) else None


def _terms_pin(terms: list[Any] | None, where: str, key: str) -> frozenset[str]:
    """The values every term pins ``key`` to with ``In`` (in its ``where`` list), united;
    empty when some term does not pin it (the pod may go elsewhere)."""
    pinned: set[str] = set()
    for term in terms or []:
        reqs = term.get(where) if isinstance(term, Mapping) else None
        values = {
            str(v)
            for r in (reqs if isinstance(reqs, list) else [])
            if isinstance(r, Mapping)
            and r.get("key") == key
            and r.get("operator") == "In"
            and isinstance(r.get("values"), list)
            for v in r["values"]
        }
        if not values:
            return frozenset()
        pinned |= values
    return frozenset(pinned)
