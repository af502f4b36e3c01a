"""Preemption at the hub on the example fleet's NVL72 member (eu-nvl72: two cliques of 18 GB200
nodes x 4 GPUs): the member is full of low-priority jobs, a high-priority job that needs a
whole clique arrives, the jobs of exactly one clique are preempted (gracefully: their member
copies deleted), the job runs on that clique, and the victims show ``Preempted`` and wait in
the queue (Pending) while the other clique's jobs run on untouched."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.e2e.harness import E2E, GB200, batch_job, priority_classes, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CLASSES = {"e2e-low": 100, "e2e-high": 100_000}


@pytest.fixture
def classes(e2e: E2E) -> Iterator[E2E]:
    """PriorityClasses e2e-low (100) and e2e-high (100000, PreemptLowerPriority) on the hub
    cluster, removed afterwards."""
    with priority_classes(e2e.hub.api, CLASSES):
        try:
            yield e2e
        finally:
            e2e.hub.clear()


def condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions", []) if c.get("type") == type_), None)


def test_a_clique_job_preempts_the_jobs_of_one_clique_and_runs_there(
    classes: E2E, tmp_path: Path
) -> None:
    hub = classes.hub
    clique = {"nvlink": "Required"}
    # two low jobs share each clique: without ComputeDomains (one domain per clique at most)
    shared = {"nvlink": "Required", "computeDomain": "Never"}
    low = {"gpuProducts": [GB200], "priorityClassName": "e2e-low", "topology": shared}
    # 4 jobs of 9 pods x 4 GPUs: two fill each 72-GPU clique.
    names = [f"low{i}" for i in range(4)]
    for name in names:
        hub.submit(name, batch_job(4, pods=9), placement=low)
    domains: dict[str, str] = {}
    for name in names:
        st = hub.wait_phase(name, "Running", timeout_s=90)
        [domains[name]] = st["placement"]["nvlinkDomains"]
    by_clique: dict[str, list[str]] = {}
    for name, d in sorted(domains.items()):
        by_clique.setdefault(d, []).append(name)
    assert sorted(len(v) for v in by_clique.values()) == [2, 2], by_clique
    wait_until(lambda: hub.gpus_free("eu-nvl72", GB200) == 0, "eu-nvl72 full")

    high = {"gpuProducts": [GB200], "priorityClassName": "e2e-high", "topology": clique}
    t0 = time.monotonic()
    hub.submit("high", batch_job(4, pods=18), placement=high)
    st = hub.wait_phase("high", "Running", timeout_s=60)
    # A figure, not an assertion (run with -s to see it).
    print(json.dumps({"preemption_submit_to_running_s": round(time.monotonic() - t0, 2)}))

    [freed] = st["placement"]["nvlinkDomains"]
    victims = by_clique[freed]
    kept = [n for n in names if n not in victims]
    preemption = st["preemption"]
    assert preemption["cluster"] == "eu-nvl72"
    assert preemption["nvlinkDomains"] == [freed]
    assert sorted(v["job"] for v in preemption["victims"]) == [f"drill/{v}" for v in victims]
    for name in victims:
        vs = hub.wait_phase(name, "Pending", timeout_s=30)
        cond = condition(vs, "Preempted")
        assert cond is not None
        assert cond["status"] == "True"
        assert "drill/high" in cond["message"]
        assert freed in cond["message"]
        assert vs["preemptions"] == 1
        assert "Preempted" in hub.events(name)
        uid = hub.job(name)["metadata"]["uid"]  # type: ignore[index]
        assert classes.members["eu-nvl72"].jobs_of(uid) == [], "its member copy is gone"
    for name in kept:
        ks = hub.status(name)
        assert ks["phase"] == "Running"
        assert condition(ks, "Preempted") is None
    assert "Preempting" in hub.events("high")

    # The same preemption in the web console (headless Chromium; skipped without it): the
    # fleet page draws eu-nvl72's two cliques from the real hub, the preemptor's page shows
    # its placement and what it preempted, a victim's page its preemption; an identity that
    # may read GPUJobs only in another namespace sees none of these.
    from selenium.webdriver.common.by import By

    from tests.integration.console.harness import browser, console

    outsider = _outsider_kubeconfig(hub.api, classes.info.kubeconfig, tmp_path)

    cp = classes.info.control_plane
    assert cp is not None
    driver = browser()
    try:
        with console(classes.info.kubeconfig, "--hub-url", cp.hub_http) as url:
            driver.get(f"{url}/")
            cliques = driver.find_elements(By.CSS_SELECTOR, '[data-member="eu-nvl72"] .blk')
            assert len(cliques) == 2
            cells = {
                b.get_attribute("data-domain"): len(b.find_elements(By.CSS_SELECTOR, ".c"))
                for b in cliques
            }
            assert cells == dict.fromkeys(cells, 72)
            assert freed in cells
            driver.get(f"{url}/jobs/drill/high")
            timeline = driver.find_element(By.ID, "timeline").text
            assert "placement decided: eu-nvl72" in timeline
            assert freed in timeline
            assert f"preempted {len(victims)} job(s) in eu-nvl72" in timeline
            driver.get(f"{url}/jobs/drill/{victims[0]}")
            kinds = {
                e.get_attribute("data-kind")
                for e in driver.find_elements(By.CSS_SELECTOR, "#timeline li")
            }
            assert {"submitted", "placed", "preempted"} <= kinds
        with console(outsider) as url:
            driver.get(f"{url}/jobs")
            assert driver.find_elements(By.CSS_SELECTOR, "tr[data-job]") == []
            driver.get(f"{url}/jobs/drill/high")
            assert "not readable with your identity" in driver.find_element(By.ID, "missing").text
    finally:
        driver.quit()
        with contextlib.suppress(k8s.ApiException):
            k8s.CoreV1Api(hub.api).delete_namespace(OUTSIDER_NS)


OUTSIDER_NS = "e2e-console-outsider"


def _outsider_kubeconfig(api: k8s.ApiClient, admin: Path, tmp_path: Path) -> Path:
    """A ServiceAccount of namespace e2e-console-outsider that may list GPUJobs there only."""
    from tests.integration.console.harness import service_account_kubeconfig

    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    with contextlib.suppress(k8s.ApiException):
        core.create_namespace({"metadata": {"name": OUTSIDER_NS}})
    rbac.create_namespaced_role(
        OUTSIDER_NS,
        {
            "metadata": {"name": "gpujob-reader"},
            "rules": [
                {"apiGroups": ["gpufed.io"], "resources": ["gpujobs"], "verbs": ["get", "list"]}
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        OUTSIDER_NS,
        {
            "metadata": {"name": "gpujob-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "gpujob-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "outsider", "namespace": OUTSIDER_NS}],
        },
    )
    return service_account_kubeconfig(api, admin, OUTSIDER_NS, "outsider", tmp_path / "outsider")
