"""``gpufed console`` in a real browser (headless Chromium) against the real hub API server,
with two identities: the admin, and a team ServiceAccount that may read GPUJobs and Events
only in its own namespace (plus MemberClusters and GPUQueues cluster-wide).

Pins: every page loads and is complete without JavaScript (the server renders it); the fleet
page shows each member's state and GPUs used / reserved / free with the largest free block; the
queues page shows the tree with usage and borrowing; the jobs page lists every phase newest
first and filters; a job's page shows its timeline with the placement (member, nodes, NVLink
block) and the preemption, and "why pending" as ``gpufed explain`` gives it; a change on the
hub shows up in an open page without a reload; and the team identity sees neither the other
team's jobs in the list nor the other team's job page (RBAC decides, not the console).

With ``GPUFED_CONSOLE_SCREENSHOTS=DIR`` it saves a PNG of each page there (docs/console.md).
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from gpufed.sandbox import identities
from gpufed.sandbox.runtime import SandboxInfo
from tests.integration.console.harness import (
    SCREENSHOTS_ENV,
    browser,
    console,
    hub_blocks_endpoint,
    service_account_kubeconfig,
)
from tests.integration.console.world import (
    H100,
    MEMBERS,
    QUEUES,
    TEAM_A,
    TEAM_B,
    World,
    build,
    fleet_snapshot,
    team_a_identity,
)

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def world(sandbox: SandboxInfo, hub_kubeconfig: Path) -> Iterator[World]:
    w = World(sandbox.api_client("hub"))
    w.remove()
    for ns in (TEAM_A, TEAM_B):  # a namespace from an earlier run may still be terminating
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                w.core.read_namespace(ns)
            except k8s.ApiException:
                break
            time.sleep(0.5)
    build(w)
    try:
        yield w
    finally:
        w.remove()


@pytest.fixture(scope="module")
def hub_url(
    world: World, hub_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The hub's blocks endpoint, reviewing callers as the hub's own ServiceAccount with the
    shipped RBAC (manifests/hub/rbac.yaml): proof that it grants the two reviews."""
    from kubernetes import utils

    api = world.custom.api_client
    made: list[dict[str, Any]] = []
    for doc in identities.documents("hub"):
        if doc.get("kind") in ("Namespace", "ServiceAccount"):
            continue
        try:
            utils.create_from_dict(api, doc)
            made.append(doc)
        except utils.FailToCreateError:
            pass  # already there (409): another test's, left as it was
    hub_identity = service_account_kubeconfig(
        api,
        hub_kubeconfig,
        identities.NAMESPACE,
        identities.HUB_ACCOUNT,
        tmp_path_factory.mktemp("hub") / "hub.kubeconfig",
    )
    try:
        with hub_blocks_endpoint(hub_identity, fleet_snapshot()) as url:
            yield url
    finally:
        for doc in made:
            name = doc["metadata"]["name"]
            with contextlib.suppress(k8s.ApiException):
                if doc["kind"] == "ClusterRole":
                    world.rbac.delete_cluster_role(name)
                elif doc["kind"] == "ClusterRoleBinding":
                    world.rbac.delete_cluster_role_binding(name)
                elif doc["kind"] == "Role":
                    world.rbac.delete_namespaced_role(name, doc["metadata"]["namespace"])
                elif doc["kind"] == "RoleBinding":
                    world.rbac.delete_namespaced_role_binding(name, doc["metadata"]["namespace"])


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    d = browser()
    try:
        yield d
    finally:
        d.quit()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _wait(check: Callable[[], bool], what: str, limit_s: float = 30) -> None:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    deadline = time.monotonic() + limit_s
    while True:
        try:
            if check():
                return
        except (StaleElementReferenceException, NoSuchElementException):
            pass  # the live update replaced the element between the find and the read: again
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit_s:.0f} s waiting for {what}")
        time.sleep(0.2)


def _shot(d: Any, name: str) -> None:
    where = os.environ.get(SCREENSHOTS_ENV)
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        d.save_screenshot(str(Path(where) / f"{name}.png"))


