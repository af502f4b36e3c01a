"""``gpufed submit|explain|delete`` and the rows of ``get jobs|clusters``: users' view of the hub.

All talk to the hub cluster's API server only (never to members), with kubectl's kubeconfig
resolution (``cli/kube.py``: ``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``, in-cluster;
``--context``; the namespace from ``-n`` or the context). ``--json`` prints one JSON document for scripts.

- :func:`wrap` (``submit``, ``cli/submit.py``): a GPUJob as it is, or a plain batch/v1 Job,
  JobSet, PyTorchJob, RayJob or MPIJob wrapped into a GPUJob of the same name, with
  ``spec.placement`` read from the annotations ``gpufed.io/gpu-products`` (comma-separated),
  ``gpufed.io/nvlink``, ``gpufed.io/priority`` and the label ``gpufed.io/queue``
  (:func:`gpufed.api.hints.placement_hints`, docs/design.md §4).
- ``get jobs`` / ``get clusters`` rows (:func:`job_rows`, :func:`cluster_rows`; the commands
  and their printing are ``cli/get.py`` and ``cli/output.py``): a job's name, namespace, phase,
  cluster, GPUs, message and timings; a member's Ready, whole GPUs total/free per product on
  Ready schedulable nodes, the largest free NVLink block, heartbeat (from MemberCluster
  status, docs/design.md §3 meanings).
- ``explain JOB``: where the job went and why, or why it still waits, member by member.
- ``delete JOB``: delete the GPUJob; waits until the hub removed the member objects and let the
  GPUJob go (``--no-wait`` returns at once).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from gpufed.api.errors import FieldError
from gpufed.api.gpujob import GPUJob, PreemptionStatus
from gpufed.api.hints import placement_hints
from gpufed.api.kubeconfig import KubeconfigError
from gpufed.api.labels import (
    API_VERSION,
    GROUP,
    VERSION,
)
from gpufed.api.membercluster import MemberCluster
from gpufed.cli import kube
from gpufed.cli.output import AsJSON
from gpufed.hub.rules.status import decision_from_status
from gpufed.placement import render_explanation

Kubeconfig = kube.Kubeconfig
Context = kube.Context
Namespace = Annotated[
    str | None, typer.Option("--namespace", "-n", help="namespace (default: the context's)")
]

#: (apiVersion, kind) of the workloads ``submit`` wraps into a GPUJob (docs/design.md §4).
WRAPPABLE = {
    ("batch/v1", "Job"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    ("kubeflow.org/v1", "PyTorchJob"),
    ("ray.io/v1", "RayJob"),
    ("kubeflow.org/v2beta1", "MPIJob"),
}


class _Kube:
    def __init__(self, kubeconfig: Path | None, context: str | None) -> None:
        from kubernetes import client, config

        try:
            hub = kube.connect(kubeconfig, context)
        except KubeconfigError as exc:  # its message names the kubeconfig and the fix
            _fail(str(exc))
        except (config.ConfigException, OSError) as exc:
            _fail(f"kubeconfig: {exc}")
        self.server = hub.server
        self.api = hub.api
        self.namespace = hub.namespace
        #: dict in, dict out (custom objects); typed loosely on purpose
        self.custom: Any = client.CustomObjectsApi(self.api)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


@contextlib.contextmanager
def _reachable(kube: _Kube) -> Iterator[None]:
    """Turn "the hub API server cannot be reached" into one error line."""
    from urllib3.exceptions import HTTPError

    try:
        yield
    except (HTTPError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        _fail(
            f"cannot reach the API server {kube.server} (the hub cluster): {reason} (a local "
            "sandbox: is it up? `gpufed local status`; otherwise check --kubeconfig/--context)"
        )


@contextlib.contextmanager
def _api_errors(plural: str) -> Iterator[None]:
    """An API error listing ``plural`` as one error line (404: the CRDs are not installed)."""
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except ApiException as exc:
        hint = " (are the CRDs installed? gpufed hub install)" if exc.status == 404 else ""
        _fail(f"listing {plural}.{GROUP}: {_api_message(exc)}{hint}")


# --- wrapping (submit) -------------------------------------------------------------------------


def wrap(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A GPUJob for ``obj``: itself when it is one, else the workload wrapped into one.

    Raises ``ValueError`` for an object that is neither, and
    :class:`~gpufed.api.errors.FieldError` (a ``ValueError`` too) naming the field for
    malformed metadata or placement annotations.
    """
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    meta = obj.get("metadata") or {}
    if not isinstance(meta, dict):
        raise FieldError("metadata", "must be a mapping (name, namespace, annotations ...)")
    if (api_version, kind) == (API_VERSION, "GPUJob"):
        out = dict(obj)
        out["metadata"] = {**meta, "namespace": meta.get("namespace") or namespace}
        return out
    if (api_version, kind) not in WRAPPABLE:
        raise ValueError(
            f"kind {kind!r} ({api_version}) is not a GPUJob, batch/v1 Job, "
            "jobset.x-k8s.io/v1alpha2 JobSet, kubeflow.org/v1 PyTorchJob, ray.io/v1 RayJob or "
            "kubeflow.org/v2beta1 MPIJob"
        )
    name = meta.get("name")
    if not name:
        raise FieldError("metadata.name", "required to name the GPUJob")
    placement = placement_hints(meta)
    ann = meta.get("annotations") or {}
    template = json.loads(json.dumps(obj))
    template_meta = template.setdefault("metadata", {})
    template_meta.pop("namespace", None)
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUJob",
        "metadata": {
            "name": name,
            "namespace": meta.get("namespace") or namespace,
            "labels": meta.get("labels") or {},
            "annotations": ann,
        },
        "spec": {"template": template, "placement": placement},
    }


