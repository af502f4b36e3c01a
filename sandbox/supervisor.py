"""Process supervisor: a registry of named components, each one OS process, kept in a state dir.

A component (``etcd``, ``apiserver/<cluster>``, ``controller-manager/<cluster>``,
``scheduler/<cluster>``, ``kwok/<cluster>``; later ``hub`` and ``agent/<cluster>``) is a
:class:`ComponentSpec` (argv, env, ports, readiness probe) written to
``<state>/components/<name>.json`` when registered, so any later process (``gpufed local
kill|start COMPONENT``, a test) can stop or restart it. Runtime files::

    <state>/components/<name>.json   spec (argv, env, ports, probe)
    <state>/run/<name>.pid           {"pid", "create_time", "boot_id", "start_ticks"} while started
    <state>/logs/<name>.log          stdout+stderr, appended across restarts

Processes run in their own session (they outlive the command that started them, and Ctrl-C in a
terminal does not reach them) and are identified by pid *and* start time (:mod:`.procid`: boot id
and clock ticks since boot, so a wall-clock step does not lose them), so a recycled pid is never
signalled. Callers: :mod:`gpufed.sandbox.runtime`; tests of later components.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import psutil
import structlog
from pydantic import BaseModel, ConfigDict, Field

from gpufed.api.errors import GpufedError
from gpufed.sandbox import procid

log = structlog.get_logger("gpufed.sandbox.supervisor")

# Popen objects of children started by this process, kept so they are reaped (no zombies) and
# never garbage-collected while running.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
# Exit codes of reaped children (pid -> code), for error messages.
_EXITED: dict[int, int] = {}


class Probe(BaseModel):
    """How to tell that a started component is ready.

    ``http``: GET ``url`` answers 200 (TLS not verified: a readiness check, not a trust
    decision); ``process``: the process is still alive ``settle_s`` seconds after start.
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["http", "process"] = "process"
    url: str = ""
    settle_s: float = 1.0


class ComponentSpec(BaseModel):
    """One supervised process. ``env`` is added to the supervisor's environment; ``ports`` are the
    TCP ports on 127.0.0.1 it listens on (checked free after a stop); ``start_timeout_s`` bounds
    the wait for readiness."""

    model_config = ConfigDict(frozen=True)

    name: str
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    ports: list[int] = Field(default_factory=list)
    probe: Probe = Probe()
    start_timeout_s: float = 60.0


class ComponentStatus(BaseModel):
    """A component as ``status`` reports it: ``rss_bytes`` is the resident memory of the process
    (and its children), 0 when not running."""

    name: str
    running: bool
    pid: int | None = None
    rss_bytes: int = 0
    cpu_seconds: float = 0.0
    ports: list[int] = Field(default_factory=list)
    log: str


class ComponentError(GpufedError, RuntimeError):
    """A component failed to start, died, or did not become ready. The message names the
    component, the cause (port clash, exit code, timeout) and the log file."""

    def __init__(self, name: str, cause: str, log_path: Path, tail: Sequence[str] = ()) -> None:
        self.component = name
        self.cause = cause
        self.log_path = log_path
        self.tail = list(tail)
        text = f"{name}: {cause} (log: {log_path})"
        if self.tail:
            text += "\n  last log lines:\n" + "\n".join(f"    {t}" for t in self.tail)
        super().__init__(text)


