"""The Helm charts (charts/gpufed-hub, charts/gpufed-agent) with the pinned helm
(gpufed.sandbox.helm): ``helm lint`` passes with every ``ci/*-values.yaml``; missing required
values and a wrong namespace fail naming the value and the fix; ``helm template`` with
``ci/test-values.yaml`` renders exactly the objects of the kustomize base in manifests/ (so the
two cannot drift); the hub's ServiceMonitor scrapes every replica through the metrics Service,
not the leader-only Service; the PrometheusRule's rule file is manifests/monitoring/rules.yaml;
and every object rendered with each values file is accepted by a server-side dry-run apply on
the sandbox's API servers: the hub chart on the hub cluster, the agent chart on member
``alpha`` (the Prometheus Operator CRDs are installed for the test, and removed after it)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from gpufed.sandbox.binaries import BinariesError
from gpufed.sandbox.helm import ensure_helm

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ROOT / "charts"
NAMESPACE = "gpufed-system"
#: chart -> (kustomize base under manifests/, sandbox context its objects are applied to)
CHART_TARGETS = {"gpufed-hub": ("hub", "hub"), "gpufed-agent": ("agent", "alpha")}
#: Labels Helm adds to every object (the kustomize base carries name and part-of only).
HELM_LABELS = (
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)
#: Objects only the kustomize base has: Helm charts leave the namespace to
#: ``helm install --create-namespace``.
KUSTOMIZE_ONLY = frozenset({"Namespace"})
PROM_CRDS = Path(__file__).parent / "fixtures" / "prometheus-operator-crds"


def values_files() -> list[tuple[str, Path]]:
    return [(c, v) for c in CHART_TARGETS for v in sorted((CHARTS / c / "ci").glob("*.yaml"))]


VALUES = values_files()
VALUE_IDS = [f"{c}:{v.name}" for c, v in VALUES]


@pytest.fixture(scope="module")
def helm(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``helm(*args)`` runs the pinned helm (built on first use) with its caches in a tmp dir."""
    try:
        binary = ensure_helm(progress=None)
    except BinariesError as exc:
        pytest.fail(f"helm unavailable: {exc}")
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(home / "no-kubeconfig"),
    }

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(binary), *args], capture_output=True, text=True, timeout=120, env=env, check=False
        )

    return run


def render(
    helm: Callable[..., subprocess.CompletedProcess[str]],
    chart: str,
    values: Path,
    *extra: str,
) -> list[dict[str, Any]]:
    out = helm(
        "template", "gpufed", str(CHARTS / chart), "-n", NAMESPACE, "-f", str(values), *extra
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def kustomize_base(component: str) -> list[dict[str, Any]]:
    """The objects ``kubectl apply -k manifests/<component>`` creates. The bases use only
    ``resources`` and an ``images`` tag; anything else would need a real kustomize here."""
    base = ROOT / "manifests" / component
    k = yaml.safe_load((base / "kustomization.yaml").read_text())
    assert set(k) <= {"apiVersion", "kind", "resources", "images"}, (
        f"manifests/{component}/kustomization.yaml uses {sorted(set(k) - {'apiVersion', 'kind', 'resources', 'images'})}: "
        "teach kustomize_base() that transformer"
    )
    docs = [d for f in k["resources"] for d in yaml.safe_load_all((base / f).read_text()) if d]
    tags = {i["name"]: i["newTag"] for i in k.get("images", [])}
    for d in docs:
        for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            name = c["image"].split(":")[0]
            if name in tags:
                c["image"] = f"{name}:{tags[name]}"
    return docs


def _strip_helm(obj: dict[str, Any]) -> dict[str, Any]:
    obj = json.loads(json.dumps(obj))
    metas = [obj.get("metadata", {}), obj.get("spec", {}).get("template", {}).get("metadata", {})]
    for meta in metas:
        for key in HELM_LABELS:
            meta.get("labels", {}).pop(key, None)
        annotations = meta.get("annotations", {})
        for key in [a for a in annotations if a.startswith("checksum/")]:
            del annotations[key]
    return obj


def _key(d: dict[str, Any]) -> tuple[str, str, str]:
    return (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])