def _texts(d: Any, css: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.text for e in d.find_elements(By.CSS_SELECTOR, css)]


def test_admin_sees_every_page_rendered_and_live(
    world: World, hub_kubeconfig: Path, driver: Any, hub_url: str
) -> None:
    """The admin identity: fleet (with the hub's NVLink blocks), queues, jobs and a job page
    load in Chromium with what the hub objects say, and an open page follows a change without
    a reload; the console answers loopback host names and GET only."""
    from selenium.webdriver.common.by import By

    with console(hub_kubeconfig, "--hub-url", hub_url) as url:
        # Served on loopback: a request naming another host (DNS rebinding) is refused, and
        # nothing but GET is answered (read-only).
        assert _get(f"{url}/healthz", {"Host": "evil.example"})[0] == 421
        post = urllib.request.Request(f"{url}/jobs", method="POST", data=b"")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(post, timeout=10)
        assert refused.value.code == 405

        # Server-rendered: the HTML alone already carries the state (no JavaScript needed).
        code, html = _get(f"{url}/")
        assert code == 200
        assert 'data-member="console-hgx" data-state="Ready"' in html
        assert 'data-member="console-nvl72" data-state="NotReady"' in html

        driver.get(f"{url}/")
        hgx = driver.find_element(By.CSS_SELECTOR, '[data-member="console-hgx"] .product')
        assert hgx.get_attribute("data-product") == H100
        assert (hgx.get_attribute("data-total"), hgx.get_attribute("data-free")) == ("64", "20")
        assert "36 used · 8 reserved · 20 free of 64" in hgx.text
        assert "largest free NVLink block 8 GPUs" in hgx.text
        nvl = driver.find_element(By.CSS_SELECTOR, '[data-member="console-nvl72"]')
        assert "LeaseExpired" in nvl.text
        assert (
            "1 suspect node(s)"
            in driver.find_element(By.CSS_SELECTOR, '[data-member="console-hgx"]').text
        )
        _shot(driver, "fleet")

        driver.get(f"{url}/queues")
        names = [n for n in _texts(driver, "td.qname") if n.startswith("console-")]
        assert names == list(QUEUES)  # the tree: the org, then its teams by name
        row_b = driver.find_element(By.CSS_SELECTOR, '[data-queue="console-team-b"]')
        assert "8" in row_b.find_element(By.CSS_SELECTOR, "td.borrowing").text
        _shot(driver, "queues")

        driver.get(f"{url}/jobs")
        jobs = [
            r.get_attribute("data-job")
            for r in driver.find_elements(By.CSS_SELECTOR, "tr[data-job]")
            if (r.get_attribute("data-job") or "").startswith("console-")
        ]
        # newest first: creation order was borrower-b, pretrain-a, eval-a (same second: by name)
        assert set(jobs) == {f"{TEAM_B}/borrower-b", f"{TEAM_A}/pretrain-a", f"{TEAM_A}/eval-a"}
        _shot(driver, "jobs")
        driver.get(f"{url}/jobs?phase=Succeeded&namespace={TEAM_A}")
        assert [
            r.get_attribute("data-job")
            for r in driver.find_elements(By.CSS_SELECTOR, "tr[data-job]")
        ] == [f"{TEAM_A}/eval-a"]
        driver.get(f"{url}/jobs?queue=console-team-b")
        assert [
            r.get_attribute("data-job")
            for r in driver.find_elements(By.CSS_SELECTOR, "tr[data-job]")
        ] == [f"{TEAM_B}/borrower-b"]
        assert _get(f"{url}/jobs?phase=Sleeping")[0] == 400

        driver.get(f"{url}/jobs/{TEAM_A}/pretrain-a")
        timeline = driver.find_element(By.ID, "timeline").text
        assert "placement decided: console-hgx" in timeline
        assert "hgx-0, hgx-1, hgx-2, hgx-4" in timeline
        assert "node:hgx-1" in timeline
        assert "preempted 1 job(s) in console-hgx" in timeline
        assert f"{TEAM_B}/borrower-b" in timeline
        kinds = [
            e.get_attribute("data-kind")
            for e in driver.find_elements(By.CSS_SELECTOR, "#timeline li")
        ]
        assert kinds[0] == "submitted"
        assert kinds.index("preempted") < kinds.index("running")
        _shot(driver, "job")

        driver.get(f"{url}/jobs/{TEAM_B}/borrower-b")
        assert "Preempted" in driver.find_element(By.ID, "timeline").text
        explain = driver.find_element(By.ID, "explain").text
        assert "Quota" in explain
        assert "queue console-team-b may borrow at most 16" in explain
        _shot(driver, "job-pending")

        # Live: the job starts running on the hub; the open page shows it without a reload.
        driver.execute_script("window.__notReloaded = true;")
        world.status(
            "gpujobs",
            "borrower-b",
            {"phase": "Running", "message": "running again", "cluster": MEMBERS[0]},
            TEAM_B,
        )
        _wait(
            lambda: driver.find_element(By.ID, "phase").text == "Running",
            "the open job page to show Running",
        )
        assert driver.execute_script("return window.__notReloaded === true;")