def log_tail(path: Path, lines: int = 8) -> list[str]:
    """The last non-empty lines of a log file ([] when absent)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            text = fh.read().decode(errors="replace")
    except OSError:
        return []
    return [ln.rstrip() for ln in text.splitlines() if ln.strip()][-lines:]


def _clash(tail: Iterable[str], ports: Sequence[int]) -> str | None:
    for line in tail:
        if "address already in use" in line.lower():
            hits = [p for p in ports if f":{p}" in line]
            where = f"port {hits[0]}" if hits else f"one of its ports {list(ports)}"
            return f"{where} on 127.0.0.1 is already in use by another process (port clash)"
    return None


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing accepts connections on ``host:port`` and it can be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class Supervisor:
    """Start, stop, kill and inspect the components registered under ``state_dir``.

    Every method works from the files in ``state_dir``, so a fresh ``Supervisor`` in another
    process sees the same components.
    """

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)

    # --- files ----------------------------------------------------------------------------------

    def _spec_path(self, name: str) -> Path:
        return self.state_dir / "components" / f"{name}.json"

    def _pid_path(self, name: str) -> Path:
        return self.state_dir / "run" / f"{name}.pid"

    def log_path(self, name: str) -> Path:
        """``<state>/logs/<name>.log`` (``apiserver/hub`` -> ``logs/apiserver/hub.log``)."""
        return self.state_dir / "logs" / f"{name}.log"

    def _index_path(self) -> Path:
        return self.state_dir / "components" / "index.json"

    # --- registry -------------------------------------------------------------------------------

    def register(self, spec: ComponentSpec) -> None:
        """Add or replace a component (written to disk; start order = registration order)."""
        path = self._spec_path(spec.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(spec.model_dump_json(indent=2) + "\n")
        names = self.names()
        if spec.name not in names:
            names.append(spec.name)
            self._index_path().write_text(json.dumps(names, indent=2) + "\n")

    def unregister(self, name: str) -> None:
        """Remove a component that is not running from the registry (its log stays);
        RuntimeError when it runs (stop it first). No-op for an unknown name."""
        if self.is_running(name):
            raise RuntimeError(f"component {name!r} is running: stop it before unregistering")
        names = self.names()
        if name in names:
            names.remove(name)
            self._index_path().write_text(json.dumps(names, indent=2) + "\n")
        self._spec_path(name).unlink(missing_ok=True)
        self._pid_path(name).unlink(missing_ok=True)

    def names(self) -> list[str]:
        """Registered component names in registration order."""
        try:
            data = json.loads(self._index_path().read_text())
        except (OSError, ValueError):
            return []
        return [str(n) for n in data] if isinstance(data, list) else []

    def spec(self, name: str) -> ComponentSpec:
        """The registered spec; KeyError naming the known components otherwise."""
        try:
            return ComponentSpec.model_validate_json(self._spec_path(name).read_text())
        except OSError:
            known = ", ".join(self.names()) or "none"
            raise KeyError(
                f"no component {name!r} in {self.state_dir} (components: {known})"
            ) from None

    # --- process identity -----------------------------------------------------------------------

    def _process(self, name: str) -> psutil.Process | None:
        try:
            rec = json.loads(self._pid_path(name).read_text())
            proc = psutil.Process(int(rec["pid"]))
            if not procid.same_process(proc, rec):
                return None  # the pid was recycled by an unrelated process
            if proc.status() == psutil.STATUS_ZOMBIE:
                _reap(proc.pid)
                return None
            return proc
        except (OSError, ValueError, KeyError, TypeError, psutil.Error):
            return None

    def pid(self, name: str) -> int | None:
        """Pid of the running component, else None."""
        proc = self._process(name)
        return proc.pid if proc else None

    def is_running(self, name: str) -> bool:
        """Whether the component's process (same pid and start time as recorded) is alive."""
        return self._process(name) is not None

    # --- start ------------------------------------------------------------------------------------

    def start(self, name: str, *, wait: bool = True, timeout: float | None = None) -> int:
        """Start a registered component; with ``wait``, block until its probe passes.

        Returns the pid. Already running: returns its pid. Raises :class:`ComponentError` when the
        binary is missing, the process exits (port clash, bad flag) or the probe times out; the
        process is then stopped.
        """
        spec = self.spec(name)
        if (proc := self._process(name)) is not None:
            return proc.pid
        log_path = self.log_path(name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        exe = spec.argv[0]
        if not os.access(exe, os.X_OK):
            raise ComponentError(
                name,
                f"binary {exe} is missing or not executable; run `gpufed local build`",
                log_path,
            )
        env = {**os.environ, **spec.env}
        with open(log_path, "ab") as logf:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            logf.write(f"==== gpufed: starting {name} at {stamp}: {' '.join(spec.argv)}\n".encode())
            logf.flush()
            try:
                popen = subprocess.Popen(
                    spec.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=spec.cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ComponentError(name, f"cannot execute {exe}: {exc}", log_path) from None
        _CHILDREN[popen.pid] = popen
        try:
            record = procid.identity(popen.pid)
        except psutil.Error:  # already gone: the record names nothing alive
            record = {"pid": popen.pid, "create_time": time.time()}
        pid_path = self._pid_path(name)
        pid_path.parent.mkdir(parents=True, exist_ok=True)
        pid_path.write_text(json.dumps(record) + "\n")
        log.info("component.started", component=name, pid=popen.pid)
        if wait:
            self.wait_ready([name], timeout=timeout)
        return popen.pid

    def start_many(self, names: Sequence[str], *, timeout: float | None = None) -> None:
        """Start several components at once and wait until all are ready (fails fast: the first
        one that dies or times out raises :class:`ComponentError`)."""
        for n in names:
            self.start(n, wait=False)
        self.wait_ready(names, timeout=timeout)

    def wait_ready(self, names: Sequence[str], *, timeout: float | None = None) -> None:
        """Poll each component's probe until all pass. Raises :class:`ComponentError` (after
        stopping that component) when one exits or exceeds its ``start_timeout_s``/``timeout``."""
        specs = {n: self.spec(n) for n in names}
        started = time.monotonic()
        pending = list(names)
        while pending:
            # Deaths first: a process that exited must not wait behind another one's probe.
            for n in pending:
                if not self.is_running(n):
                    code = _exit_code(self._recorded_pid(n))
                    tail = log_tail(self.log_path(n))
                    cause = _clash(tail, specs[n].ports) or (
                        "exited while starting" + (f" with code {code}" if code is not None else "")
                    )
                    raise ComponentError(n, cause, self.log_path(n), tail)
            for n in list(pending):
                spec = specs[n]
                if _probe_ok(spec.probe, time.monotonic() - started):
                    log.info(
                        "component.ready", component=n, seconds=round(time.monotonic() - started, 1)
                    )
                    pending.remove(n)
                    continue
                limit = timeout if timeout is not None else spec.start_timeout_s
                if time.monotonic() - started > limit:
                    tail = log_tail(self.log_path(n))
                    self.stop(n)
                    raise ComponentError(
                        n,
                        f"not ready after {limit:.0f}s ({_probe_text(spec.probe)})",
                        self.log_path(n),
                        tail,
                    )
            if pending:
                time.sleep(0.2)

    def _recorded_pid(self, name: str) -> int | None:
        try:
            return int(json.loads(self._pid_path(name).read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    # --- stop -----------------------------------------------------------------------------------

    def stop(self, name: str, *, grace_s: float = 10.0) -> None:
        """SIGTERM the component's process group, SIGKILL after ``grace_s``; wait until its ports
        are free. No-op when it is not running."""
        self._signal_and_wait(name, signal.SIGTERM, grace_s)

    def kill(self, name: str) -> None:
        """SIGKILL the component at once (a crash, for failure tests); wait until it is gone."""
        self._signal_and_wait(name, signal.SIGKILL, 0.0)

    def _signal_and_wait(self, name: str, sig: signal.Signals, grace_s: float) -> None:
        proc = self._process(name)
        if proc is not None:
            log.info("component.stopping", component=name, pid=proc.pid, signal=sig.name)
            family = _family(proc)
            _signal_group(proc.pid, sig)
            gone = _wait_gone(proc, grace_s)
            if not gone:
                _signal_group(proc.pid, signal.SIGKILL)
                _wait_gone(proc, 10.0)
            _reap(proc.pid)
            _wait_family_gone(family, 10.0)
            with contextlib.suppress(KeyError):
                self._wait_ports_free(self.spec(name).ports)
        self._pid_path(name).unlink(missing_ok=True)

    @staticmethod
    def _wait_ports_free(ports: Sequence[int], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        for port in ports:
            while not port_is_free(port) and time.monotonic() < deadline:
                time.sleep(0.1)

    def stop_many(self, names: Sequence[str], *, grace_s: float = 10.0) -> None:
        """Stop several components at once: SIGTERM to all, then wait (SIGKILL after
        ``grace_s``), then wait for their ports to be free."""
        procs = {n: p for n in names if (p := self._process(n)) is not None}
        families = [child for proc in procs.values() for child in _family(proc)]
        for n, proc in procs.items():
            log.info("component.stopping", component=n, pid=proc.pid, signal="SIGTERM")
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs.values():
            if not _wait_gone(proc, max(0.0, deadline - time.monotonic())):
                _signal_group(proc.pid, signal.SIGKILL)
                _wait_gone(proc, 10.0)
            _reap(proc.pid)
        _wait_family_gone(families, 10.0)
        for n in names:
            self._pid_path(n).unlink(missing_ok=True)
        # Only processes that ran held their ports (one that failed to bind never did).
        for n in procs:
            with contextlib.suppress(KeyError):
                self._wait_ports_free(self.spec(n).ports)

    def stop_all(self, *, grace_s: float = 10.0) -> None:
        """Stop every registered component: all but the first-registered one (the store, etcd
        in the sandbox) together, then that one."""
        names = self.names()
        if names:
            self.stop_many(names[1:][::-1], grace_s=grace_s)
            self.stop_many(names[:1], grace_s=grace_s)

    # --- inspection -----------------------------------------------------------------------------

    def status(self, name: str) -> ComponentStatus:
        """Pid, liveness and memory of one component."""
        spec = self.spec(name)
        proc = self._process(name)
        rss, cpu = 0, 0.0
        if proc is not None:
            with contextlib.suppress(psutil.Error):
                family = [proc, *proc.children(recursive=True)]
                for p in family:
                    with contextlib.suppress(psutil.Error):
                        rss += p.memory_info().rss
                        t = p.cpu_times()
                        cpu += t.user + t.system
        return ComponentStatus(
            name=name,
            running=proc is not None,
            pid=proc.pid if proc else None,
            rss_bytes=rss,
            cpu_seconds=round(cpu, 2),
            ports=spec.ports,
            log=str(self.log_path(name)),
        )

    def statuses(self) -> list[ComponentStatus]:
        """:meth:`status` of every component in registration order."""
        return [self.status(n) for n in self.names()]


# --- helpers --------------------------------------------------------------------------------------


def _signal_group(pid: int, sig: signal.Signals) -> None:
    # Each component leads its own session/process group, so the group holds it and any
    # children it forked; fall back to the pid alone if the group is gone.
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_gone(proc: psutil.Process, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        _reap(proc.pid)
        try:
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                _reap(proc.pid)
                return True
        except psutil.Error:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _family(proc: psutil.Process) -> list[psutil.Process]:
    """The processes a component forked (recursively), captured before it is signalled."""
    try:
        return list(proc.children(recursive=True))
    except psutil.Error:
        return []


def _wait_family_gone(family: Sequence[psutil.Process], timeout: float) -> None:
    # killpg queues the signal for every member at once, but each member dies when it is
    # next scheduled: wait for all of them (a zombie counts as gone; init reaps it), so a
    # restarted component never meets its predecessor's children still holding ports.
    deadline = time.monotonic() + timeout
    for member in family:
        _wait_gone(member, max(0.0, deadline - time.monotonic()))


def _reap(pid: int) -> None:
    popen = _CHILDREN.get(pid)
    if popen is not None and (code := popen.poll()) is not None:
        _EXITED[pid] = code
        _CHILDREN.pop(pid, None)


def _exit_code(pid: int | None) -> int | None:
    if pid is None:
        return None
    _reap(pid)
    return _EXITED.get(pid)


_INSECURE_TLS = ssl.create_default_context()
_INSECURE_TLS.check_hostname = False
_INSECURE_TLS.verify_mode = ssl.CERT_NONE


def _probe_ok(probe: Probe, elapsed: float) -> bool:
    if probe.kind == "process":
        return elapsed >= probe.settle_s
    return http_ok(probe.url)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """GET ``url`` (TLS unverified) and return whether it answered 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=_INSECURE_TLS) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _probe_text(probe: Probe) -> str:
    return f"GET {probe.url} never answered 200" if probe.kind == "http" else "process check"
