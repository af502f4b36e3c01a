"""``gpufed get jobs|clusters|queues|gpus``: list what the hub knows, kubectl-style.

Each command describes its rows (:func:`gpufed.cli.jobs.job_rows`, ``cluster_rows``,
:func:`gpufed.cli.queues.queue_rows`, :func:`gpufed.cli.gpus.gpu_rows`) and its columns, and
:mod:`gpufed.cli.output` prints them: ``-o wide|json|yaml|name`` (``--json`` = ``-o json``),
``-l`` label selectors, ``-w`` watch. Talks to the hub cluster's API server only (kubectl's
kubeconfig resolution, ``cli/kube.py``). Registered on the ``get`` group by ``cli/main.py``.

Selectors: GPUJobs and GPUQueues by ``metadata.labels``, sent to the API server as
``labelSelector``; ``get clusters`` and ``get gpus`` select MemberClusters by their
``spec.labels`` (placement's labels; ``metadata.labels`` under them), matched here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any

import typer

from gpufed.api.labels import GROUP, VERSION
from gpufed.cli import output
from gpufed.cli.gpus import gpu_rows
from gpufed.cli.jobs import (
    Context,
    Kubeconfig,
    Namespace,
    _age,
    _api_errors,
    _Kube,
    _reachable,
    cluster_rows,
    job_rows,
)
from gpufed.cli.queues import queue_rows, usage_text

__all__ = ["get_app", "get_clusters", "get_gpus", "get_jobs", "get_queues"]

get_app = typer.Typer(help="List GPUJobs, member clusters, queues or GPUs.", no_args_is_help=True)


def _dash(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _ms(value: Any) -> str:
    """Milliseconds as a whole number, as the demo's table shows them."""
    return f"{value:.0f}" if isinstance(value, int | float) else _dash(value)


def _api(
    kube: _Kube, plural: str, namespace: str | None
) -> tuple[Callable[[str], Mapping[str, Any]], Callable[[str, str, int], Iterator[Any]]]:
    """The list and watch calls of ``plural`` (one namespace, or the whole cluster)."""
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    if namespace is None:

        def call(**kw: Any) -> Any:
            return kube.custom.list_cluster_custom_object(GROUP, VERSION, plural, **kw)
    else:

        def call(**kw: Any) -> Any:
            return kube.custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, **kw
            )

    def list_objects(selector: str) -> Mapping[str, Any]:
        resp: Mapping[str, Any] = call(**({"label_selector": selector} if selector else {}))
        return resp

    def watch_objects(version: str, selector: str, timeout_s: int) -> Iterator[Any]:
        w: Any = watch.Watch()  # type: ignore[no-untyped-call]
        kw: dict[str, Any] = {"timeout_seconds": timeout_s, "allow_watch_bookmarks": True}
        if version:
            kw["resource_version"] = version
        if selector:
            kw["label_selector"] = selector
        try:
            for event in w.stream(call, **kw):
                yield {"type": event["type"], "object": event["object"]}
        except ApiException as exc:
            if exc.status != 410:
                raise
            yield {"type": "ERROR", "object": {"code": 410}}
        finally:
            w.stop()

    return list_objects, watch_objects


def _get(
    kube: _Kube,
    plural: str,
    namespace: str | None,
    opts: tuple[str | None, bool, str | None, bool, float],
    **listing: Any,
) -> None:
    """List (and watch) ``plural`` and print it: ``opts`` = (-o, --json, -l, -w,
    --watch-timeout); ``listing``: the rest of the :class:`~gpufed.cli.output.Listing`."""
    out, as_json, selector, watch, watch_timeout = opts
    fmt = output.output_format(out, as_json)
    try:
        sel = output.parse_selector(selector)
    except output.SelectorError as exc:
        raise typer.BadParameter(str(exc), param_hint="'-l' / '--selector'") from None
    list_objects, watch_objects = _api(kube, plural, namespace)
    view = output.Listing(list_objects=list_objects, watch_objects=watch_objects, **listing)
    with _reachable(kube), _api_errors(plural):
        output.show(view, fmt, sel, watch=watch, watch_timeout_s=watch_timeout)


