"""The monitoring bundle against a real Prometheus scraping the sandbox's hub and agents: every
target is up, every alert rule of manifests/monitoring/rules.yaml evaluates without error, and
every query of the Grafana dashboards returns series (the list of queries and series counts is
printed). Prometheus comes from scripts/ensure_prometheus.sh (make test's setup step)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpufed.api.labels import GROUP, VERSION
from gpufed.hub.adapters.etcd import free_port
from tests.e2e.harness import E2E, H100, batch_job, http_status, unique, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MONITORING = Path(__file__).resolve().parents[2] / "manifests" / "monitoring"
QUEUE = "mon-team"
#: Grafana's $__rate_interval is at least four scrape intervals; the test scrapes every second.
RATE_INTERVAL = "15s"


def dashboard_queries() -> list[tuple[str, str]]:
    """(dashboard/panel title, PromQL) of every target of every dashboard."""
    out = []
    for path in sorted(MONITORING.glob("dashboards/*.json")):
        d = json.loads(path.read_text())
        for p in d["panels"]:
            for t in p["targets"]:
                out.append((f"{d['uid']}/{p['title']}", t["expr"]))
    return out


def _get(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else f"{base}{path}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return body["data"]


@pytest.fixture
def queue(e2e: E2E) -> Iterator[E2E]:
    """GPUQueue mon-team (16 H100) over namespace mon-team, removed afterwards."""
    e2e.hub.create_queue(QUEUE, gpu_product=H100, nominal=16)
    try:
        yield e2e
    finally:
        e2e.hub.clear(QUEUE)
        with contextlib.suppress(ApiException):
            e2e.hub.custom.delete_cluster_custom_object(GROUP, VERSION, "gpuqueues", QUEUE)


@pytest.fixture
def prometheus(e2e: E2E, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus scraping the hub (job gpufed-hub) and every agent (job gpufed-agent)
    every second, with rules.yaml loaded; yields its base URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(
            "prometheus is not on PATH: run ./scripts/ensure_prometheus.sh (make test does)"
        )
    cp = e2e.info.control_plane
    assert cp is not None

    def target(url: str) -> str:
        return urllib.parse.urlsplit(url).netloc

    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(MONITORING / "rules.yaml")],
        "scrape_configs": [
            {"job_name": "gpufed-hub", "static_configs": [{"targets": [target(cp.hub_http)]}]},
            {
                "job_name": "gpufed-agent",
                "static_configs": [
                    {"targets": sorted(target(a.health) for a in cp.agents.values())}
                ],
            },
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool | None:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            return http_status(f"{base}/-/ready") == 200 or None

        wait_until(healthy, "Prometheus to be ready", 60)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_a_real_prometheus_scrapes_the_sandbox_and_every_dashboard_query_returns_series(
    queue: E2E, prometheus: str
) -> None:
    e2e = queue
    # Load on the fleet, so the latency histograms, decisions and reservations have samples.
    name = unique("mon")
    e2e.hub.submit(name, batch_job(4), namespace=QUEUE)
    e2e.hub.wait_phase(name, "Running", namespace=QUEUE, timeout_s=120)

    def targets_up() -> list[dict[str, Any]] | None:
        active = _get(prometheus, "/api/v1/targets")["activeTargets"]
        cp = e2e.info.control_plane
        assert cp is not None
        want = 1 + len(cp.agents)
        return active if len(active) == want and all(t["health"] == "up" for t in active) else None

    active = wait_until(targets_up, "every hub and agent target up", 60)
    print(f"\n{len(active)} targets up: " + ", ".join(t["scrapePool"] for t in active))

    queries = dashboard_queries()
    counts: dict[str, int] = {}

    def all_return_series() -> bool | None:
        for _, expr in queries:
            promql = expr.replace("$__rate_interval", RATE_INTERVAL)
            counts[expr] = len(_get(prometheus, "/api/v1/query", query=promql)["result"])
        return all(counts.values()) or None

    with contextlib.suppress(AssertionError):
        wait_until(all_return_series, "every dashboard query to return series", 60)
    print(f"{'series':>6}  panel: query")
    for title, expr in queries:
        print(f"{counts.get(expr, 0):>6}  {title}: {expr}")
    assert [e for _, e in queries if not counts.get(e)] == [], "queries without series"

    # Every rule evaluated, none with an error (a typo'd function or a bad vector match).
    def evaluated() -> list[dict[str, Any]] | None:
        groups = _get(prometheus, "/api/v1/rules")["groups"]
        found = [r for g in groups for r in g["rules"]]
        return found if found and all(r["health"] != "unknown" for r in found) else None

    rules = wait_until(evaluated, "every rule evaluated once", 30)
    assert len(rules) == len(
        [
            r
            for g in yaml.safe_load((MONITORING / "rules.yaml").read_text())["groups"]
            for r in g["rules"]
        ]
    )
    bad = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert bad == {}
    firing = sorted(r["name"] for r in rules if r.get("state") == "firing")
    print(f"{len(rules)} rules evaluated, health ok; firing on the healthy sandbox: {firing}")
    assert firing == [], "a healthy sandbox fires no alert"
