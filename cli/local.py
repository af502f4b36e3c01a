"""``gpufed local``: the local multi-cluster sandbox (build, up, status, down, kill, start,
kind).

``up`` runs the clusters and, unless ``--clusters-only``, the gpufed control plane on them: the
CRDs, join tokens and TLS on the hub cluster, the hub process and one agent per member
(:mod:`gpufed.sandbox.controlplane`). ``kill``/``start`` take any component: ``hub``,
``agent/<member>``, ``etcd``, ``apiserver/<cluster>``, ``controller-manager/<member>``,
``scheduler/<member>``, ``kwok/<member>``.

Thin layer over :mod:`gpufed.sandbox`: parses options, prints progress and tables, and turns
:class:`~gpufed.sandbox.runtime.SandboxError` / :class:`~gpufed.sandbox.binaries.BinariesError`
into one red line and exit code 1.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import structlog
import typer
from rich.console import Console
from rich.table import Table

from gpufed.api.fleet import FleetError, FleetSpec
from gpufed.sandbox.binaries import BinariesError, regenerate
from gpufed.sandbox.binaries import build as build_binaries
from gpufed.sandbox.controlplane import HUB_COMPONENT, ControlPlaneOptions
from gpufed.sandbox.helm import build_helm
from gpufed.sandbox.inventory import ClusterGPUs
from gpufed.sandbox.kind import KindProvider, kind_bundle
from gpufed.sandbox.kueue import build_kueue
from gpufed.sandbox.multikueue import MultiKueueOptions, component_name, start_multikueue
from gpufed.sandbox.operators import build_operators
from gpufed.sandbox.runtime import Sandbox, SandboxError, SandboxInfo, default_state_dir
from gpufed.sandbox.supervisor import ComponentError

app = typer.Typer(
    help="Local sandbox: real control planes with kwok GPU nodes.", no_args_is_help=True
)
console = Console(highlight=False)
if not console.is_terminal:
    # Piped or captured output (make, CI logs): no terminal width to honour, so keep the
    # summary table on one line per cluster.
    console = Console(highlight=False, width=160)
err_console = Console(stderr=True, highlight=False)

StateDir = typer.Option(
    None,
    "--state-dir",
    envvar="GPUFED_STATE_DIR",
    help="Sandbox state directory (default ~/.local/state/gpufed/sandbox).",
    show_default=False,
)


def configure_logging(verbose: bool) -> None:
    """structlog at INFO with ``--verbose``, else WARNING (progress lines say enough)."""
    level = logging.INFO if verbose else logging.WARNING
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))


@app.callback()
def _main(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log every process start/stop."),
) -> None:
    configure_logging(verbose)


@contextmanager
def fail_cleanly() -> Iterator[None]:
    """Print sandbox/build errors as one message and exit 1 (no traceback)."""
    try:
        yield
    except (SandboxError, BinariesError, ComponentError) as exc:
        err_console.print(f"[red]error:[/red] {exc}", markup=True, soft_wrap=True)
        raise typer.Exit(1) from None


def _progress(msg: str) -> None:
    console.print(msg, soft_wrap=True)


@app.command()
def build(
    with_kubectl: bool = typer.Option(False, "--with-kubectl", help="Also build kubectl."),
    regenerate_recipe: bool = typer.Option(
        False, "--regenerate", help="Rewrite the wrapper go.mod/go.sum files first (needs network)."
    ),
    force: bool = typer.Option(False, "--force", help="Rebuild even when current."),
    skip_kueue: bool = typer.Option(
        False,
        "--skip-kueue",
        help="Do not build Kueue (the MultiKueue peer; its smoke test then builds it on use).",
    ),
    skip_operators: bool = typer.Option(
        False,
        "--skip-operators",
        help="Do not build the workload operators (jobset, training-operator, kuberay); a "
        "fleet that enables one then fails to start naming it.",
    ),
) -> None:
    """Build the pinned etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
    into ~/.cache/gpufed/bin/<pins>/, helm (the chart tests) into its own
    ~/.cache/gpufed/bin/helm-<version>_<go>/ and the Kueue manager (the MultiKueue peer) into
    ~/.cache/gpufed/bin/kueue-<version>_<go>/ and the workload operators a fleet's
    ``clusters[].operators`` runs (JobSet, the training-operator, KubeRay) into
    ~/.cache/gpufed/bin/<operator>-<version>_<go>/ (each skipped when present and its pins are
    unchanged)."""
    with fail_cleanly():
        if regenerate_recipe:
            regenerate(progress=_progress)
        bins = build_binaries(with_kubectl=with_kubectl, force=force, progress=_progress)
        helm = build_helm(force=force, progress=_progress)
        kueue = None if skip_kueue else build_kueue(force=force, progress=_progress)
        ops = {} if skip_operators else build_operators(force=force, progress=_progress)
    console.print(f"binaries: {bins.path}")
    console.print(f"helm: {helm}")
    if kueue is not None:
        console.print(f"kueue: {kueue}")
    for name, path in ops.items():
        console.print(f"{name}: {path}")


def control_plane_options(
    clusters_only: bool, member_lease: float, member_lost_timeout: float, heartbeat: float
) -> ControlPlaneOptions | None:
    """The hub/agent options of ``up`` and ``demo`` (None with ``--clusters-only``); a bad
    combination is one clear error."""
    if clusters_only:
        return None
    if member_lost_timeout < member_lease:
        err_console.print(
            f"[red]error:[/red] --member-lost-timeout ({member_lost_timeout:g}) must be at least "
            f"--member-lease ({member_lease:g})"
        )
        raise typer.Exit(1)
    return ControlPlaneOptions(
        member_lease_s=member_lease, member_lost_s=member_lost_timeout, heartbeat_s=heartbeat
    )


ClustersOnly = typer.Option(
    False,
    "--clusters-only",
    help="Only the Kubernetes clusters: no CRDs, hub or agents (for hubs of your own).",
)
MemberLease = typer.Option(
    40.0, "--member-lease", help="Hub: seconds until a silent member is NotReady."
)
MemberLost = typer.Option(
    600.0, "--member-lost-timeout", help="Hub: seconds until a silent member is lost."
)
Heartbeat = typer.Option(10.0, "--heartbeat-interval", help="Hub: agent heartbeat, seconds.")


@app.command()
def up(
    fleet: Path = typer.Option(..., "--fleet", "-f", help="Fleet spec (YAML, docs/design.md §5)."),
    state_dir: Path | None = StateDir,
    timeout: float = typer.Option(240.0, help="Seconds to wait for the API servers."),
    clusters_only: bool = ClustersOnly,
    member_lease: float = MemberLease,
    member_lost_timeout: float = MemberLost,
    heartbeat: float = Heartbeat,
    peer: str | None = typer.Option(
        None,
        "--peer",
        help="Run a peer system instead of gpufed's hub and agents: multikueue (Kueue as "
        "MultiKueue manager on the hub, workers on the members; docs/sandbox.md).",
    ),
    kueue_qps: float | None = typer.Option(
        None,
        "--kueue-qps",
        min=0.01,
        max=100_000,
        help="With --peer multikueue: client QPS of every Kueue (1000: fast).",
    ),
    kueue_burst: int | None = typer.Option(
        None,
        "--kueue-burst",
        min=1,
        max=100_000,
        help="With --peer multikueue: client burst of every Kueue.",
    ),
) -> None:
    """Start etcd, a hub API server and per member an API server, controller manager,
    scheduler and kwok; create the fleet's GPU nodes; then install the CRDs, join the members
    and start the hub and one agent per member; wait until every member is Ready on the hub.
    With ``--peer multikueue``, Kueue's MultiKueue runs on the clusters instead."""
    if peer not in (None, "multikueue"):
        err_console.print(f"[red]error:[/red] --peer {peer!r}: the one peer is 'multikueue'")
        raise typer.Exit(1)
    if peer is None and (kueue_qps is not None or kueue_burst is not None):
        err_console.print("[red]error:[/red] --kueue-qps/--kueue-burst need --peer multikueue")
        raise typer.Exit(1)
    options = control_plane_options(
        clusters_only or peer is not None, member_lease, member_lost_timeout, heartbeat
    )
    started = time.monotonic()
    with fail_cleanly():
        sandbox = Sandbox(state_dir, progress=_progress)
        info = sandbox.up(fleet, apiserver_timeout_s=timeout, control_plane=options)
        mk = None
        if peer == "multikueue":
            try:
                mk_options = MultiKueueOptions(qps=kueue_qps, burst=kueue_burst)
                mk = start_multikueue(sandbox, info, options=mk_options, progress=_progress)
            except BaseException:
                sandbox.down()
                raise
        inventory = sandbox.inventory()
    total = time.monotonic() - started
    if mk is None:
        console.print(f"sandbox up in {total:.1f}s")
    else:
        console.print(
            f"sandbox up in {total:.1f}s (clusters {info.up_seconds or 0:.1f}s, then MultiKueue)"
        )
    print_summary(info, inventory, peer=peer)
    if mk is not None:
        console.print(
            f"multikueue: submit batch/v1 Jobs on the hub in namespace {mk.namespace} with label "
            f"{mk.queue_label}={mk.local_queue}; managers: {', '.join(mk.components)}",
            soft_wrap=True,
        )