@pytest.mark.parametrize(("chart", "values"), VALUES, ids=VALUE_IDS)
def test_helm_lint_passes_with_every_ci_values_file(
    helm: Callable[..., subprocess.CompletedProcess[str]], chart: str, values: Path
) -> None:
    out = helm("lint", "--strict", str(CHARTS / chart), "-n", NAMESPACE, "-f", str(values))
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


def hub_with(*values: str) -> list[str]:
    """``helm template`` arguments for the hub chart with an etcd and ``--set`` each of
    ``values`` (``key=value``)."""
    return ["-n", NAMESPACE, "--set", "etcd.endpoints=e:2379", *(f"--set={v}" for v in values)]


@pytest.mark.parametrize(
    ("chart", "args", "names"),
    [
        ("gpufed-hub", ["-n", NAMESPACE], "etcd.endpoints"),
        ("gpufed-hub", ["-n", NAMESPACE, "--set", "etcd.endpoints=a:1\\,b:2"], "extraArgs"),
        (
            "gpufed-hub",
            hub_with("replicaCount=1"),
            "set replicaCount above minAvailable or podDisruptionBudget.enabled=false",
        ),
        (
            "gpufed-hub",
            hub_with("podDisruptionBudget.maxUnavailable=1"),
            "exactly one of minAvailable and maxUnavailable",
        ),
        (
            "gpufed-hub",
            hub_with("queues.unlistedNamespaces=deny"),
            'queues.unlistedNamespaces is "deny": use default-queue',
        ),
        (
            "gpufed-hub",
            hub_with("queues.defaultQueueMaxPriority=2147483648"),
            "queues.defaultQueueMaxPriority is 2147483648: give an integer from -2147483648 to "
            "2147483647",
        ),
        (
            "gpufed-hub",
            hub_with("queues.holdsPerShape=0"),
            "queues.holdsPerShape is 0: give an integer from 1 to 64",
        ),
        (
            "gpufed-hub",
            hub_with("queues.sizeAgingSeconds=-1"),
            "queues.sizeAgingSeconds is -1: give a number of seconds >= 0",
        ),
        (
            "gpufed-hub",
            hub_with("queues.order=lifo"),
            'queues.order is "lifo": use smallest-first',
        ),
        (
            "gpufed-hub",
            hub_with("queues.defaultQueue=Team_A"),
            'queues.defaultQueue is "Team_A": give a GPUQueue name',
        ),
        (
            "gpufed-hub",
            hub_with("queues.fairShareHalfLifeSeconds=0"),
            "queues.fairShareHalfLifeSeconds is 0: give a number of seconds > 0",
        ),
        (
            "gpufed-hub",
            hub_with("queues.oldestFirstSeconds=31536001"),
            "queues.oldestFirstSeconds is 31536001: give a number of seconds >= 0, at most "
            "31536000",
        ),
        (
            "gpufed-hub",
            hub_with("queues.starvationSeconds=soon"),
            "queues.starvationSeconds is soon: give a number of seconds >= 0",
        ),
        (
            "gpufed-hub",
            hub_with("queues.maxHolds=2.5"),
            "queues.maxHolds is 2.5: give an integer from 0 to 1000",
        ),
        (
            "gpufed-hub",
            hub_with("queues.carryHolds=yes"),
            'queues.carryHolds is "yes": give true or false',
        ),
        (
            "gpufed-hub",
            hub_with("queues.spareWholeNodesSeconds=-1"),
            "queues.spareWholeNodesSeconds is -1: give a number of seconds >= 0",
        ),
        ("gpufed-agent", ["-n", NAMESPACE], "set cluster"),
        ("gpufed-agent", ["-n", NAMESPACE, "--set", "cluster=m1"], "hub.address"),
        (
            "gpufed-hub",
            ["-n", "default", "--set", "etcd.endpoints=e:2379"],
            "--namespace gpufed-system",
        ),
        (
            "gpufed-agent",
            ["-n", "kube-system", "-f", str(CHARTS / "gpufed-agent/ci/test-values.yaml")],
            "--namespace gpufed-system",
        ),
        (
            "gpufed-agent",
            [
                "-n",
                NAMESPACE,
                "-f",
                str(CHARTS / "gpufed-agent/ci/test-values.yaml"),
                "--set",
                "serviceMonitor.enabled=true",
            ],
            "needs service.enabled",
        ),
    ],
)
def test_bad_values_fail_naming_the_value_and_the_fix(
    helm: Callable[..., subprocess.CompletedProcess[str]], chart: str, args: list[str], names: str
) -> None:
    out = helm("template", "gpufed", str(CHARTS / chart), *args)
    assert out.returncode != 0
    assert names in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("values", "flags"),
    [
        ({}, []),
        (
            {"unlistedNamespaces": "reject", "defaultQueueMaxPriority": 2147483647},
            ["--unlisted-namespaces=reject", "--default-queue-max-priority=2147483647"],
        ),
        ({"defaultQueueMaxPriority": 0}, ["--default-queue-max-priority=0"]),
        ({"defaultQueueMaxPriority": -5}, ["--default-queue-max-priority=-5"]),
        (
            {"holdsPerShape": 1, "sizeAgingSeconds": 0},
            ["--queue-holds-per-shape=1", "--queue-size-aging=0"],
        ),
        ({"carryHolds": True}, ["--queue-carry-holds"]),
        ({"carryHolds": False}, ["--no-queue-carry-holds"]),
        ({"spareWholeNodesSeconds": 0}, ["--queue-spare-whole-nodes=0"]),
        (
            {
                "defaultQueue": "research",
                "fairShareHalfLifeSeconds": 3600.5,
                "order": "fifo",
                "oldestFirstSeconds": 28800,
                "starvationSeconds": 600,
                "maxHolds": 0,
                "spareWholeNodesSeconds": 7200,
            },
            [
                "--default-queue=research",
                "--fair-share-half-life=3600.5",
                "--queue-order=fifo",
                "--queue-oldest-first=28800",
                "--queue-starvation=600",
                "--queue-max-holds=0",
                "--queue-spare-whole-nodes=7200",
            ],
        ),
    ],
)
def test_the_queue_values_become_hub_flags_only_when_set(
    helm: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path: Path,
    values: dict[str, Any],
    flags: list[str],
) -> None:
    """Defaults add no flag (the kustomize base stays the same install); a values file's
    numbers (YAML floats to Helm) come out as whole int32s."""
    extra = tmp_path / "queues.yaml"
    extra.write_text(yaml.safe_dump({"queues": values}))
    docs = render(helm, "gpufed-hub", CHARTS / "gpufed-hub/ci/test-values.yaml", "-f", str(extra))
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert queue_flags(args) == flags


