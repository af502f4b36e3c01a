"""The process supervisor (gpufed.sandbox.supervisor) with small real processes: readiness,
death while starting (exit code, log tail), port clashes, timeouts, stop/kill by pid and process
group, pid-reuse safety, and identity across a wall-clock step (gpufed.sandbox.procid)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpufed.sandbox import procid
from gpufed.sandbox.supervisor import (
    ComponentError,
    ComponentSpec,
    Probe,
    Supervisor,
    port_is_free,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def web(name: str, port: int, **kw: object) -> ComponentSpec:
    return ComponentSpec.model_validate(
        {
            "name": name,
            "argv": [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
            "ports": [port],
            "probe": {"kind": "http", "url": f"http://127.0.0.1:{port}/"},
            "start_timeout_s": 20,
            **kw,
        }
    )


def shell(name: str, script: str, **kw: object) -> ComponentSpec:
    return ComponentSpec.model_validate(
        {"name": name, "argv": ["/bin/sh", "-c", script], "probe": {"settle_s": 0.5}, **kw}
    )


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Supervisor]:
    s = Supervisor(tmp_path / "state")
    yield s
    s.stop_all(grace_s=2)


def test_start_waits_for_readiness_and_stop_frees_the_port(sup: Supervisor) -> None:
    port = free_port()
    sup.register(web("web/a", port))
    pid = sup.start("web/a")
    assert sup.is_running("web/a")
    assert sup.pid("web/a") == pid
    assert not port_is_free(port)
    st = sup.status("web/a")
    assert st.running
    assert st.rss_bytes > 0
    assert st.log.endswith("logs/web/a.log")
    sup.stop("web/a")
    assert not sup.is_running("web/a")
    assert port_is_free(port)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_second_supervisor_sees_the_same_components(sup: Supervisor) -> None:
    sup.register(shell("sleeper", "exec sleep 300"))
    sup.register(shell("other", "exec sleep 300"))
    sup.start("sleeper")
    again = Supervisor(sup.state_dir)
    assert again.names() == ["sleeper", "other"]
    assert again.is_running("sleeper")
    assert not again.is_running("other")
    again.stop("sleeper")
    assert not sup.is_running("sleeper")


def test_process_dying_at_start_reports_exit_code_and_log(sup: Supervisor) -> None:
    sup.register(shell("crasher", "echo 'fatal: bad flag --x' >&2; exit 3"))
    with pytest.raises(ComponentError) as err:
        sup.start("crasher")
    e = err.value
    assert e.component == "crasher"
    assert "exited while starting with code 3" in e.cause
    assert any("fatal: bad flag --x" in line for line in e.tail)
    assert str(sup.log_path("crasher")) in str(e)


def test_port_clash_is_named(sup: Supervisor) -> None:
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        sup.register(web("web/clash", port))
        with pytest.raises(ComponentError, match="already in use by another process"):
            sup.start("web/clash")


def test_readiness_timeout_stops_the_process(sup: Supervisor) -> None:
    sup.register(
        ComponentSpec(
            name="never-ready",
            argv=["/bin/sh", "-c", "exec sleep 300"],
            probe=Probe(kind="http", url=f"http://127.0.0.1:{free_port()}/"),
            start_timeout_s=1.0,
        )
    )
    with pytest.raises(ComponentError, match=r"not ready after 1s \(GET http"):
        sup.start("never-ready")
    assert not sup.is_running("never-ready")


def test_missing_binary_is_named(sup: Supervisor, tmp_path: Path) -> None:
    sup.register(ComponentSpec(name="ghost", argv=[str(tmp_path / "kube-ghost")]))
    with pytest.raises(ComponentError, match=r"binary .*kube-ghost is missing.*gpufed local build"):
        sup.start("ghost")


def test_kill_takes_the_whole_process_group(sup: Supervisor) -> None:
    sup.register(shell("family", "sleep 300 & sleep 300 & wait"))
    pid = sup.start("family")
    children = psutil.Process(pid).children()
    assert len(children) == 2
    sup.kill("family")
    assert not sup.is_running("family")
    for child in children:  # dead (or a zombie until init reaps it)
        with contextlib.suppress(psutil.NoSuchProcess):
            assert child.status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize(
    "forge",
    [
        lambda rec: {**rec, "start_ticks": rec["start_ticks"] + 100},  # same pid, another tick
        lambda rec: {**rec, "boot_id": "00000000-0000-0000-0000-000000000000"},  # another boot
        lambda rec: {"pid": rec["pid"], "create_time": rec["create_time"] - 100},  # old shape
    ],
    ids=["other-tick", "other-boot", "legacy-record"],
)
def test_recycled_pid_is_never_taken_for_the_component(
    sup: Supervisor, forge: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    sup.register(shell("sleeper", "exec sleep 300"))
    pid = sup.start("sleeper")
    pid_file = sup.state_dir / "run" / "sleeper.pid"
    pid_file.write_text(json.dumps(forge(json.loads(pid_file.read_text()))))
    assert not sup.is_running("sleeper")  # same pid, another process: not ours
    sup.stop("sleeper")  # and not signalled
    assert psutil.Process(pid).is_running()
    psutil.Process(pid).kill()


def test_a_wall_clock_step_does_not_lose_running_components(
    sup: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A VM fork, restore or migration (or NTP, a laptop's resume) steps the wall clock, and with
    # it the boot time psutil adds to a process's start ticks: create_time() of every running
    # process moves by the step (196 s seen on the CI machine). The components are still ours.
    sup.register(shell("sleeper", "exec sleep 300"))
    pid = sup.start("sleeper")
    real = psutil.Process.create_time
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: real(self) + 196.0)
    assert sup.is_running("sleeper")
    assert sup.status("sleeper").pid == pid
    sup.stop("sleeper", grace_s=2)  # and `down` still stops them
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_start_ticks_agree_with_psutils_own_reading(tmp_path: Path) -> None:
    # psutil parses /proc/<pid>/stat itself: (create_time - boot_time) * CLK_TCK is the same
    # field 22, read by a second implementation; the command name holds ") (" and spaces.
    odd = tmp_path / "a) b (c"
    odd.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(odd), "30"])
    try:
        ps = psutil.Process(proc.pid)
        assert ps.name() == "a) b (c"
        theirs = (ps.create_time() - psutil.boot_time()) * os.sysconf("SC_CLK_TCK")
        ticks = procid.start_ticks(proc.pid)
        assert ticks is not None
        assert abs(ticks - theirs) <= 1
        assert procid.identity(proc.pid)["start_ticks"] == ticks
    finally:
        proc.kill()
        proc.wait()
    assert procid.start_ticks(proc.pid) is None  # gone


def test_unknown_component_lists_the_known_ones(sup: Supervisor) -> None:
    sup.register(shell("sleeper", "exec sleep 300"))
    with pytest.raises(KeyError, match=r"no component 'nope'.*components: sleeper"):
        sup.spec("nope")