def _not_found_hint(exc: Any) -> str:
    if getattr(exc, "status", None) != 404:
        return ""
    return " (list them with `gpufed get jobs -A`; name another namespace as NAMESPACE/NAME or -n)"


def _api_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body)["message"])
    except (ValueError, KeyError, TypeError):
        return f"{exc.status} {exc.reason}"


# --- get ---------------------------------------------------------------------------------------


def _age(timestamp: str | None) -> str:
    if not timestamp:
        return "-"
    then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    secs = int((datetime.now(UTC) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{max(secs, 0)}s"


def job_rows(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``get jobs --json``: one object per GPUJob (name, namespace, phase, cluster, gpus …)."""
    out = []
    for raw in items:
        job = GPUJob.model_validate(raw)
        s = job.status
        out.append(
            {
                "name": job.metadata.name,
                "namespace": job.metadata.namespace,
                "phase": job.phase,
                "cluster": s.cluster if s else None,
                "gpus": s.gpus if s else None,
                "message": s.message if s else "",
                "placement_ms": s.timings.placement_ms if s and s.timings else None,
                "dispatch_ms": s.timings.dispatch_ms if s and s.timings else None,
                "created": job.metadata.creation_timestamp,
            }
        )
    return out


def cluster_rows(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``get clusters --json``: one object per MemberCluster (summaries: docs/design.md §3)."""
    out = []
    for raw in items:
        mc = MemberCluster.model_validate(raw)
        s = mc.status
        out.append(
            {
                "name": mc.metadata.name,
                "ready": bool(s and s.ready()),
                "gpus_total": dict(s.gpus_total) if s else {},
                "gpus_free": dict(s.gpus_free) if s else {},
                "gpus_reserved": dict(s.gpus_reserved) if s else {},
                "largest_free_nvlink_block": (s.largest_free_nvlink_block or 0) if s else 0,
                "nodes": (s.nodes or 0) if s else 0,
                "agent_version": s.agent_version if s else None,
                "last_heartbeat": s.last_heartbeat_time if s else None,
                "labels": dict(mc.spec.labels),
                "suspect_nodes": [
                    {"node": x.node, "reason": x.reason, "until": x.until}
                    for x in (s.suspect_nodes if s else [])
                ],
            }
        )
    return out


# --- explain -----------------------------------------------------------------------------------


def _preemption_lines(p: PreemptionStatus) -> list[str]:
    """What a preemptor preempted: the block freed and each victim with its cost."""
    block = ", ".join(p.nvlink_domains[:8]) or ", ".join(p.nodes[:8])
    out = [
        f"preempted {len(p.victims)} job(s) in {p.cluster} to free {block} "
        f"({p.cost_gpu_seconds:.0f} GPU-seconds lost){f' at {p.time}' if p.time else ''}:",
    ]
    if p.nodes:
        more = f" and {len(p.nodes) - 8} more" if len(p.nodes) > 8 else ""
        out.append(f"  nodes: {', '.join(p.nodes[:8])}{more}")
    for v in p.victims:
        out.append(
            f"  {v.job}  priority {v.priority}  {v.cost_gpu_seconds:.0f} GPU-s lost  ({v.reason})"
        )
    if p.message:
        out.append(f"  {p.message}")
    return out


def explain_text(raw: dict[str, Any]) -> str:
    """The ``gpufed explain`` text of one GPUJob object."""
    job = GPUJob.model_validate(raw)
    s = job.status
    lines = [f"GPUJob {job.key}: {job.phase}"]
    if s is None:
        lines.append("  the hub has not looked at this job yet (is the hub running?)")
        return "\n".join(lines)
    if s.message:
        lines.append(f"  {s.message}")
    if s.cluster:
        lines.append(f"  cluster: {s.cluster}")
    if s.gpus is not None:
        lines.append(f"  GPUs: {s.gpus}")
    for issue in s.pod_issues[:5]:
        lines.append(f"  pod {issue.pod}: {issue.reason} {issue.message}".rstrip())
    if s.placement is not None:
        lines.append("")
        decision = decision_from_status(job.key, job.metadata.uid or "", s.placement)
        lines.append(render_explanation(decision))
    if s.preemptions:
        lines.append(f"  preempted {s.preemptions} time(s) (condition Preempted below)")
    if s.preemption is not None:
        lines.append("")
        lines.extend(_preemption_lines(s.preemption))
    if s.restarts:
        lines.append("")
        lines.append(f"restarted {s.restarts} time(s) after infrastructure failures:")
        for r in s.restart_history:
            nodes = ", ".join(r.nodes[:8]) or "-"
            lines.append(
                f"  attempt {r.attempt} in {r.cluster} on {nodes}: {r.reason}  {r.message}"
            )
    if s.conditions:
        lines.append("")
        lines.append("conditions:")
        for c in s.conditions:
            lines.append(f"  {c.type}={c.status}  {c.reason}  {c.message}".rstrip())
    return "\n".join(lines)


def explain(
    job: Annotated[str, typer.Argument(help="GPUJob name (or namespace/name)")],
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    namespace: Namespace = None,
    as_json: AsJSON = False,
) -> None:
    """Where a GPUJob went and why, or why it is still pending, member by member."""
    from kubernetes.client.exceptions import ApiException

    kube = _Kube(kubeconfig, context)
    ns, _, name = job.rpartition("/")
    ns = ns or namespace or kube.namespace
    try:
        with _reachable(kube):
            raw = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "gpujobs", name)
    except ApiException as exc:
        _fail(f"{ns}/{name}: {_api_message(exc)}{_not_found_hint(exc)}")
    if as_json:
        status = raw.get("status") or {}
        typer.echo(
            json.dumps(
                {
                    "name": name,
                    "namespace": ns,
                    "phase": status.get("phase", "Pending"),
                    "cluster": status.get("cluster"),
                    "message": status.get("message", ""),
                    "placement": status.get("placement"),
                    "conditions": status.get("conditions", []),
                    "explanation": explain_text(raw),
                }
            )
        )
        return
    typer.echo(explain_text(raw))


def delete(
    job: Annotated[str, typer.Argument(help="GPUJob name (or namespace/name)")],
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    namespace: Namespace = None,
    wait: Annotated[
        bool, typer.Option(help="Wait until the hub removed the member objects and the GPUJob.")
    ] = True,
    timeout_s: Annotated[float, typer.Option("--timeout", help="Seconds to wait.")] = 120.0,
) -> None:
    """Delete a GPUJob: the hub deletes its objects in the member, then lets the GPUJob go.

    The GPUJob carries the finalizer ``gpufed.io/member-cleanup``; it disappears once the agent
    confirmed the member objects are gone (or the member was declared lost).
    """
    import time

    from kubernetes.client.exceptions import ApiException

    kube = _Kube(kubeconfig, context)
    ns, _, name = job.rpartition("/")
    ns = ns or namespace or kube.namespace
    try:
        with _reachable(kube):
            kube.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "gpujobs", name)
    except ApiException as exc:
        _fail(f"{ns}/{name}: {_api_message(exc)}{_not_found_hint(exc)}")
    typer.echo(f"gpujob.{GROUP}/{name} deleting (namespace {ns})")
    if not wait:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with _reachable(kube):
                kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "gpujobs", name)
        except ApiException as exc:
            if exc.status == 404:
                typer.echo(f"gpujob.{GROUP}/{name} deleted")
                return
            _fail(f"{ns}/{name}: {_api_message(exc)}")
        time.sleep(0.5)
    _fail(
        f"{ns}/{name} still exists after {timeout_s:.0f} s: the hub waits for the member to "
        f"confirm its objects are gone (`gpufed explain {ns}/{name}`; is the hub running?)"
    )