QUEUE_FLAG_PREFIXES = ("--unlisted", "--default-queue", "--fair-share", "--queue-", "--no-queue-")


def queue_flags(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith(QUEUE_FLAG_PREFIXES)]


#: The hub's own queue defaults, written out here (not read from HubConfig), so a chart that
#: rendered a flag for an empty value, or a hub whose default moved, fails this test.
HUB_QUEUE_DEFAULTS = {
    "default_queue": "default",
    "unlisted_namespaces": "default-queue",
    "default_queue_max_priority": None,
    "fair_share_half_life_s": 86_400.0,
    "queue_order": "smallest-first",
    "queue_oldest_first_s": 57_600.0,
    "queue_starvation_s": 1800.0,
    "queue_max_holds": 4,
    "queue_holds_per_shape": 4,
    "queue_size_aging_s": 1800.0,
    "queue_carry_holds": False,
    "queue_spare_whole_nodes_s": 5400.0,
}


@pytest.mark.parametrize(
    ("values", "changed"),
    [
        ({}, {}),
        (
            {
                "defaultQueue": "research",
                "fairShareHalfLifeSeconds": 3600,
                "order": "fifo",
                "oldestFirstSeconds": 31536000,
                "starvationSeconds": 0,
                "maxHolds": 1000,
                "holdsPerShape": 64,
                "sizeAgingSeconds": 0.5,
                "carryHolds": True,
                "spareWholeNodesSeconds": 0,
            },
            {
                "default_queue": "research",
                "fair_share_half_life_s": 3600.0,
                "queue_order": "fifo",
                "queue_oldest_first_s": 31_536_000.0,
                "queue_starvation_s": 0.0,
                "queue_max_holds": 1000,
                "queue_holds_per_shape": 64,
                "queue_size_aging_s": 0.5,
                "queue_carry_holds": True,
                "queue_spare_whole_nodes_s": 0.0,
            },
        ),
        ({"carryHolds": False}, {}),
    ],
)
def test_the_rendered_queue_flags_give_the_hub_the_configured_rule(
    helm: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    values: dict[str, Any],
    changed: dict[str, Any],
) -> None:
    """The queue flags the chart renders, parsed by the real ``gpufed hub`` command line: the
    default install runs the hub's defaults (the same rule as ``gpufed simulate``'s), and every
    set value (the extremes the hub accepts) reaches the hub's configuration."""
    import typer
    from typer.testing import CliRunner

    from gpufed.cli import hub as hub_cli
    from gpufed.cli.main import app
    from gpufed.hub.components.config import HubConfig
    from gpufed.placement.queue import BackfillRule

    extra = tmp_path / "queues.yaml"
    extra.write_text(yaml.safe_dump({"queues": values}))
    docs = render(helm, "gpufed-hub", CHARTS / "gpufed-hub/ci/test-values.yaml", "-f", str(extra))
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    args = queue_flags(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    seen: list[HubConfig] = []
    validate = hub_cli._validate

    def first_check_only(fields: dict[str, Any], *, insecure: bool) -> HubConfig:
        seen.append(validate(fields, insecure=insecure))
        raise typer.Exit(0)  # before any side effect

    monkeypatch.setattr(hub_cli, "_validate", first_check_only)
    result = CliRunner().invoke(app, ["hub", "--data-dir", str(tmp_path / "hub"), *args])
    assert result.exit_code == 0, result.output
    (config,) = seen
    got = {field: getattr(config, field) for field in HUB_QUEUE_DEFAULTS}
    assert got == {**HUB_QUEUE_DEFAULTS, **changed}
    if not changed:
        assert config.backfill_rule == BackfillRule()


def test_the_console_value_adds_a_caller_identity_console_beside_the_hub(
    helm: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """``console.enabled``: a second container serving ``gpufed console --identity caller``
    (never the Pod's own identity) on the leader Service's ``console`` port, asking the hub in
    its own Pod for the blocks, admitted by the NetworkPolicy only from ``consoleFrom``. Off by
    default: no container, no port."""
    off = render(helm, "gpufed-hub", CHARTS / "gpufed-hub/ci/test-values.yaml")
    (deployment,) = [d for d in off if d["kind"] == "Deployment"]
    assert [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]] == ["hub"]
    docs = render(helm, "gpufed-hub", CHARTS / "gpufed-hub/ci/all-features-values.yaml")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    console = containers["console"]
    assert console["args"][:2] == ["console", "--identity=caller"]
    assert "--listen=0.0.0.0:8765" in console["args"]
    assert "--hub-url=http://127.0.0.1:8080" in console["args"]
    assert console["securityContext"]["readOnlyRootFilesystem"] is True
    service = next(
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "gpufed-hub"
    )
    assert service["spec"]["selector"]["gpufed.io/hub-role"] == "leader"
    assert {"name": "console", "port": 8765, "targetPort": "console"} in service["spec"]["ports"]
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    rule = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "console")
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
    ]


