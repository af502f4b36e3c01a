"""Helpers of the console tests: a headless Chromium (Debian's ``chromium`` and
``chromium-driver``, installed by ``scripts/ensure_browser.sh``), a ``gpufed console`` process
per identity, a ServiceAccount identity with a kubeconfig, and the hub objects the pages show.

The objects' statuses are written here through the status subresource as the hub would write
them (the pages read objects; which process wrote them does not matter to the console).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

GROUP, VERSION = "gpufed.io", "v1alpha1"
#: Where screenshots go when set (docs/console.md's images are made so).
SCREENSHOTS_ENV = "GPUFED_CONSOLE_SCREENSHOTS"


def browser() -> Any:
    """A headless Chromium under selenium, or a skip naming what is missing and how to get it."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip(
            "no chromium/chromedriver on PATH: `scripts/ensure_browser.sh` installs Debian's "
            "chromium and chromium-driver (make test runs it)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def console(kubeconfig: Path, *extra: str) -> Iterator[str]:
    """``gpufed console --kubeconfig kubeconfig`` on a free loopback port; yields its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpufed.cli",
            "console",
            "--kubeconfig",
            str(kubeconfig),
            "--listen",
            f"127.0.0.1:{port}",
            "--refresh",
            "1",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "KUBECONFIG": ""},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                out = proc.stdout.read() if proc.stdout else ""
                raise AssertionError(f"gpufed console exited {proc.returncode}: {out}")
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("gpufed console did not answer /healthz within 60 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def service_account_kubeconfig(
    api: k8s.ApiClient, admin_kubeconfig: Path, namespace: str, name: str, out: Path
) -> Path:
    """A kubeconfig at ``out`` authenticating as ServiceAccount ``namespace/name`` (created
    here) to the same API server as ``admin_kubeconfig``'s current context."""
    core = k8s.CoreV1Api(api)
    with contextlib.suppress(k8s.ApiException):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    req = k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[]))
    token = core.create_namespaced_service_account_token(name, namespace, req).status.token
    doc = yaml.safe_load(admin_kubeconfig.read_text())
    current = next(c for c in doc["contexts"] if c["name"] == doc["current-context"])
    cluster = next(c for c in doc["clusters"] if c["name"] == current["context"]["cluster"])
    out.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": name, "user": {"token": token}}],
                "contexts": [
                    {
                        "name": "viewer",
                        "context": {
                            "cluster": cluster["name"],
                            "user": name,
                            "namespace": namespace,
                        },
                    }
                ],
                "current-context": "viewer",
            }
        )
    )
    out.chmod(0o600)
    return out


def now_rfc3339(offset_s: float = 0) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + offset_s))


def condition(type_: str, status: str, reason: str, message: str = "", at: str = "") -> Any:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": at or now_rfc3339(),
    }


def event(
    core: k8s.CoreV1Api, job: dict[str, Any], type_: str, reason: str, message: str, at: str
) -> None:
    """A core/v1 Event about GPUJob ``job``, as the hub emits them."""
    meta = job["metadata"]
    core.create_namespaced_event(
        meta["namespace"],
        {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "GPUJob",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": "gpufed-hub"},
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
        },
    )


@contextlib.contextmanager
def hub_blocks_endpoint(kubeconfig: Path, snapshot: Any) -> Iterator[str]:
    """The hub's real HTTP app (``hub/edge/http.py``) on a free loopback port, in a thread of
    its own, serving ``/fleet/members/<name>/blocks`` from ``snapshot`` (a
    :class:`~gpufed.placement.FleetSnapshot`) and reviewing callers with the hub cluster as
    ``kubeconfig``'s identity; yields its URL."""
    import asyncio
    import threading

    from gpufed.hub.adapters.kube import KubeAPI
    from gpufed.hub.components.metrics import HubMetrics
    from gpufed.hub.edge.access import AccessCheck
    from gpufed.hub.edge.http import make_app, serve
    from gpufed.hub.rules.blocks import member_blocks

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[Any, Any, int]:
        kube = await KubeAPI.connect(kubeconfig, None)
        app = make_app(
            HubMetrics(),
            lambda: (True, "leader"),
            blocks=lambda name: member_blocks(snapshot, name),
            access=AccessCheck(kube.review_access),
        )
        runner, port = await serve(app, "127.0.0.1", 0)
        return kube, runner, port

    kube, runner, port = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        asyncio.run_coroutine_threadsafe(kube.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
