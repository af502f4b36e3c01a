"""`gpufed submit|get|explain` end with one `error:` line (exit 1) for an operator's usual
mistakes, never a traceback (found by the system review)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpufed.cli.main import app


def kubeconfig(tmp_path: Path, server: str = "https://127.0.0.1:1") -> Path:
    """A kubeconfig whose only context (``hub``) points at a port nobody listens on."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "hub", "cluster": {"server": server, "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "admin", "user": {"token": "t"}}],
                "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "admin"}}],
                "current-context": "hub",
            }
        )
    )
    return path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("- a\n- b\n", "document 1: not a Kubernetes object"),
        ("", "no objects"),
        ("---\n---\n", "no objects"),
        ("apiVersion: batch/v1\nkind: Job\nmetadata: [1]\n", "metadata: must be a mapping"),
    ],
)
def test_submit_refuses_files_that_hold_no_object(tmp_path: Path, content: str, match: str) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(content)
    code, out = run("submit", "-f", str(f), "--kubeconfig", str(kubeconfig(tmp_path)))
    assert code == 1
    assert out.startswith("error: ")
    assert match in out


@pytest.mark.parametrize("name", ["missing.yaml", "."])
def test_submit_names_a_file_it_cannot_read(tmp_path: Path, name: str) -> None:
    code, out = run("submit", "-f", str(tmp_path / name), "--kubeconfig", str(kubeconfig(tmp_path)))
    assert code == 1
    assert out.startswith("error: ")
    assert "cannot read" in out


@pytest.mark.parametrize(
    "args",
    [
        ("get", "jobs"),
        ("get", "clusters"),
        ("explain", "team-a/x"),
    ],
)
def test_an_unreachable_hub_api_server_is_one_error_line(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    code, out = run(*args, "--kubeconfig", str(kubeconfig(tmp_path)))
    assert code == 1
    assert out.startswith("error: ")
    assert "127.0.0.1:1" in out


def test_submit_to_an_unreachable_hub_is_one_error_line(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\n"
        "spec: {template: {spec: {containers: [{name: c, image: x}]}}}\n"
    )
    code, out = run("submit", "-f", str(f), "--kubeconfig", str(kubeconfig(tmp_path)))
    assert code == 1
    assert out.startswith("error: ")
    assert "127.0.0.1:1" in out


def test_a_bad_context_or_kubeconfig_is_one_error_line(tmp_path: Path) -> None:
    cfg = kubeconfig(tmp_path)
    code, out = run("get", "jobs", "--kubeconfig", str(cfg), "--context", "nope")
    assert (code, out.startswith("error: ")) == (1, True)
    assert "nope" in out
    code, out = run("get", "clusters", "--kubeconfig", str(tmp_path / "none"))
    assert (code, out.startswith("error: ")) == (1, True)


def test_a_cluster_without_the_crds_is_named(tmp_path: Path) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"kind":"Status","message":"the server could not find the requested resource","code":404}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = kubeconfig(tmp_path, f"http://127.0.0.1:{server.server_port}")
        code, out = run("get", "clusters", "--kubeconfig", str(cfg))
    finally:
        server.shutdown()
    assert code == 1
    assert "could not find the requested resource" in out
    assert "gpufed hub install" in out