def print_summary(
    info: SandboxInfo, inventory: list[ClusterGPUs], *, peer: str | None = None
) -> None:
    """One screen: per cluster its API server, nodes, GPUs by product, MIG, NVLink domains.
    ``peer``: the peer system run instead of gpufed (``multikueue``), None for none."""
    table = Table(title="gpufed sandbox", title_justify="left")
    for col in ("cluster", "API server", "nodes", "GPUs by product", "MIG", "NVLink domains"):
        table.add_column(col)
    by_name = {g.cluster: g for g in inventory}
    for name, ep in info.clusters.items():
        g = by_name.get(name)
        if g is None:
            table.add_row(f"{name} ({ep.role})", ep.server, "-", "-", "-", "-")
            continue
        gpus = "\n".join(f"{n} x {p}" for p, n in g.gpus_total.items()) or "-"
        mig = "\n".join(
            f"{n} x {r.removeprefix('nvidia.com/mig-')}" for r, n in g.mig_total.items()
        )
        domains = ", ".join(f"{n} x {size} GPUs" for size, n in g.nvlink_domains.items())
        if g.taints:
            gpus += "\n[dim]taints: " + ", ".join(g.taints) + "[/dim]"
        table.add_row(
            name, ep.server, f"{g.nodes_ready}/{g.nodes} Ready", gpus, mig or "-", domains or "-"
        )
    console.print(table)
    cp = info.control_plane
    hub_line = (
        f"hub: agents dial {cp.hub_address} (TLS, CA {cp.ca_file}); metrics {cp.hub_http}/metrics"
        f"; {len(cp.agents)} agents\n"
        if cp
        else f"hub: not started (--peer {peer} runs the peer instead of gpufed)\n"
        if peer
        else "hub: not started (--clusters-only)\n"
    )
    console.print(
        f"kubeconfig: {info.kubeconfig}  (contexts: {', '.join(info.clusters)}; current: hub)\n"
        f"etcd: {info.etcd_url}  (hub prefix {info.hub_etcd_prefix})\n"
        + hub_line
        + f"stop with: gpufed local down --state-dir {info.state_dir}",
        soft_wrap=True,
    )


