"""Every command's errors are one line naming the fix, exit code 1, no traceback (unless
GPUFED_DEBUG=1); kubeconfig resolution is kubectl's in every command (cli/errors.py,
cli/kube.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog.testing
from typer.testing import CliRunner

from gpufed.cli import agent as agent_cli
from gpufed.cli.main import app
from tests.unit.cli.fake_api import kubeconfig, serving


@pytest.fixture(autouse=True)
def no_ambient_kubeconfig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("GPUFED_DEBUG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    return result.exit_code, result.output


def one_error_line(out: str) -> str:
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    assert lines[0].startswith("error: "), out
    assert "Traceback" not in out
    return lines[0]


@pytest.mark.parametrize("args", [("hub", "install"), ("hub", "join", "m1"), ("get", "gpus")])
def test_a_missing_kubeconfig_is_one_line_with_the_fix(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    code, out = run(*args, "--kubeconfig", str(tmp_path / "nope"))
    assert code == 1
    assert "no such file (fix: check the path)" in one_error_line(out)


@pytest.mark.parametrize(
    "args",
    [
        ("hub", "install"),
        ("hub", "join", "m1"),
        ("get", "gpus"),
        ("get", "queues"),
        ("get", "jobs"),
    ],
)
def test_no_kubeconfig_anywhere_names_every_place_looked(args: tuple[str, ...]) -> None:
    code, out = run(*args)
    assert code == 1
    line = one_error_line(out)
    assert line.startswith("error: no kubeconfig: ")  # said once, not "kubeconfig: no kubeconfig"
    assert "$KUBECONFIG unset" in line
    assert "fix: pass --kubeconfig" in line


@pytest.mark.parametrize("args", [("hub", "install"), ("hub", "join", "m1"), ("get", "gpus")])
def test_an_unreachable_api_server_is_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    cfg = kubeconfig(tmp_path / "k", "http://127.0.0.1:1")
    code, out = run(*args, "--kubeconfig", str(cfg))
    assert code == 1
    assert "cannot reach the API server" in one_error_line(out)


@pytest.mark.parametrize(
    ("status", "fix"),
    [(403, "lacks the RBAC permission"), (404, "gpufed hub install"), (401, "log in again")],
)
def test_api_refusals_name_the_fix(tmp_path: Path, status: int, fix: str) -> None:
    body = {"kind": "Status", "message": f"refused with {status}", "code": status}
    with serving(status, body) as url:
        code, out = run("hub", "install", "--kubeconfig", str(kubeconfig(tmp_path / "k", url)))
    assert code == 1
    line = one_error_line(out)
    assert f"refused with {status}" in line
    assert fix in line


def test_kubeconfig_env_list_is_honoured_by_hub_join(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$KUBECONFIG (two files; the second has the context) reaches the server it names: the
    403 that comes back proves which server was asked."""
    other = kubeconfig(tmp_path / "other", "http://127.0.0.1:1", context="elsewhere")
    body = {"kind": "Status", "message": "secrets is forbidden for user u", "code": 403}
    with serving(403, body) as url:
        mine = kubeconfig(tmp_path / "mine", url, context="hub")
        monkeypatch.setenv("KUBECONFIG", f"{other}:{mine}")
        code, out = run("hub", "join", "m1", "--context", "hub")
    assert code == 1
    assert "secrets is forbidden" in one_error_line(out)


def test_agent_inventory_honours_kubeconfig_outside_a_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"kind": "Status", "message": "nodes is forbidden for the agent", "code": 403}
    # The command configures structlog (cached loggers) on the stream CliRunner captures for
    # this test only: later tests would log to a closed file.
    monkeypatch.setattr(agent_cli, "configure_logging", lambda *_a, **_k: None)
    # capture_logs: the agent's own warnings (e.g. DRA discovery refused by the same 403) do not
    # reach the captured output whichever structlog configuration earlier tests left behind.
    with serving(403, body) as url, structlog.testing.capture_logs():
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "k", url)))
        code, out = run("agent", "inventory", "--once", "--cluster", "m1")
    assert code == 1
    assert "nodes is forbidden for the agent" in one_error_line(out)


def test_gpufed_debug_lets_the_traceback_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFED_DEBUG", "1")
    result = CliRunner().invoke(app, ["hub", "install", "--kubeconfig", str(tmp_path / "nope")])
    assert result.exit_code == 1
    assert type(result.exception).__name__ == "KubeconfigError"