def _member_labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    meta = (obj.get("metadata") or {}).get("labels") or {}
    spec = (obj.get("spec") or {}).get("labels") or {}
    return {**meta, **spec}


JOB_COLUMNS = (
    output.Column("NAMESPACE", lambda r: _dash(r["namespace"])),
    output.Column("NAME", lambda r: str(r["name"])),
    output.Column("PHASE", lambda r: str(r["phase"])),
    output.Column("GPUS", lambda r: _dash(r["gpus"])),
    output.Column("CLUSTER", lambda r: _dash(r["cluster"])),
    output.Column("AGE", lambda r: _age(r["created"])),
    output.Column("PLACEMENT-MS", lambda r: _ms(r["placement_ms"]), wide=True),
    output.Column("DISPATCH-MS", lambda r: _ms(r["dispatch_ms"]), wide=True),
    output.Column("MESSAGE", lambda r: str(r["message"] or ""), wide=True),
)


@get_app.command("jobs")
def get_jobs(
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    namespace: Namespace = None,
    all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A")] = False,
    out: output.Output = None,
    as_json: output.AsJSON = False,
    selector: output.SelectorOption = None,
    watch: output.Watch = False,
    watch_timeout: output.WatchTimeout = 0.0,
) -> None:
    """List GPUJobs: phase, GPUs, cluster, age (wide: timings and message)."""
    kube = _Kube(kubeconfig, context)
    ns = None if all_namespaces else namespace or kube.namespace
    where = "" if ns is None else f" in namespace {ns} (-A: all)"
    _get(
        kube,
        "gpujobs",
        ns,
        (out, as_json, selector, watch, watch_timeout),
        resource=f"gpujob.{GROUP}",
        columns=JOB_COLUMNS,
        rows=job_rows,
        empty=f"No GPUJobs{where}{' matching -l ' + selector if selector else ''}.",
        key_of=lambda r: f"{r['namespace']}/{r['name']}",
    )


def _gpus_text(r: Mapping[str, Any]) -> str:
    total = r["gpus_total"]
    return ", ".join(f"{p}={r['gpus_free'].get(p, 0)}/{t}" for p, t in sorted(total.items())) or "-"


CLUSTER_COLUMNS = (
    output.Column("NAME", lambda r: str(r["name"])),
    output.Column("READY", lambda r: "True" if r["ready"] else "False"),
    output.Column("GPUS (FREE/TOTAL)", _gpus_text),
    output.Column("LARGEST-BLOCK", lambda r: str(r["largest_free_nvlink_block"])),
    output.Column("NODES", lambda r: str(r["nodes"])),
    output.Column("SUSPECT", lambda r: ",".join(x["node"] for x in r["suspect_nodes"]) or "-"),
    output.Column("HEARTBEAT", lambda r: _age(r["last_heartbeat"])),
    output.Column(
        "RESERVED",
        lambda r: ", ".join(f"{p}={n}" for p, n in sorted(r["gpus_reserved"].items())) or "-",
        wide=True,
    ),
    output.Column("AGENT", lambda r: _dash(r["agent_version"]), wide=True),
    output.Column(
        "LABELS",
        lambda r: ",".join(f"{k}={v}" for k, v in sorted(r["labels"].items())) or "-",
        wide=True,
    ),
)


@get_app.command("clusters")
def get_clusters(
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    out: output.Output = None,
    as_json: output.AsJSON = False,
    selector: output.SelectorOption = None,
    watch: output.Watch = False,
    watch_timeout: output.WatchTimeout = 0.0,
) -> None:
    """List member clusters: Ready, GPUs free/total per product, largest free NVLink block."""
    _get(
        _Kube(kubeconfig, context),
        "memberclusters",
        None,
        (out, as_json, selector, watch, watch_timeout),
        resource=f"membercluster.{GROUP}",
        columns=CLUSTER_COLUMNS,
        rows=cluster_rows,
        empty="No member clusters" + (f" matching -l {selector}." if selector else "."),
        server_side_selector=False,
        labels_of=_member_labels,
    )


