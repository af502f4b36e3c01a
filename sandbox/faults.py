"""The chaos soak's fault injector: a seeded schedule of sandbox faults, and their execution.

Not part of the product: it drives sandbox processes (:class:`~gpufed.sandbox.supervisor.
Supervisor` components) and member API servers as an operator's bad day would. Kinds
(:data:`FAULT_KINDS`), each held ``hold_s`` seconds then undone:

* ``leader-kill``: SIGKILL the leading hub replica (:class:`~gpufed.sandbox.hubpair.HubPair`),
  start it again after ``hold_s``;
* ``leader-pause``: SIGSTOP the leader for ``hold_s`` (longer than its lease), then SIGCONT;
* ``agent-kill``: SIGKILL a member's agent, start it again;
* ``etcd-restart``: SIGKILL the sandbox's etcd (under every API server and the hub), start it;
* ``apiserver-stop``: stop a member's kube-apiserver for about a minute;
* ``node-delete``: delete a member's node, create it again (from the fleet) after ``hold_s``;
* ``kwok-stop``: stop a member's kwok for 10-90 s and mark its nodes ``Ready=False`` (kwok,
  stopped, cannot turn them back; a real kubelet outage reads the same), start kwok again
  (it turns them Ready);
* ``gpu-withdraw``: patch a node's ``nvidia.com/gpu`` capacity and allocatable to 0 (a device
  plugin restart), put them back.

:func:`fault_schedule` is pure: the same seed, duration, kinds and fleet give the same list.
:class:`FaultRunner` runs it against a live sandbox, one thread per fault; faults of one target
(the hub, etcd, a member) wait for each other, others overlap. Each executed fault becomes a
:class:`FaultRecord` with wall-clock start and end (``end``: when it was undone).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kubernetes import client as k8s

from gpufed.api.fleet import FleetSpec, node_specs
from gpufed.api.labels import JOB_UID_LABEL
from gpufed.sandbox.controlplane import agent_component
from gpufed.sandbox.hubpair import HubPair
from gpufed.sandbox.nodes import create_nodes
from gpufed.sandbox.runtime import Sandbox

FAULT_KINDS = (
    "leader-kill",
    "leader-pause",
    "agent-kill",
    "etcd-restart",
    "apiserver-stop",
    "node-delete",
    "kwok-stop",
    "gpu-withdraw",
)
GPU = "nvidia.com/gpu"
#: Annotation :meth:`FaultRunner.nudge_pods` sets (a sandbox artefact, never read by gpufed).
NUDGE_ANNOTATION = "sandbox.gpufed.io/kwok-nudge"


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: ``at_s`` seconds after the soak starts, ``kind`` (one of
    :data:`FAULT_KINDS`) on ``target`` (``hub``, ``etcd``, a member, or ``member/node``), undone
    ``hold_s`` seconds later."""

    at_s: float
    kind: str
    target: str
    hold_s: float

    @property
    def lock_key(self) -> str:
        """Faults with the same key never overlap (the hub, etcd, or one member)."""
        return self.target.split("/", 1)[0]


@dataclass
class FaultRecord:
    """An executed fault: scheduled ``at_s``, wall-clock ``start``/``end`` (epoch seconds; end
    = undone), ``detail`` (what was hit, e.g. which replica led) and ``error`` (why it could not
    be applied or undone, empty when fine)."""

    kind: str
    target: str
    at_s: float
    hold_s: float
    start: float = 0.0
    end: float = 0.0
    detail: str = ""
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_kinds(text: str | None) -> tuple[str, ...]:
    """``--faults`` as a tuple of kinds (None or ``all``: every kind). ValueError naming the
    unknown kinds and the known ones."""
    if text is None or text.strip() in ("", "all"):
        return FAULT_KINDS
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown:
        raise ValueError(
            f"--faults: unknown fault kind(s) {', '.join(unknown)}; "
            f"choose among {', '.join(FAULT_KINDS)} (comma-separated) or 'all'"
        )
    return kinds


def _hold(kind: str, rng: random.Random, leader_lease_s: float) -> float:
    lo, hi = {
        "leader-kill": (2.0, 10.0),
        "leader-pause": (leader_lease_s + 2.0, leader_lease_s + 10.0),
        "agent-kill": (1.0, 10.0),
        "etcd-restart": (1.0, 5.0),
        "apiserver-stop": (45.0, 75.0),
        "node-delete": (20.0, 60.0),
        "kwok-stop": (10.0, 90.0),
        "gpu-withdraw": (5.0, 30.0),
    }[kind]
    return round(rng.uniform(lo, hi), 1)


