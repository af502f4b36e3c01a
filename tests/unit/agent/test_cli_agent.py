"""`gpufed agent` refuses bad flags before connecting anywhere, naming the flag and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufed.cli.main import app

from .conftest import log_to_stdlib


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("secret\n")
    return path


def run(*args: str) -> tuple[int, str]:
    try:
        result = CliRunner().invoke(app, ["agent", *args])
    finally:
        log_to_stdlib()
    return result.exit_code, result.output


def test_missing_required_flags_are_named() -> None:
    code, out = run("--cluster", "alpha")
    assert code == 2
    assert "missing --hub, --token-file" in out


@pytest.mark.parametrize(
    ("flag", "value", "fragment"),
    [
        ("--cluster", "Alpha_1", "--cluster: 'Alpha_1' is not a DNS label"),
        ("--hub", "https://hub:7443", "--hub: 'https://hub:7443' must be host:port"),
        ("--log-level", "loud", "--log-level: 'loud' is not one of"),
    ],
)
def test_bad_values_are_refused_with_the_fix(
    token: Path, flag: str, value: str, fragment: str
) -> None:
    args = {"--cluster": "alpha", "--hub": "hub:7443", "--log-level": "info", flag: value}
    code, out = run(*[x for kv in args.items() for x in kv], "--token-file", str(token))
    assert code == 2
    assert fragment in out


def test_unreadable_or_empty_token_file_is_refused(tmp_path: Path) -> None:
    code, out = run(
        "--cluster", "alpha", "--hub", "hub:7443", "--token-file", str(tmp_path / "nope")
    )
    assert code == 2
    assert "--token-file" in out
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    code, out = run("--cluster", "alpha", "--hub", "hub:7443", "--token-file", str(empty))
    assert code == 2
    assert "the file is empty" in out


def test_without_kubeconfig_outside_a_pod_the_fix_is_named(
    token: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    code, out = run(
        "--cluster",
        "alpha",
        "--hub",
        "127.0.0.1:1",
        "--token-file",
        str(token),
        "--health-port",
        "-1",
    )
    assert code == 2
    assert "pass --kubeconfig" in out