def test_team_identity_sees_only_its_namespace(
    world: World, hub_kubeconfig: Path, driver: Any, tmp_path: Path
) -> None:
    """A ServiceAccount that may list GPUJobs only in console-a sees console-a's jobs and none
    of console-b's, is refused console-b's job page, and is told what it cannot see."""
    from selenium.webdriver.common.by import By

    team_a = team_a_identity(world, hub_kubeconfig, tmp_path / "team-a.kubeconfig")
    with console(team_a) as url:
        driver.get(f"{url}/jobs")
        jobs = {
            r.get_attribute("data-job")
            for r in driver.find_elements(By.CSS_SELECTOR, "tr[data-job]")
        }
        assert jobs == {f"{TEAM_A}/pretrain-a", f"{TEAM_A}/eval-a"}
        hidden = driver.find_element(By.ID, "hidden").text
        assert "GPUJobs in console-b" in hidden  # tried (console-team-b lists it), refused
        _shot(driver, "jobs-team-a")

        code, html = _get(f"{url}/jobs/{TEAM_B}/borrower-b")
        assert code == 403
        assert "not readable with your identity" in html
        assert "preempted by" not in html
        assert "console-team-b may borrow" not in html

        driver.get(f"{url}/jobs/{TEAM_A}/pretrain-a")
        assert "placement decided: console-hgx" in driver.find_element(By.ID, "timeline").text

        # Fleet and queues are cluster-wide reads this identity was granted.
        driver.get(f"{url}/")
        assert driver.find_elements(By.CSS_SELECTOR, '[data-member="console-hgx"]')


def test_hub_blocks_endpoint_obeys_the_hub_clusters_rbac(
    world: World, hub_kubeconfig: Path, hub_url: str, tmp_path: Path
) -> None:
    """The hub's blocks endpoint, reviewing with the hub cluster: a token whose identity may
    get MemberClusters gets the blocks; one that may not gets 403; none or a bad one 401."""
    import yaml

    api = world.custom.api_client
    nobody = service_account_kubeconfig(
        api, hub_kubeconfig, TEAM_B, "nobody", tmp_path / "nobody.kubeconfig"
    )
    admin_token = yaml.safe_load(hub_kubeconfig.read_text())["users"][0]["user"]["token"]
    nobody_token = yaml.safe_load(nobody.read_text())["users"][0]["user"]["token"]
    target = f"{hub_url}/fleet/members/{MEMBERS[0]}/blocks"
    code, body = _get(target, {"Authorization": f"Bearer {admin_token}"})
    assert code == 200
    assert '"node:hgx-7"' in body
    code, body = _get(target, {"Authorization": f"Bearer {nobody_token}"})
    assert code == 403
    assert "memberclusters" in body
    assert _get(target, {"Authorization": "Bearer not-a-token"})[0] == 401
    assert _get(target)[0] == 401