def fault_schedule(
    seed: int,
    duration_s: float,
    kinds: Sequence[str],
    fleet: FleetSpec,
    *,
    leader_lease_s: float = 5.0,
    warmup_s: float = 20.0,
    gap_s: tuple[float, float] = (15.0, 40.0),
    quiet_tail_s: float = 30.0,
) -> list[Fault]:
    """The seeded fault schedule: the first after ``warmup_s``, then one every ``gap_s``
    (uniform) seconds, none starting after ``duration_s - quiet_tail_s`` and none still held
    at ``duration_s``; kinds drawn uniformly from ``kinds``, targets from the fleet's members
    and nodes. Pure: same arguments, same list."""
    if not kinds:
        return []
    rng = random.Random(seed)
    members = [c.name for c in fleet.clusters]
    nodes = {c.name: [n.name for n in node_specs(c)] for c in fleet.clusters}
    out: list[Fault] = []
    t = warmup_s
    while t <= duration_s - quiet_tail_s:
        kind = kinds[rng.randrange(len(kinds))]
        hold = _hold(kind, rng, leader_lease_s)
        member = members[rng.randrange(len(members))]
        if kind in ("leader-kill", "leader-pause"):
            target = "hub"
        elif kind == "etcd-restart":
            target = "etcd"
        elif kind in ("node-delete", "gpu-withdraw"):
            choices = nodes[member]
            target = f"{member}/{choices[rng.randrange(len(choices))]}"
        else:
            target = member
        hold = min(hold, max(1.0, duration_s - t - 5.0))
        out.append(Fault(round(t, 1), kind, target, hold))
        t += rng.uniform(*gap_s)
    return out