@pytest.mark.parametrize("chart", list(CHART_TARGETS))
def test_chart_with_test_values_renders_the_kustomize_base(
    helm: Callable[..., subprocess.CompletedProcess[str]], chart: str
) -> None:
    """manifests/<base> and the chart are the same install: same objects, same content, up to
    Helm's own labels and the config checksum annotation (so neither can drift)."""
    rendered = {
        _key(d): _strip_helm(d) for d in render(helm, chart, CHARTS / chart / "ci/test-values.yaml")
    }
    base = {
        _key(d): d
        for d in kustomize_base(CHART_TARGETS[chart][0])
        if d["kind"] not in KUSTOMIZE_ONLY
    }
    assert sorted(rendered) == sorted(base), "objects differ between the chart and manifests/"
    differ = [k for k in base if rendered[k] != base[k]]
    for k in differ:
        print(
            k,
            "\nchart:",
            json.dumps(rendered[k], sort_keys=True),
            "\nbase: ",
            json.dumps(base[k], sort_keys=True),
        )
    assert not differ, f"chart and manifests/ differ in {differ}: change both"


def test_the_hub_service_monitor_scrapes_every_replica_not_the_leader_service(
    helm: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """The ServiceMonitor's selector matches the headless gpufed-hub-metrics Service (every
    replica: the no-leader alert counts a standby's gpufed_hub_is_leader 0) and not the
    gpufed-hub Service, which reaches the leader only; the PodMonitor selects every hub Pod."""
    docs = render(helm, "gpufed-hub", CHARTS / "gpufed-hub/ci/all-features-values.yaml")
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    wanted = monitor["spec"]["selector"]["matchLabels"]
    selected = sorted(
        name
        for name, svc in services.items()
        if wanted.items() <= svc["metadata"]["labels"].items()
    )
    assert selected == ["gpufed-hub-metrics"]
    assert "gpufed.io/hub-role" not in services["gpufed-hub-metrics"]["spec"]["selector"]
    assert services["gpufed-hub"]["spec"]["selector"]["gpufed.io/hub-role"] == "leader"
    (pod_monitor,) = [d for d in docs if d["kind"] == "PodMonitor"]
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    assert pod_monitor["spec"]["selector"] == deploy["spec"]["selector"]


def test_chart_crds_are_the_generated_crds(
    helm: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    rendered = render(
        helm, "gpufed-hub", CHARTS / "gpufed-hub/ci/test-values.yaml", "--include-crds"
    )
    crds = {d["metadata"]["name"]: d for d in rendered if d["kind"] == "CustomResourceDefinition"}
    committed = {
        d["metadata"]["name"]: d
        for f in sorted((ROOT / "manifests" / "crds").glob("*.yaml"))
        for d in [yaml.safe_load(f.read_text())]
    }
    assert crds == committed


def test_prometheus_rule_wraps_the_monitoring_rule_file(
    helm: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """The PrometheusRule's groups are files/rules.yaml, which must be
    manifests/monitoring/rules.yaml once that exists (copy it over when it changes)."""
    chart_file = CHARTS / "gpufed-hub" / "files" / "rules.yaml"
    source = ROOT / "manifests" / "monitoring" / "rules.yaml"
    groups = yaml.safe_load(chart_file.read_text())["groups"]
    if source.exists():
        assert groups == yaml.safe_load(source.read_text())["groups"], (
            f"cp {source.relative_to(ROOT)} {chart_file.relative_to(ROOT)}"
        )
    rendered = render(
        helm,
        "gpufed-hub",
        CHARTS / "gpufed-hub/ci/test-values.yaml",
        "--set",
        "prometheusRule.enabled=true",
    )
    (rule,) = [d for d in rendered if d["kind"] == "PrometheusRule"]
    assert rule["spec"]["groups"] == groups


# --- server-side dry-run on the sandbox's API servers --------------------------------------------


def _wait_established(api: k8s.ApiextensionsV1Api, name: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = api.read_custom_resource_definition(name).status
        conditions = (status.conditions if status else None) or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        time.sleep(0.2)
    raise AssertionError(f"CRD {name} not Established after {timeout_s}s")


@pytest.fixture(scope="module")
def release_namespace(kube: Callable[[str], k8s.ApiClient]) -> None:
    """gpufed-system on the hub and on alpha, as ``helm install --create-namespace`` makes it
    (kept, like the hub tests' token namespace of the same name: a namespace being deleted
    would refuse later tests' objects for a while)."""
    for context in ("hub", "alpha"):
        try:
            k8s.CoreV1Api(kube(context)).create_namespace({"metadata": {"name": NAMESPACE}})
        except ApiException as exc:
            if exc.status != 409:
                raise


@pytest.fixture(scope="module")
def prometheus_operator_crds(kube: Callable[[str], k8s.ApiClient]) -> Iterator[None]:
    """The Prometheus Operator CRDs on the hub and on alpha, created here and deleted after
    (only those this fixture created: never an object we did not create)."""
    created: list[tuple[str, str]] = []
    try:
        for context in ("hub", "alpha"):
            api = k8s.ApiextensionsV1Api(kube(context))
            for f in sorted(PROM_CRDS.glob("*.yaml")):
                body = yaml.safe_load(f.read_text())
                try:
                    api.create_custom_resource_definition(body)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                    continue
                created.append((context, body["metadata"]["name"]))
            for ctx, name in created:
                if ctx == context:
                    _wait_established(api, name)
        yield
    finally:
        for context, name in created:
            k8s.ApiextensionsV1Api(kube(context)).delete_custom_resource_definition(name)


@pytest.fixture(scope="module")
def api_server(
    kube: Callable[[str], k8s.ApiClient], prometheus_operator_crds: None, release_namespace: None
) -> Callable[[str], k8s.ApiClient]:
    """``api_server(context)``: an admin client of a sandbox API server ready for the charts
    (the release namespace and the Prometheus Operator CRDs in place)."""
    return kube


def dry_run(client: k8s.ApiClient, docs: list[dict[str, Any]], cache: Path) -> list[str]:
    """Server-side apply of each object with ``dryRun=All`` (nothing is stored); the
    refusals, one line each (kind/name: status and the API server's message)."""
    dyn = DynamicClient(client, cache_file=str(cache))
    refused: list[str] = []
    for d in docs:
        resource = dyn.resources.get(api_version=d["apiVersion"], kind=d["kind"])
        try:
            dyn.server_side_apply(
                resource,
                body=d,
                namespace=d["metadata"].get("namespace"),
                field_manager="gpufed-chart-test",
                force_conflicts=True,
                dry_run="All",
            )
        except ApiException as exc:
            message = json.loads(exc.body).get("message", exc.body) if exc.body else exc.reason
            refused.append(f"{d['kind']}/{d['metadata']['name']}: {exc.status} {message}")
    return refused


@pytest.mark.parametrize(("chart", "values"), VALUES, ids=VALUE_IDS)
def test_rendered_objects_pass_a_server_side_dry_run(
    helm: Callable[..., subprocess.CompletedProcess[str]],
    api_server: Callable[[str], k8s.ApiClient],
    tmp_path: Path,
    chart: str,
    values: Path,
) -> None:
    context = CHART_TARGETS[chart][1]
    docs = render(helm, chart, values, "--include-crds")
    refused = dry_run(api_server(context), docs, tmp_path / "discovery.json")
    kinds = Counter(d["kind"] for d in docs)
    summary = {
        "chart": chart,
        "values": values.name,
        "context": context,
        "objects": len(docs),
        "refused": len(refused),
        "kinds": dict(sorted(kinds.items())),
    }
    print(json.dumps(summary))
    assert not refused, "\n".join(refused)


@pytest.mark.parametrize(
    ("chart", "setting", "refused_kind"),
    [
        ("gpufed-hub", "service.type=Bogus", "Service"),
        ("gpufed-hub", "serviceMonitor.interval=often", "ServiceMonitor"),
        ("gpufed-agent", "podMonitor.scrapeTimeout=soon", "PodMonitor"),
    ],
)
def test_the_dry_run_refuses_what_the_api_server_would_refuse(
    helm: Callable[..., subprocess.CompletedProcess[str]],
    api_server: Callable[[str], k8s.ApiClient],
    tmp_path: Path,
    chart: str,
    setting: str,
    refused_kind: str,
) -> None:
    """The check above can fail: a value the real schemas (core and Prometheus Operator)
    refuse is reported, naming the object."""
    values = CHARTS / chart / "ci" / "all-features-values.yaml"
    docs = render(helm, chart, values, "--set", setting)
    refused = dry_run(api_server(CHART_TARGETS[chart][1]), docs, tmp_path / "discovery.json")
    assert [r.split("/")[0] for r in refused] == [refused_kind], refused