def _token(kubeconfig: Path) -> str:
    import yaml

    return str(yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"])


def _post(url: str, form: dict[str, str], headers: dict[str, str]) -> tuple[int, str, Any]:
    """POST a form without following the redirect: (status, body, headers)."""
    import urllib.parse

    class _Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kw: Any) -> None:
            return None

    opener = urllib.request.build_opener(_Stay)
    req = urllib.request.Request(
        url, data=urllib.parse.urlencode(form).encode(), headers=headers, method="POST"
    )
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, resp.read().decode(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers


def test_console_served_for_callers_reads_with_each_callers_token(
    world: World, hub_kubeconfig: Path, hub_url: str, driver: Any, tmp_path: Path
) -> None:
    """``gpufed console --identity caller`` (the hub chart's console): started with the admin
    kubeconfig, it drops those credentials and reads with each caller's token. No token: the
    login page, no job named. Team A's token (header or the login cookie): console-a's jobs
    only, console-b's job page refused. A token with no grants: no jobs. A bad token and a
    cross-site login: refused. In the browser: sign in with the form, see team A's jobs."""
    from selenium.webdriver.common.by import By

    team_a = _token(team_a_identity(world, hub_kubeconfig, tmp_path / "a.kubeconfig"))
    nobody = _token(
        service_account_kubeconfig(
            world.custom.api_client, hub_kubeconfig, TEAM_B, "nobody", tmp_path / "n.kubeconfig"
        )
    )
    with console(hub_kubeconfig, "--identity", "caller", "--hub-url", hub_url) as url:
        code, html = _get(f"{url}/jobs")
        assert code == 401
        assert 'id="login"' in html
        assert "pretrain-a" not in html
        assert "borrower-b" not in html

        code, html = _get(f"{url}/jobs", {"Authorization": f"Bearer {team_a}"})
        assert code == 200
        assert f'data-job="{TEAM_A}/pretrain-a"' in html
        assert f'data-job="{TEAM_B}/borrower-b"' not in html
        assert "system:serviceaccount:console-a:viewer" in html
        code, _ = _get(f"{url}/jobs/{TEAM_B}/borrower-b", {"Authorization": f"Bearer {team_a}"})
        assert code == 403

        code, html = _get(f"{url}/jobs", {"Authorization": f"Bearer {nobody}"})
        assert code == 200
        assert "data-job=" not in html
        assert "GPUJobs of all namespaces" in html  # named as hidden, not shown

        code, html = _get(f"{url}/jobs", {"Authorization": "Bearer not-a-token"})
        assert code == 401
        assert 'id="login-error"' in html

        code, _, _ = _post(f"{url}/login", {"token": team_a}, {"Origin": "http://evil.example"})
        assert code == 403
        code, _, _ = _post(f"{url}/login", {"token": team_a}, {"Sec-Fetch-Site": "cross-site"})
        assert code == 403
        code, _, headers = _post(f"{url}/login", {"token": team_a}, {})
        assert code == 303
        cookie = headers["Set-Cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        code, html = _get(f"{url}/jobs", {"Cookie": cookie.split(";")[0]})
        assert code == 200
        assert f'data-job="{TEAM_A}/eval-a"' in html

        driver.delete_all_cookies()
        driver.get(f"{url}/jobs")
        driver.find_element(By.ID, "token").send_keys(team_a)
        driver.find_element(By.CSS_SELECTOR, "form#login button").click()
        _wait(lambda: driver.current_url.rstrip("/") == url, "the login to land on the fleet")
        driver.get(f"{url}/jobs")
        jobs = {
            r.get_attribute("data-job")
            for r in driver.find_elements(By.CSS_SELECTOR, "tr[data-job]")
        }
        assert jobs == {f"{TEAM_A}/pretrain-a", f"{TEAM_A}/eval-a"}
        _shot(driver, "login")
        driver.find_element(By.CSS_SELECTOR, "form.logout button").click()
        _wait(lambda: driver.current_url.endswith("/login"), "the logout to land on the login")
        driver.get(f"{url}/jobs")
        assert not driver.find_elements(By.CSS_SELECTOR, "tr[data-job]")
