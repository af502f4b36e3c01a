"""``gpufed demo``: the main job in one command (``make demo``).

1. Bring the sandbox up with the example fleet (``manifests/fleets/example.yaml``: an HGX H100
   member, a GB200 NVL72 member and a tainted A100 MIG member), with the hub and one agent per
   member running; a sandbox already running in the same state dir is reused.
2. Create on the hub every namespace the jobs name, remove the GPUJobs of an earlier demo run
   (same names), and submit the GPUJobs of ``manifests/examples/*.yaml`` (or ``--jobs DIR``).
3. Follow them with a watch on the hub, printing each phase change, until each ended
   (Succeeded, Failed, Lost) or is clearly stuck (Pending and unschedulable for ``--stuck``
   seconds).
4. Print a table (job, GPUs, topology, cluster, NVLink domain, phase, placement and dispatch
   milliseconds from ``status.timings``); with ``--json`` the last line is the same as a JSON
   list of objects with keys ``job, gpus, topology, cluster, domain, phase, placement_ms,
   dispatch_ms``.
5. Check each job against its annotation ``gpufed.io/expect``
   (``<Phase> [on <cluster> | unplaced] [because <Reason>]``; none means ``Succeeded``) and
   exit 0 only when every one holds. The sandbox stays up; the demo prints how to look around
   and how to stop it.

The functions here (:func:`load_examples`, :class:`Expectation`, :func:`run_jobs`,
:func:`demo_rows`) are also what the end-to-end tests drive.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
import yaml
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from rich.table import Table
from urllib3.exceptions import HTTPError

from gpufed.api.gpujob import TERMINAL_PHASES, GPUJob
from gpufed.api.labels import GROUP, VERSION
from gpufed.cli.jobs import wrap
from gpufed.cli.local import (
    Heartbeat,
    MemberLease,
    MemberLost,
    configure_logging,
    console,
    control_plane_options,
    err_console,
    fail_cleanly,
    print_summary,
)
from gpufed.sandbox.kueue_config import QUEUE_LABEL
from gpufed.sandbox.runtime import Sandbox, SandboxError, SandboxInfo

_REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_FLEET = _REPO_ROOT / "manifests" / "fleets" / "example.yaml"
EXAMPLE_JOBS = _REPO_ROOT / "manifests" / "examples"
#: Annotation of an example GPUJob saying how it must end.
EXPECT_ANNOTATION = "gpufed.io/expect"
_EXPECT_RE = re.compile(
    r"^(?P<phase>[A-Z][a-z]+)(?:\s+on\s+(?P<cluster>[a-z0-9][-a-z0-9.]*)|\s+(?P<unplaced>unplaced))?"
    r"(?:\s+because\s+(?P<reason>[A-Za-z][A-Za-z0-9]*))?$"
)

Progress = Callable[[str], None]


# --- expectations ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expectation:
    """How an example must end: ``phase`` (final ``status.phase``), ``cluster`` (the member
    it ran in) or ``unplaced`` (no member chosen), ``reason`` (a reason one of
    ``status.conditions`` carries)."""

    phase: str = "Succeeded"
    cluster: str | None = None
    unplaced: bool = False
    reason: str | None = None

    @classmethod
    def parse(cls, text: str) -> Expectation:
        """``"Succeeded on eu-nvl72"``, ``"Failed because BackoffLimitExceeded"``,
        ``"Failed unplaced because Rejected"``; ValueError naming the grammar otherwise."""
        m = _EXPECT_RE.match(text.strip())
        if m is None or m["phase"] not in ("Pending", "Placed", "Running", *TERMINAL_PHASES):
            raise ValueError(
                f"{EXPECT_ANNOTATION}: {text!r} is not '<Phase> [on <cluster> | unplaced] "
                "[because <Reason>]' (Phase: Succeeded, Failed, Lost, Running, Pending), e.g. "
                "'Succeeded on eu-nvl72' or 'Failed because BackoffLimitExceeded'"
            )
        return cls(m["phase"], m["cluster"], bool(m["unplaced"]), m["reason"])

    def unmet(self, obj: dict[str, Any]) -> str | None:
        """None when the GPUJob ``obj`` ended as expected, else what differs (one phrase)."""
        status = obj.get("status") or {}
        phase = status.get("phase", "Pending")
        cluster = status.get("cluster")
        misses = []
        if phase != self.phase:
            misses.append(f"phase {phase}, expected {self.phase}")
        if self.cluster and cluster != self.cluster:
            misses.append(f"ran on {cluster or 'no member'}, expected {self.cluster}")
        if self.unplaced and cluster:
            misses.append(f"placed on {cluster}, expected no member")
        reasons = {c.get("reason") for c in status.get("conditions") or []}
        if self.reason and self.reason not in reasons:
            have = ", ".join(sorted(r for r in reasons if r)) or "none"
            misses.append(f"no condition with reason {self.reason} (reasons: {have})")
        return "; ".join(misses) or None

    def __str__(self) -> str:
        text = self.phase
        if self.cluster:
            text += f" on {self.cluster}"
        if self.unplaced:
            text += " unplaced"
        if self.reason:
            text += f" because {self.reason}"
        return text


@dataclass
class Example:
    """One GPUJob to submit: ``obj`` (a GPUJob manifest with its namespace set), where it came
    from and what it must end as."""

    obj: dict[str, Any]
    source: str
    expect: Expectation

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def load_examples(directory: Path, *, namespace: str = "default") -> list[Example]:
    """Every document of ``directory/*.yaml`` (sorted by file name) as a GPUJob: GPUJobs as
    they are, plain Job/JobSet/PyTorchJob wrapped as ``gpufed submit`` does; documents labelled
    ``kueue.x-k8s.io/queue-name`` (for the MultiKueue peer) are skipped. Raises ValueError
    naming the file and document for anything else or a bad ``gpufed.io/expect``."""
    files = sorted(directory.glob("*.yaml"))
    if not files:
        raise ValueError(f"{directory}: no *.yaml files with GPUJobs")
    out: list[Example] = []
    seen: set[str] = set()
    for f in files:
        try:
            docs = [d for d in yaml.safe_load_all(f.read_text()) if d]
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"{f}: {exc}") from None
        for i, doc in enumerate(docs, 1):
            where = f"{f.name}" + (f" document {i}" if len(docs) > 1 else "")
            if not isinstance(doc, dict):
                raise ValueError(f"{where}: not a Kubernetes object")
            if QUEUE_LABEL in ((doc.get("metadata") or {}).get("labels") or {}):
                continue  # a Job for the MultiKueue peer sandbox (multikueue-job.yaml)
            try:
                obj = wrap(doc, namespace)
                GPUJob.model_validate(obj)
                ann = (obj["metadata"].get("annotations") or {}).get(EXPECT_ANNOTATION)
                expect = Expectation.parse(ann) if ann else Expectation()
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            ex = Example(obj, where, expect)
            if ex.key in seen:
                raise ValueError(f"{where}: a second GPUJob named {ex.key}")
            seen.add(ex.key)
            out.append(ex)
    return out


# --- running ------------------------------------------------------------------------------------


@dataclass
class RunResult:
    """Final GPUJob objects by ``namespace/name``, the keys given up on as stuck, and the
    seconds it all took."""

    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    stuck: set[str] = field(default_factory=set)
    seconds: float = 0.0


def _custom(api: k8s.ApiClient) -> Any:
    return k8s.CustomObjectsApi(api)


def ensure_namespaces(api: k8s.ApiClient, namespaces: set[str]) -> None:
    """Create the namespaces that do not exist yet on the hub."""
    core: Any = k8s.CoreV1Api(api)
    for ns in sorted(namespaces):
        try:
            core.create_namespace({"metadata": {"name": ns}})
        except ApiException as exc:
            if exc.status != 409:
                raise


def remove_previous(
    api: k8s.ApiClient, examples: list[Example], progress: Progress, timeout_s: float = 90.0
) -> None:
    """Delete GPUJobs with the examples' names (an earlier run) and wait until they are gone
    (the hub removes its finalizer once the member objects are deleted)."""
    custom = _custom(api)
    pending = []
    for ex in examples:
        try:
            custom.delete_namespaced_custom_object(GROUP, VERSION, ex.namespace, "gpujobs", ex.name)
            pending.append(ex)
        except ApiException as exc:
            if exc.status != 404:
                raise
    if not pending:
        return
    progress(f"removing {len(pending)} GPUJobs of an earlier run ...")
    deadline = time.monotonic() + timeout_s
    while pending:
        ex = pending[0]
        try:
            custom.get_namespaced_custom_object(GROUP, VERSION, ex.namespace, "gpujobs", ex.name)
        except ApiException as exc:
            if exc.status == 404:
                pending.pop(0)
                continue
            raise
        if time.monotonic() > deadline:
            raise SandboxError(
                f"GPUJob {ex.key} of an earlier run is still being deleted after "
                f"{timeout_s:.0f}s (is the hub running? `gpufed local status`)"
            )
        time.sleep(0.25)


def _phase_line(obj: dict[str, Any]) -> str:
    st = obj.get("status") or {}
    phase = str(st.get("phase", "Pending"))
    text = phase
    if st.get("cluster"):
        text += f" on {st['cluster']}"
    placement = st.get("placement") or {}
    if phase == "Placed" and placement.get("nvlinkDomains"):
        text += f" ({', '.join(placement['nvlinkDomains'])})"
    if phase in ("Pending", "Failed", "Lost") and st.get("message"):
        text += f": {st['message']}"
    return text


def run_jobs(
    api: k8s.ApiClient,
    examples: list[Example],
    *,
    progress: Progress,
    timeout_s: float = 300.0,
    stuck_s: float = 30.0,
) -> RunResult:
    """Submit ``examples`` to the hub (namespaces created, earlier runs removed) and follow
    them with a watch until each reached a terminal phase or its expected phase, or was
    Pending and unschedulable for ``stuck_s`` seconds, or ``timeout_s`` passed. Reports each
    phase change through ``progress``."""
    custom = _custom(api)
    ensure_namespaces(api, {ex.namespace for ex in examples})
    remove_previous(api, examples, progress)
    wanted = {ex.key: ex for ex in examples}
    result = RunResult()
    t0 = time.monotonic()
    for ex in examples:
        custom.create_namespaced_custom_object(GROUP, VERSION, ex.namespace, "gpujobs", ex.obj)
    progress(f"submitted {len(examples)} GPUJobs; following them on the hub ...")
    last: dict[str, str] = {}
    pending_since: dict[str, float] = {}

    def done(key: str) -> bool:
        obj = result.jobs.get(key)
        phase = ((obj or {}).get("status") or {}).get("phase", "Pending")
        # A job expected to keep running (a service) is done once it runs.
        return phase in TERMINAL_PHASES or key in result.stuck or phase == wanted[key].expect.phase

    def observe(obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if key not in wanted:
            return
        result.jobs[key] = obj
        line = _phase_line(obj)
        if last.get(key) != line:
            last[key] = line
            progress(f"  {time.monotonic() - t0:5.1f}s  {key:<32} {line}")
        st = obj.get("status") or {}
        unschedulable = (
            st.get("phase", "Pending") == "Pending"
            and (st.get("placement") or {}).get("outcome") == "Unschedulable"
        )
        if unschedulable:
            pending_since.setdefault(key, time.monotonic())
        else:
            pending_since.pop(key, None)

    resource_version = ""
    while not all(done(k) for k in wanted):
        now = time.monotonic()
        for key, since in pending_since.items():
            if now - since >= stuck_s and key not in result.stuck:
                result.stuck.add(key)
                progress(f"  {now - t0:5.1f}s  {key:<32} stuck: unschedulable for {stuck_s:.0f}s")
        left = timeout_s - (now - t0)
        if left <= 0:
            for key in wanted:
                if not done(key):
                    result.stuck.add(key)
                    progress(f"  {key}: not finished after {timeout_s:.0f}s")
            break
        try:
            if not resource_version:
                listed = custom.list_cluster_custom_object(GROUP, VERSION, "gpujobs")
                for obj in listed.get("items", []):
                    observe(obj)
                resource_version = listed["metadata"]["resourceVersion"]
                continue
            w: Any = k8s_watch.Watch()  # type: ignore[no-untyped-call]
            for ev in w.stream(
                custom.list_cluster_custom_object,
                GROUP,
                VERSION,
                "gpujobs",
                resource_version=resource_version,
                timeout_seconds=max(1, min(5, int(left))),
                allow_watch_bookmarks=True,
            ):
                obj = ev["object"]
                resource_version = (obj.get("metadata") or {}).get(
                    "resourceVersion", resource_version
                )
                if ev["type"] in ("ADDED", "MODIFIED"):
                    observe(obj)
                if all(done(k) for k in wanted):
                    w.stop()
        except ApiException as exc:
            if exc.status != 410:
                raise
            resource_version = ""  # expired: list again
        except (HTTPError, OSError):
            time.sleep(0.5)  # the hub API server is briefly unreachable: try again
            resource_version = ""
    result.seconds = round(time.monotonic() - t0, 1)
    return result


# --- the table ----------------------------------------------------------------------------------


def demo_rows(examples: list[Example], result: RunResult) -> list[dict[str, Any]]:
    """One object per example: ``job`` (namespace/name), ``gpus`` (whole GPUs), ``topology``
    (``spec.placement.topology.nvlink``), ``cluster`` (None when not placed), ``domain`` (the
    NVLink domains used, comma-separated; None when none), ``phase``, ``placement_ms``,
    ``dispatch_ms`` (``status.timings``)."""
    rows = []
    for ex in examples:
        obj = result.jobs.get(ex.key) or ex.obj
        st = obj.get("status") or {}
        placement = st.get("placement") or {}
        timings = st.get("timings") or {}
        topology = ((ex.obj["spec"].get("placement") or {}).get("topology") or {}).get(
            "nvlink", "Preferred"
        )
        domains = placement.get("nvlinkDomains") or []
        rows.append(
            {
                "job": ex.key,
                "gpus": st.get("gpus"),
                "topology": topology,
                "cluster": st.get("cluster"),
                "domain": ", ".join(domains) if domains else None,
                "phase": st.get("phase", "Pending"),
                "placement_ms": timings.get("placementMs"),
                "dispatch_ms": timings.get("dispatchMs"),
            }
        )
    return rows


def _mig_text(obj: dict[str, Any]) -> str:
    """``" + 2 x 1g.10gb"`` for MIG slices in the placed pod sets ("" when none)."""
    slices: dict[str, int] = {}
    for ps in ((obj.get("status") or {}).get("placement") or {}).get("podSets") or []:
        pods = sum((ps.get("nodes") or {}).values())
        for res, n in (ps.get("requests") or {}).items():
            if res.startswith("nvidia.com/mig-"):
                prof = res.removeprefix("nvidia.com/mig-")
                slices[prof] = slices.get(prof, 0) + n * pods
    return "".join(f" + {n} x {p}" for p, n in sorted(slices.items()))


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


def print_table(examples: list[Example], result: RunResult, rows: list[dict[str, Any]]) -> None:
    table = Table(title="gpufed demo: GPUJobs on the hub", title_justify="left")
    for col in (
        "job",
        "GPUs",
        "topology",
        "cluster",
        "NVLink domain",
        "phase",
        "placement ms",
        "dispatch ms",
        "expected",
    ):
        table.add_column(col, justify="right" if col.endswith("ms") or col == "GPUs" else "left")
    for ex, row in zip(examples, rows, strict=True):
        obj = result.jobs.get(ex.key) or ex.obj
        miss = ex.expect.unmet(obj)
        domain = row["domain"] or "-"
        if len(domain) > 36:
            domain = domain[:33] + "..."
        gpus = "-" if row["gpus"] is None else str(row["gpus"])
        table.add_row(
            row["job"],
            gpus + _mig_text(obj),
            row["topology"],
            row["cluster"] or "-",
            domain,
            row["phase"],
            _ms(row["placement_ms"]),
            _ms(row["dispatch_ms"]),
            "[green]yes[/green]" if miss is None else f"[red]no[/red]: {miss}",
        )
    console.print(table)


def print_how_to_look_around(info: SandboxInfo, examples: list[Example]) -> None:
    kubectl = info.bin_dir / "kubectl"
    kubectl_cmd = str(kubectl) if kubectl.exists() else "kubectl"
    have_kubectl = kubectl.exists() or shutil.which("kubectl") is not None
    sd = f" --state-dir {info.state_dir}"
    rejected = next((ex.key for ex in examples if ex.expect.unplaced), examples[0].key)
    # `make demo` runs .venv/bin/gpufed; a user's shell may not have it on PATH yet.
    venv_bin = Path(sys.executable).parent
    activate = venv_bin / "activate"
    on_path = shutil.which("gpufed") == str(venv_bin / "gpufed")
    path_hint = "" if on_path or not activate.exists() else f"  source {activate}\n"
    console.print(
        "\nThe sandbox keeps running. Look around:\n"
        + path_hint
        + f"  export KUBECONFIG={info.kubeconfig}    # contexts: {', '.join(info.clusters)}\n"
        "  gpufed get jobs -A                    # GPUJobs on the hub\n"
        "  gpufed get clusters                   # members: Ready, GPUs free/total, NVLink block\n"
        f"  gpufed explain {rejected:<22} # why it went where it went, member by member\n"
        f"  {kubectl_cmd} get gpujobs -A; {kubectl_cmd} get memberclusters\n"
        + (
            ""
            if have_kubectl
            else "      (kubectl is optional: `gpufed local build --with-kubectl` builds one)\n"
        )
        + f"  {kubectl_cmd} --context eu-nvl72 get jobs,pods -A   # the member copies\n"
        f"  gpufed local status{sd}   # processes, memory, logs\n"
        f"  gpufed local kill hub{sd}; gpufed local start hub{sd}   # a fault drill\n"
        f"Stop it: gpufed local down{sd}",
        soft_wrap=True,
    )


# --- the command --------------------------------------------------------------------------------


def _sandbox_for_demo(
    sandbox: Sandbox, fleet: Path | None, options: Any, progress: Progress
) -> SandboxInfo:
    """The running sandbox of ``sandbox.state_dir``, or a new one with ``fleet`` (default: the
    example fleet). Raises :class:`SandboxError` when the running one cannot serve: no hub, or
    another fleet than the ``--fleet`` the user named."""
    if sandbox.running_components():
        info = sandbox.info()
        if info.control_plane is None:
            raise SandboxError(
                f"the sandbox running in {sandbox.state_dir} has no hub or agents (started with "
                "--clusters-only): stop it with `gpufed local down` or use another --state-dir"
            )
        if fleet is not None and fleet.resolve() != Path(info.fleet_file).resolve():
            raise SandboxError(
                f"the sandbox running in {sandbox.state_dir} has the fleet {info.fleet_file}, "
                f"not {fleet}: stop it with `gpufed local down` first, or pass another "
                "--state-dir to run a second sandbox"
            )
        progress(f"reusing the sandbox running in {sandbox.state_dir} ({info.fleet_file})")
        sandbox.wait_control_plane(60)
        return info
    info = sandbox.up(fleet or EXAMPLE_FLEET, control_plane=options)
    progress(f"sandbox up in {info.up_seconds:.1f}s: hub and {len(info.members)} agents running")
    return info


def demo(
    fleet: Path | None = typer.Option(
        None,
        "--fleet",
        "-f",
        show_default=False,
        help="Fleet spec to bring up (default manifests/fleets/example.yaml).",
    ),
    jobs: Path = typer.Option(
        EXAMPLE_JOBS, "--jobs", help="Directory of GPUJob YAML files (*.yaml) to submit."
    ),
    state_dir: Path | None = typer.Option(
        None,
        "--state-dir",
        envvar="GPUFED_STATE_DIR",
        show_default=False,
        help="Sandbox state directory (default ~/.local/state/gpufed/sandbox).",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Also print the table as a JSON list on the last line."
    ),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait for the jobs."),
    stuck: float = typer.Option(
        30.0, "--stuck", help="Give up on a job Pending and unschedulable this many seconds."
    ),
    member_lease: float = MemberLease,
    member_lost_timeout: float = MemberLost,
    heartbeat: float = Heartbeat,
    down: bool = typer.Option(False, "--down", help="Stop the sandbox at the end."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Bring up the sandbox with hub and agents, submit the example GPUJobs, follow them to
    the end and print where each ran (exit 0 when each ended as its gpufed.io/expect says)."""
    configure_logging(verbose)
    options = control_plane_options(False, member_lease, member_lost_timeout, heartbeat)
    started = time.monotonic()

    def progress(msg: str) -> None:
        console.print(msg, soft_wrap=True, markup=False)

    try:
        examples = load_examples(jobs)
    except ValueError as exc:
        err_console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(1) from None
    with fail_cleanly():
        sandbox = Sandbox(state_dir, progress=progress)
        info = _sandbox_for_demo(sandbox, fleet, options, progress)
        print_summary(info, sandbox.inventory())
        api = info.api_client("hub")
        try:
            result = run_jobs(api, examples, progress=progress, timeout_s=timeout, stuck_s=stuck)
        except (ApiException, HTTPError, OSError) as exc:
            raise SandboxError(f"talking to the hub API server failed: {exc}") from None
        finally:
            api.close()  # type: ignore[no-untyped-call]
    rows = demo_rows(examples, result)
    console.print()
    print_table(examples, result, rows)
    misses = [(ex, m) for ex in examples if (m := ex.expect.unmet(result.jobs.get(ex.key, ex.obj)))]
    total = time.monotonic() - started
    if misses:
        console.print(
            f"[red]{len(misses)} of {len(examples)} jobs did not end as expected[/red] "
            f"(jobs {result.seconds:.1f}s, demo {total:.1f}s):"
        )
        for ex, m in misses:
            console.print(f"  {ex.key} ({ex.source}): expected {ex.expect}: {m}", soft_wrap=True)
    else:
        console.print(
            f"[green]all {len(examples)} jobs ended as expected[/green] "
            f"(jobs {result.seconds:.1f}s, demo {total:.1f}s)"
        )
    if down:
        with fail_cleanly():
            sandbox.down()
        console.print("sandbox stopped")
    else:
        print_how_to_look_around(info, examples)
    if as_json:
        typer.echo(json.dumps(rows))
    raise typer.Exit(1 if misses else 0)