@app.command()
def status(
    state_dir: Path | None = StateDir,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Show every component (pid, memory, ports, log) and each cluster's GPU inventory.
    Exit code 0 when every component runs, 1 otherwise."""
    with fail_cleanly():
        st = Sandbox(state_dir).status()
    if as_json:
        typer.echo(st.model_dump_json(indent=2))
        raise typer.Exit(0 if st.running else 1)
    if not st.exists:
        console.print(f"no sandbox in {st.state_dir}")
        raise typer.Exit(1)
    table = Table(title=f"sandbox {st.state_dir}: {st.phase}", title_justify="left")
    for col in ("component", "state", "pid", "RSS", "ports", "log"):
        table.add_column(col)
    for c in st.components:
        table.add_row(
            c.name,
            "[green]running[/green]" if c.running else "[red]stopped[/red]",
            str(c.pid or "-"),
            f"{c.rss_bytes / 2**20:.0f} MiB" if c.running else "-",
            ",".join(map(str, c.ports)) or "-",
            c.log,
        )
    console.print(table)
    console.print(f"total RSS: {st.rss_bytes / 2**20:.0f} MiB")
    inventory = [c.gpus for c in st.clusters if c.gpus is not None]
    if st.running:
        kueue = any(c.name.startswith(component_name("")) for c in st.components)
        print_summary(Sandbox(state_dir).info(), inventory, peer="multikueue" if kueue else None)
    raise typer.Exit(0 if st.running else 1)


@app.command()
def down(state_dir: Path | None = StateDir) -> None:
    """Stop every sandbox process (by pid) and wait until its ports are free. Logs stay."""
    with fail_cleanly():
        sandbox = Sandbox(state_dir)
        stopped = sandbox.down()
    where = sandbox.state_dir
    console.print(
        f"stopped {len(stopped)} processes in {where}" if stopped else f"nothing running in {where}"
    )


ComponentArg = typer.Argument(
    ..., help="hub, agent/<member>, etcd, apiserver/<cluster>, kwok/<member>, ..."
)


@app.command()
def kill(component: str = ComponentArg, state_dir: Path | None = StateDir) -> None:
    """SIGKILL one component (simulate a crash); `gpufed local start` brings it back."""
    with fail_cleanly():
        sandbox = Sandbox(state_dir)
        try:
            sandbox.supervisor.spec(component)
        except KeyError as exc:
            raise SandboxError(str(exc.args[0])) from None
        sandbox.supervisor.kill(component)
    console.print(f"killed {component}")


@app.command()
def start(
    component: str = ComponentArg,
    state_dir: Path | None = StateDir,
    wait: float = typer.Option(
        60.0,
        "--wait",
        help="For hub and agents: seconds to wait until every member is Ready on the hub "
        "again (0: do not wait).",
    ),
) -> None:
    """Start one registered component again and wait until it is ready (for the hub and
    agents: until the hub leads and every member is Ready on it again)."""
    with fail_cleanly():
        sandbox = Sandbox(state_dir)
        try:
            sandbox.supervisor.spec(component)
        except KeyError as exc:
            raise SandboxError(str(exc.args[0])) from None
        pid = sandbox.supervisor.start(component)
        console.print(f"{component} running (pid {pid})")
        if wait > 0 and (component == HUB_COMPONENT or component.startswith("agent/")):
            if stopped := [
                c for c in sandbox.supervisor.names() if not sandbox.supervisor.is_running(c)
            ]:
                console.print(f"not waiting for the members: {', '.join(stopped)} stopped")
                return
            sandbox.wait_control_plane(wait)
            console.print("hub leading, every member Ready on the hub")


kind_app = typer.Typer(
    help="kind provider: the fleet as kind clusters with kwok nodes (needs a Docker engine).",
    no_args_is_help=True,
)
app.add_typer(kind_app, name="kind")
KindFleet = typer.Option(..., "--fleet", "-f", help="Fleet spec (YAML).")
KindDir = typer.Option(
    Path(".state/kind"), "--workdir", help="Where configs, manifests and the kubeconfig go."
)


def _load_fleet(path: Path) -> FleetSpec:
    try:
        return FleetSpec.load(path)
    except FleetError as exc:
        raise SandboxError(str(exc)) from None


@kind_app.command("config")
def kind_config(fleet: Path = KindFleet, workdir: Path = KindDir) -> None:
    """Write kind configs, scheduler configs, kwok Stage and Node manifests (no Docker needed)."""
    with fail_cleanly():
        files = kind_bundle(_load_fleet(fleet), workdir)
    for f in files:
        console.print(f"{f.name}: {f.kind_config}")


@kind_app.command("up")
def kind_up(fleet: Path = KindFleet, workdir: Path = KindDir) -> None:
    """Create one kind cluster per sandbox cluster, install kwok and create the GPU nodes."""
    with fail_cleanly():
        kubeconfig = KindProvider(workdir).up(_load_fleet(fleet))
    console.print(f"kubeconfig: {kubeconfig}")


@kind_app.command("down")
def kind_down(fleet: Path = KindFleet, workdir: Path = KindDir) -> None:
    """Delete the fleet's kind clusters."""
    with fail_cleanly():
        KindProvider(workdir).down(_load_fleet(fleet))


__all__ = ["app", "default_state_dir", "print_summary"]