@dataclass
class FaultRunner:
    """Runs faults against a live sandbox (module docstring). ``pair`` is the two hub replicas
    (leader faults need it); ``records`` grows as faults are applied (thread-safe reads after
    :meth:`join`)."""

    sandbox: Sandbox
    fleet: FleetSpec
    pair: HubPair | None = None
    records: list[FaultRecord] = field(default_factory=list)
    on_record: Callable[[FaultRecord], None] | None = None

    def __post_init__(self) -> None:
        info = self.sandbox.info()
        self._core: dict[str, Any] = {m: k8s.CoreV1Api(info.api_client(m)) for m in info.members}
        self._api = {m: info.api_client(m) for m in info.members}
        self._locks: dict[str, threading.Lock] = {}
        self._threads: list[threading.Thread] = []
        self._mutex = threading.Lock()

    # --- scheduling --------------------------------------------------------------------------

    def start(self, schedule: Sequence[Fault], t0: float) -> None:
        """Run every fault of ``schedule`` at ``t0 + at_s`` (``time.time()`` clock), each in
        its own daemon thread; returns at once."""
        for fault in schedule:
            th = threading.Thread(target=self._run_at, args=(fault, t0), daemon=True)
            th.start()
            self._threads.append(th)

    def join(self, timeout_s: float | None = None) -> None:
        """Wait until every started fault was undone (or ``timeout_s`` passed)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for th in self._threads:
            th.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _run_at(self, fault: Fault, t0: float) -> None:
        time.sleep(max(0.0, t0 + fault.at_s - time.time()))
        with self._mutex:
            lock = self._locks.setdefault(fault.lock_key, threading.Lock())
        with lock:
            self.apply(fault)

    # --- one fault ------------------------------------------------------------------------------

    def apply(self, fault: Fault) -> FaultRecord:
        """Apply ``fault``, hold it, undo it; returns (and keeps) its record. Never raises: a
        fault that could not be applied or undone says why in ``error``."""
        rec = FaultRecord(fault.kind, fault.target, fault.at_s, fault.hold_s, start=time.time())
        action = getattr(self, "_" + fault.kind.replace("-", "_"))
        try:
            action(fault, rec)
        except Exception as exc:
            rec.error = f"{type(exc).__name__}: {exc}"[:500]
        rec.end = time.time()
        with self._mutex:
            self.records.append(rec)
        if self.on_record is not None:
            self.on_record(rec)
        return rec

    def _restart(self, component: str, hold_s: float, *, kill: bool = True) -> None:
        sup = self.sandbox.supervisor
        try:
            if kill:
                sup.kill(component)
            else:
                sup.stop(component)
            time.sleep(hold_s)
        finally:
            sup.start(component, timeout=120)
        if component == "etcd":
            for member in self._core:
                self._nudge_soon(member)
        elif component.startswith("apiserver/"):
            self._nudge_soon(component.split("/", 1)[1])

    def _nudge_soon(self, member: str) -> None:
        """Nudge ``member``'s pods 3 s from now and again 15 s later: kwok ignores updates
        that arrive before its informers synced again."""
        time.sleep(3)
        self.nudge_pods(member)

        def again() -> None:
            with contextlib.suppress(Exception):
                self.nudge_pods(member)

        timer = threading.Timer(15, again)
        timer.daemon = True
        timer.start()

    def nudge_pods(self, member: str) -> int:
        """Touch (annotate) every gpufed pod of ``member`` so kwok plays it again; returns how
        many. kwok 0.8 drops the pending stages of pods it saw before it restarted, lost its
        watch, or saw their node deleted: such a pod would run (or stay Terminating) for ever,
        which a real kubelet does not do. An update event makes kwok match the pod's stage
        again (its run time then counts from the nudge)."""
        core = self._core[member]
        stamp = {"metadata": {"annotations": {NUDGE_ANNOTATION: f"{time.time():.3f}"}}}
        done = 0
        deadline = time.monotonic() + 60
        while True:
            try:
                pods = core.list_pod_for_all_namespaces(label_selector=JOB_UID_LABEL).items
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)
        for p in pods:
            if p.status.phase in ("Succeeded", "Failed"):
                continue
            with contextlib.suppress(Exception):
                core.patch_namespaced_pod(p.metadata.name, p.metadata.namespace, stamp)
                done += 1
        return done

    def _leader(self, rec: FaultRecord) -> str:
        if self.pair is None:
            raise RuntimeError("leader faults need the two hub replicas (HubPair)")
        deadline = time.monotonic() + 30
        while (leader := self.pair.leader()) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("no hub replica led for 30 s: nothing to hit")
            time.sleep(0.5)
        rec.detail = leader
        return leader

    def _leader_kill(self, fault: Fault, rec: FaultRecord) -> None:
        self._restart(self._leader(rec), fault.hold_s)

    def _leader_pause(self, fault: Fault, rec: FaultRecord) -> None:
        leader = self._leader(rec)
        pid = self.sandbox.supervisor.pid(leader)
        if pid is None:
            raise RuntimeError(f"{leader} is not running")
        os.killpg(pid, signal.SIGSTOP)
        try:
            time.sleep(fault.hold_s)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGCONT)

    def _agent_kill(self, fault: Fault, rec: FaultRecord) -> None:
        self._restart(agent_component(fault.target), fault.hold_s)

    def _etcd_restart(self, fault: Fault, rec: FaultRecord) -> None:
        self._restart("etcd", fault.hold_s)

    def _apiserver_stop(self, fault: Fault, rec: FaultRecord) -> None:
        self._restart(f"apiserver/{fault.target}", fault.hold_s, kill=False)

    def _node_delete(self, fault: Fault, rec: FaultRecord) -> None:
        member, node = fault.target.split("/", 1)
        [cluster] = [c for c in self.fleet.clusters if c.name == member]
        specs = [s for s in node_specs(cluster) if s.name == node]
        self._core[member].delete_node(node)
        try:
            time.sleep(fault.hold_s)
        finally:
            deadline = time.monotonic() + 60
            while True:  # the API server may itself be restarting (etcd): try for a minute
                try:
                    create_nodes(self._api[member], specs)
                    self._nudge_soon(member)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(2)

    def _kwok_stop(self, fault: Fault, rec: FaultRecord) -> None:
        self.hold_not_ready(fault.target, fault.hold_s, status="False")

    def hold_not_ready(
        self, member: str, hold_s: float, *, status: str = "False", nodes: Sequence[str] = ()
    ) -> None:
        """Stop ``member``'s kwok, set ``Ready`` to ``status`` (``False`` or ``Unknown``) on
        ``nodes`` (default: every node of the member), wait ``hold_s``, start kwok again (it
        turns the nodes Ready). Used by the soak and by the issue 24 drills."""
        sup = self.sandbox.supervisor
        sup.stop(f"kwok/{member}")
        try:
            core = self._core[member]
            names = list(nodes) or [n.metadata.name for n in core.list_node().items]
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            cond = {
                "type": "Ready",
                "status": status,
                "reason": "NodeStatusUnknown" if status == "Unknown" else "KubeletNotReady",
                "message": "sandbox fault: kwok stopped",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            for name in names:
                with contextlib.suppress(Exception):
                    core.patch_node_status(name, {"status": {"conditions": [cond]}})
            time.sleep(hold_s)
        finally:
            sup.start(f"kwok/{member}", timeout=120)
        self._nudge_soon(member)

    def _gpu_withdraw(self, fault: Fault, rec: FaultRecord) -> None:
        member, node = fault.target.split("/", 1)
        core = self._core[member]
        st = core.read_node_status(node).status
        before = {
            "capacity": {GPU: (st.capacity or {}).get(GPU, "0")},
            "allocatable": {GPU: (st.allocatable or {}).get(GPU, "0")},
        }
        rec.detail = f"{GPU} {before['allocatable'][GPU]} -> 0"
        core.patch_node_status(
            node, {"status": {"capacity": {GPU: "0"}, "allocatable": {GPU: "0"}}}
        )
        try:
            time.sleep(fault.hold_s)
        finally:
            deadline = time.monotonic() + 60
            while True:
                try:
                    core.patch_node_status(node, {"status": before})
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(2)
