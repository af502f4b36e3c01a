"""Codec between protocol messages (agent_pb2) and the pydantic models of gpufed.api.

The one adapter for the agent transport: the hub's servicer and the agent's stream client call
these functions at the edge and work with pydantic models everywhere else. Decoding validates:
a malformed message raises :class:`ProtocolError` with the field named, so the caller can close
that stream with a reason and keep everything already stored. A node is checked against the
reporting rules of :mod:`gpufed.api.inventory` (names, label syntax, amounts, counts), and the
counts before any map is copied out of the message.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

from pydantic import ValidationError

from gpufed.api.bounds import MAX_HELD_JOBS
from gpufed.api.errors import PermanentError
from gpufed.api.inventory import (
    MAX_AMOUNT,
    MAX_DEVICE_GROUPS,
    MAX_DEVICES_PER_NODE,
    MAX_GROUP_ATTRIBUTES,
    MAX_NODE_JOBS,
    MAX_NODE_LABELS,
    MAX_NODE_RESOURCES,
    MAX_NODE_TAINTS,
    DeviceGroup,
    NodeInventory,
    Taint,
    is_dns1123_subdomain,
    is_label_value,
    is_qualified_name,
)
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.resources import is_extended_resource
from gpufed.api.stream import AgentHello, HeldJob
from gpufed.api.work import (
    AckResult,
    Condition,
    FailureCause,
    PodIssue,
    WorkAck,
    WorkItem,
    WorkloadStatus,
)


class ProtocolError(PermanentError, ValueError):
    """A protocol message that cannot be decoded into a valid model (the message names why)."""


_OPS_TO_PB = {"Apply": pb.WorkItem.APPLY, "Delete": pb.WorkItem.DELETE}
_OPS_FROM_PB = {v: k for k, v in _OPS_TO_PB.items()}
_ACK_TO_PB: dict[AckResult, Any] = {
    "Applied": pb.WorkAck.APPLIED,
    "Deleted": pb.WorkAck.DELETED,
    "Failed": pb.WorkAck.FAILED,
}
_ACK_FROM_PB = {v: k for k, v in _ACK_TO_PB.items()}


# --- hello ---------------------------------------------------------------------------------------


def hello_from_pb(msg: pb.Hello) -> AgentHello:
    """Decode a Hello. :class:`ProtocolError` when it lists more than
    :data:`~gpufed.api.bounds.MAX_HELD_JOBS` held jobs (the other fields are plain strings
    and numbers: nothing to refuse)."""
    if len(msg.held_jobs) > MAX_HELD_JOBS:
        raise ProtocolError(
            f"hello: {len(msg.held_jobs)} held jobs, more than {MAX_HELD_JOBS}: "
            "an agent lists at most that many"
        )
    return AgentHello(
        cluster=msg.cluster,
        protocol_version=msg.protocol_version,
        agent_version=msg.agent_version,
        agent_instance=msg.agent_instance,
        served_kinds=tuple(msg.served_kinds),
        cluster_uid=msg.cluster_uid,
        held_jobs=tuple(
            HeldJob(
                job_uid=h.job_uid,
                hub_epoch=h.hub_epoch,
                kind=h.kind,
                name=h.name,
                namespace=h.namespace,
            )
            for h in msg.held_jobs
            if h.job_uid
        ),
    )


def held_job_to_pb(job: HeldJob) -> pb.HeldJob:
    """Encode one held job (the agent's Hello)."""
    return pb.HeldJob(
        job_uid=job.job_uid,
        hub_epoch=job.hub_epoch,
        kind=job.kind,
        name=job.name,
        namespace=job.namespace,
    )


# --- inventory -----------------------------------------------------------------------------------


def node_to_pb(node: NodeInventory) -> pb.Node:
    """Encode one :class:`NodeInventory`."""
    msg = pb.Node(
        name=node.name,
        labels=node.labels,
        gpu_product=node.gpu_product or "",
        mig_strategy=node.mig_strategy,
        nvlink_domain=node.nvlink_domain,
        rack=node.rack or "",
        block=node.block or "",
        ready=node.ready,
        unschedulable=node.unschedulable,
        taints=[pb.Taint(key=t.key, value=t.value, effect=t.effect) for t in node.taints],
        allocatable=node.allocatable,
        requested=node.requested,
        degraded=node.degraded or "",
    )
    for uid, amounts in node.job_requests.items():
        msg.job_requests[uid].amounts.update(amounts)
    for group in node.dra_gpus:
        g = msg.dra_gpus.add(count=group.count, allocated=group.allocated)
        for name, value in group.attributes.items():
            if isinstance(value, bool):
                g.attributes[name].bool = value
            elif isinstance(value, int):
                g.attributes[name].int = value
            else:
                g.attributes[name].string = value
        for name, version in group.versions.items():
            g.attributes[name].version = version
        g.capacity.update(group.capacity)
    return msg


def _group_from_pb(g: pb.DeviceGroup) -> DeviceGroup:
    attributes: dict[str, bool | int | str] = {}
    versions: dict[str, str] = {}
    for name, a in g.attributes.items():
        kind = a.WhichOneof("value")
        if kind == "version":
            versions[name] = a.version
        elif kind is not None:
            attributes[name] = getattr(a, kind)
    return DeviceGroup(
        count=g.count,
        allocated=g.allocated,
        attributes=attributes,
        versions=versions,
        capacity=dict(g.capacity),
    )


def node_from_pb(msg: pb.Node) -> NodeInventory:
    """Decode and validate one node; raises :class:`ProtocolError` naming the node and field
    (the reporting rules of :mod:`gpufed.api.inventory`)."""
    problem = _node_problem(msg)
    if problem is not None:
        raise ProtocolError(f"node {_quote(msg.name)}: {problem}")
    # Strings interned: every decoded node would otherwise hold its own copies of the same
    # GFD label keys and values, resource names and products (4.7 KB a node, 1.8 KB interned;
    # a hub holding 100 members x 5,000 nodes: `gpufed bench scale`). Their lengths and
    # counts are bounded by _node_problem, and interned strings are freed when unused.
    intern = sys.intern
    try:
        return NodeInventory(
            name=msg.name,
            labels={intern(k): intern(v) for k, v in msg.labels.items()},
            gpu_product=intern(msg.gpu_product) if msg.gpu_product else None,
            mig_strategy=msg.mig_strategy or "none",  # type: ignore[arg-type]
            nvlink_domain=intern(msg.nvlink_domain) if msg.nvlink_domain else f"node:{msg.name}",
            rack=intern(msg.rack) if msg.rack else None,
            block=intern(msg.block) if msg.block else None,
            ready=msg.ready,
            unschedulable=msg.unschedulable,
            taints=tuple(
                Taint(key=t.key, value=t.value, effect=t.effect)  # type: ignore[arg-type]
                for t in msg.taints
            ),
            allocatable={intern(k): v for k, v in msg.allocatable.items()},
            requested={intern(k): v for k, v in msg.requested.items()},
            job_requests={uid: dict(r.amounts) for uid, r in msg.job_requests.items()},
            degraded=msg.degraded or None,
            dra_gpus=tuple(_group_from_pb(g) for g in msg.dra_gpus),
        )
    except ValidationError as exc:
        raise ProtocolError(f"node {msg.name!r}: {_first_error(exc)}") from exc


# Label keys, resource names and most label values repeat across the nodes of one member (the
# same GFD keys on every node), so their checks are cached: this halves a snapshot part's decode.
# Bounded: 4096 entries each, of strings no longer than a valid key (317) or value (63).
@functools.lru_cache(maxsize=4096)
def _cached_qualified_name(key: str) -> bool:
    return is_qualified_name(key)


@functools.lru_cache(maxsize=4096)
def _cached_label_value(value: str) -> bool:
    return is_label_value(value)


def _qualified_name(key: str) -> bool:
    return len(key) <= 317 and _cached_qualified_name(key)


def _label_value(value: str) -> bool:
    return len(value) <= 63 and _cached_label_value(value)


def _node_problem(msg: pb.Node) -> str | None:
    """What is wrong with a reported node, or None. Counts first: nothing is copied before."""
    if not is_dns1123_subdomain(msg.name):
        return "name must be a DNS-1123 subdomain (lowercase a-z, 0-9, '-', '.'; 1-253 characters)"
    counts = (
        ("labels", len(msg.labels), MAX_NODE_LABELS),
        ("taints", len(msg.taints), MAX_NODE_TAINTS),
        ("allocatable", len(msg.allocatable), MAX_NODE_RESOURCES),
        ("requested", len(msg.requested), MAX_NODE_RESOURCES),
        ("job_requests", len(msg.job_requests), MAX_NODE_JOBS),
    )
    for name, n, limit in counts:
        if n > limit:
            return f"{name}: {n} entries, at most {limit} allowed"
    for key, value in msg.labels.items():
        if not _qualified_name(key):
            return f"labels: key {_quote(key)} is not a qualified name ([prefix/]name)"
        if not _label_value(value):
            return f"labels[{key}]: {_quote(value)} is not a valid label value"
    for i, t in enumerate(msg.taints):
        if not _qualified_name(t.key) or not _label_value(t.value):
            return f"taints[{i}]: key {_quote(t.key)} or value {_quote(t.value)} is not valid"
    for field, text in (("gpu_product", msg.gpu_product), ("rack", msg.rack), ("block", msg.block)):
        if not _label_value(text):
            return f"{field}: {_quote(text)} is not a valid label value"
    if len(msg.nvlink_domain) > 320 or len(msg.degraded) > 1024:
        return "nvlink_domain (320) or degraded (1024) is longer than allowed"
    maps = [("allocatable", msg.allocatable), ("requested", msg.requested)]
    for uid, r in msg.job_requests.items():
        if not 0 < len(uid) <= 128:
            return f"job_requests: key {_quote(uid)} is not a job UID"
        if len(r.amounts) > MAX_NODE_RESOURCES:
            return f"job_requests[{uid}]: more than {MAX_NODE_RESOURCES} resources"
        maps.append((f"job_requests[{uid}]", r.amounts))
    if len(msg.dra_gpus) > MAX_DEVICE_GROUPS:
        return f"dra_gpus: {len(msg.dra_gpus)} groups, at most {MAX_DEVICE_GROUPS} allowed"
    for i, g in enumerate(msg.dra_gpus):
        if len(g.attributes) > MAX_GROUP_ATTRIBUTES or len(g.capacity) > MAX_GROUP_ATTRIBUTES:
            return f"dra_gpus[{i}]: more than {MAX_GROUP_ATTRIBUTES} attributes or capacities"
        for name, a in g.attributes.items():
            if not _qualified_name(name):
                return f"dra_gpus[{i}].attributes: {_quote(name)} is not a qualified name"
            if a.WhichOneof("value") in ("string", "version") and len(a.string or a.version) > 64:
                return f"dra_gpus[{i}].attributes[{name}]: longer than 64 characters"
        for name, amount in g.capacity.items():
            if not _qualified_name(name) or not 0 <= amount <= MAX_AMOUNT:
                return (
                    f"dra_gpus[{i}].capacity[{_quote(name)}]: not a name or outside 0..{MAX_AMOUNT}"
                )
    for field, amounts in maps:
        for resource, amount in amounts.items():
            if not _qualified_name(resource):
                return f"{field}: {_quote(resource)} is not a resource name"
            limit = MAX_DEVICES_PER_NODE if is_extended_resource(resource) else MAX_AMOUNT
            if not 0 <= amount <= limit:
                return f"{field}[{resource}]: {amount} is outside 0..{limit}"
    return None


def _quote(text: str) -> str:
    return repr(text) if len(text) <= 64 else f"{text[:48]!r}…({len(text)} characters)"


# --- work ----------------------------------------------------------------------------------------


def work_item_to_pb(item: WorkItem) -> pb.WorkItem:
    """Encode a :class:`WorkItem` (manifests as JSON bytes)."""
    return pb.WorkItem(
        job_uid=item.job_uid,
        job=item.job,
        revision=item.revision,
        op=_OPS_TO_PB[item.op],
        namespace=item.namespace,
        manifests=item.manifests_json(),
        applied_before=item.applied_before,
        pod_security=item.pod_security,
    )


def work_item_from_pb(msg: pb.WorkItem) -> WorkItem:
    """Decode a work item; raises :class:`ProtocolError` on bad JSON or fields."""
    if msg.op not in _OPS_FROM_PB:
        raise ProtocolError(f"work item {msg.job_uid!r}: op {msg.op} is not Apply or Delete")
    try:
        manifests = tuple(json.loads(m) for m in msg.manifests)
    except ValueError as exc:
        raise ProtocolError(f"work item {msg.job_uid!r}: manifest is not JSON: {exc}") from exc
    if not all(isinstance(m, dict) for m in manifests):
        raise ProtocolError(f"work item {msg.job_uid!r}: every manifest must be a JSON object")
    try:
        return WorkItem(
            job_uid=msg.job_uid,
            job=msg.job,
            revision=msg.revision,
            op=_OPS_FROM_PB[msg.op],
            namespace=msg.namespace,
            manifests=manifests,
            applied_before=msg.applied_before,
            pod_security=msg.pod_security,  # type: ignore[arg-type]  # checked by the model
        )
    except ValidationError as exc:
        raise ProtocolError(f"work item {msg.job_uid!r}: {_first_error(exc)}") from exc


def work_ack_to_pb(ack: WorkAck) -> pb.WorkAck:
    """Encode a :class:`WorkAck`."""
    return pb.WorkAck(
        job_uid=ack.job_uid,
        revision=ack.revision,
        result=_ACK_TO_PB[ack.result],
        message=ack.message,
        retryable=ack.retryable,
    )


def work_ack_from_pb(msg: pb.WorkAck) -> WorkAck:
    """Decode a work ack; raises :class:`ProtocolError` on an unknown result."""
    if msg.result not in _ACK_FROM_PB:
        raise ProtocolError(f"work ack {msg.job_uid!r}: result {msg.result} is not known")
    if not msg.job_uid:
        raise ProtocolError("work ack: job_uid is empty")
    return WorkAck(
        job_uid=msg.job_uid,
        revision=msg.revision,
        result=_ACK_FROM_PB[msg.result],
        message=msg.message,
        retryable=msg.retryable,
    )


# --- status --------------------------------------------------------------------------------------


def workload_status_to_pb(status: WorkloadStatus) -> pb.WorkloadStatus:
    """Encode a :class:`WorkloadStatus`."""
    return pb.WorkloadStatus(
        job_uid=status.job_uid,
        revision=status.revision,
        kind=status.kind,
        name=status.name,
        phase=status.phase,
        conditions=[
            pb.Condition(
                type=c.type,
                status=c.status,
                reason=c.reason,
                message=c.message,
                last_transition_time=c.last_transition_time,
            )
            for c in status.conditions
        ],
        active=status.active,
        succeeded=status.succeeded,
        failed=status.failed,
        ready=status.ready,
        start_time=status.start_time,
        completion_time=status.completion_time,
        pod_issues=[
            pb.PodIssue(pod=i.pod, reason=i.reason, message=i.message) for i in status.pod_issues
        ],
        nodes=list(status.nodes),
        last_checkpoint_time=status.last_checkpoint_time,
        failure=None
        if status.failure is None
        else pb.FailureCause(
            kind=status.failure.kind,
            reason=status.failure.reason,
            message=status.failure.message,
            nodes=list(status.failure.nodes),
            exit_codes=list(status.failure.exit_codes),
        ),
    )


def workload_status_from_pb(msg: pb.WorkloadStatus) -> WorkloadStatus:
    """Decode and validate a workload status; raises :class:`ProtocolError` naming the field."""
    try:
        return WorkloadStatus(
            job_uid=msg.job_uid,
            revision=msg.revision,
            kind=msg.kind,
            name=msg.name,
            phase=msg.phase,  # type: ignore[arg-type]
            conditions=tuple(
                Condition(
                    type=c.type,
                    status=c.status,
                    reason=c.reason,
                    message=c.message,
                    last_transition_time=c.last_transition_time,
                )
                for c in msg.conditions
            ),
            active=msg.active,
            succeeded=msg.succeeded,
            failed=msg.failed,
            ready=msg.ready,
            start_time=msg.start_time,
            completion_time=msg.completion_time,
            pod_issues=tuple(
                PodIssue(pod=i.pod, reason=i.reason, message=i.message) for i in msg.pod_issues
            ),
            nodes=tuple(msg.nodes),
            last_checkpoint_time=msg.last_checkpoint_time,
            failure=FailureCause(
                kind=msg.failure.kind,  # type: ignore[arg-type]
                reason=msg.failure.reason,
                message=msg.failure.message,
                nodes=tuple(msg.failure.nodes),
                exit_codes=tuple(msg.failure.exit_codes),
            )
            if msg.HasField("failure")
            else None,
        )
    except ValidationError as exc:
        raise ProtocolError(f"workload status {msg.job_uid!r}: {_first_error(exc)}") from exc


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    return f"{loc}: {err['msg']}" if loc else str(err["msg"])