QUEUE_COLUMNS = (
    output.Column("NAME", lambda r: "  " * r["depth"] + str(r["name"])),
    output.Column("ACTIVE", lambda r: str(r["active"])),
    output.Column("USED/NOMINAL", lambda r: usage_text(r["usage"])),
    output.Column("PENDING", lambda r: _dash(r["pending_jobs"])),
    output.Column("ADMITTED", lambda r: _dash(r["admitted_jobs"])),
    output.Column("FAIR-SHARE", lambda r: str(r["fair_share"] or "-")),
    output.Column("PARENT", lambda r: _dash(r["parent"]), wide=True),
    output.Column("NAMESPACES", lambda r: ",".join(r["namespaces"]) or "-", wide=True),
    output.Column("WEIGHT", lambda r: _dash(r["weight"]), wide=True),
    output.Column("MESSAGE", lambda r: "" if r["active"] == "True" else str(r["message"])),
)


def get_queues(
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    out: output.Output = None,
    as_json: output.AsJSON = False,
    selector: output.SelectorOption = None,
    watch: output.Watch = False,
    watch_timeout: output.WatchTimeout = 0.0,
) -> None:
    """List GPUQueues as a tree: Active, GPUs used/nominal per product, pending and admitted
    jobs, fair share (docs/design.md §8)."""
    _get(
        _Kube(kubeconfig, context),
        "gpuqueues",
        None,
        (out, as_json, selector, watch, watch_timeout),
        resource=f"gpuqueue.{GROUP}",
        columns=QUEUE_COLUMNS,
        rows=queue_rows,
        empty="No GPUQueues (every GPUJob is in the hub's default queue, without limit).",
    )


def _members_text(r: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{m['name']}={m['free']}/{m['total']}" + ("" if m["ready"] else " (NotReady)")
        for m in r["members"]
    )


def _block_text(r: Mapping[str, Any]) -> str:
    block = r["largestFreeNVLinkBlock"]
    return f"{block} ({r['largestFreeNVLinkBlockMember']})" if block else str(block)


GPU_COLUMNS = (
    output.Column("GPU", lambda r: str(r["product"])),
    output.Column("SHORT", lambda r: str(r["shortName"] or "-")),
    output.Column("TOTAL", lambda r: str(r["total"])),
    output.Column("FREE", lambda r: str(r["free"])),
    output.Column("MEMBERS (FREE/TOTAL)", _members_text),
    output.Column("LARGEST-FREE-BLOCK", _block_text),
    output.Column("RESERVED", lambda r: str(r["reserved"]), wide=True),
)


def get_gpus(
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    out: output.Output = None,
    as_json: output.AsJSON = False,
    selector: output.SelectorOption = None,
    watch: output.Watch = False,
    watch_timeout: output.WatchTimeout = 0.0,
) -> None:
    """List the fleet's GPUs by product: total, free, per member, largest free NVLink block
    (``-l`` selects the members counted, by their labels)."""
    _get(
        _Kube(kubeconfig, context),
        "memberclusters",
        None,
        (out, as_json, selector, watch, watch_timeout),
        resource="gpu",
        columns=GPU_COLUMNS,
        rows=gpu_rows,
        empty="No GPUs: no member cluster has reported whole GPUs (`gpufed get clusters`).",
        key_of=lambda r: str(r["product"]),
        name_of=lambda r: str(r["product"]),
        server_side_selector=False,
        labels_of=_member_labels,
    )


get_app.command("queues")(get_queues)
get_app.command("gpus")(get_gpus)
