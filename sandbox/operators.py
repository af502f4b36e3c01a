"""The workload operators the sandbox runs in members: JobSet, the Kubeflow training-operator
(PyTorchJob) and KubeRay (RayJob, RayCluster), each a pinned Go build, its real CRDs and
webhooks read from the built module, and one process per member that enables it.

A fleet chooses them per member (``clusters[].operators``, :data:`gpufed.api.fleet.KNOWN_OPERATORS`).
Each is built like Kueue (:class:`gpufed.sandbox.gotool.PinnedTool`; wrapper modules
``sandbox/gobuild/{jobset,training-operator,kuberay}``) into its own cache directory::

    ~/.cache/gpufed/bin/jobset-v0.11.1_go1.26.8/jobset
    ~/.cache/gpufed/bin/training-operator-v1.8.1_go1.26.8/training-operator
    ~/.cache/gpufed/bin/kuberay-v1.5.0_go1.26.8/kuberay

Upstream's YAML is never committed: the CRDs and webhook manifests are read at run time from
the module in ``go env GOMODCACHE`` (:meth:`PinnedTool.module_dir`). What a manager outside a
pod needs is rendered here (pure: :func:`objects`, :func:`component`) and applied by
:func:`start_operators`, which :meth:`gpufed.sandbox.runtime.Sandbox.up` calls once the
member's nodes are Ready and before the agents connect (they discover served kinds then):

* CRDs as shipped (server-side applied), waited for until Established;
* JobSet's CRD (``Operator.on_hub``), and nothing else, in the hub cluster too: a JobSet applied
  there with ``managedBy: gpufed.io/hub`` is federated by the hub (docs/hub.md "Plain workloads
  on the hub"), never run there;
* webhooks (JobSet's, the training-operator's PyTorchJob validator) with ``url:
  https://127.0.0.1:<port><path>`` client configurations and the sandbox's own CA; KubeRay's
  webhook is off by default upstream (``ENABLE_WEBHOOKS``) and stays off;
* certificates (:mod:`gpufed.sandbox.webhookcerts`, shared with Kueue): one CA and serving
  certificate per operator per sandbox, written to the process's webhook certificate
  directory; the training-operator's built-in rotator
  (open-policy-agent/cert-controller) gets its Secret seeded with them so it keeps them;
* the manager, run with the member's admin kubeconfig, leader election off, every port on
  127.0.0.1 and picked free; component ``<operator>/<member>``, log
  ``<state>/logs/<operator>/<member>.log``, ready at its health port's ``/readyz``.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gpufed.api.fleet import HUB_CLUSTER_NAME, KNOWN_OPERATORS, FleetSpec
from gpufed.sandbox import kueue_config as kc
from gpufed.sandbox import webhookcerts as wc
from gpufed.sandbox.binaries import BinariesError
from gpufed.sandbox.gotool import PinnedTool, check_build_info
from gpufed.sandbox.kube import CORE_PATHS, kube_request, server_side_apply
from gpufed.sandbox.state import SandboxError, SandboxInfo
from gpufed.sandbox.supervisor import ComponentSpec, Probe, Supervisor
from gpufed.sandbox.webhookcerts import WebhookCerts

Progress = Callable[[str], None]

#: libyaml's loader where PyYAML has it: the CRDs are large (JobSet's 0.8 MB, PyTorchJob's
#: 0.6 MB: pure-Python parsing takes ~18 s on a loaded 2-core machine, libyaml ~2 s).
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_all(path: Path) -> list[Any]:
    return [d for d in yaml.load_all(path.read_text(), Loader=_LOADER) if d]


@functools.lru_cache(maxsize=16)
def _load_crd_file(path: Path) -> tuple[Any, ...]:
    """A CRD file's documents, parsed once per process (read-only module files; every member
    that runs the operator gets the same CRDs)."""
    return tuple(_load_all(path))


def _build_info_check(module: str, env: str) -> Callable[[Path, str], str]:
    """A check that the binary's Go build info (which ``go build`` embeds as plain text) names
    ``module`` at the pinned version, as :func:`gpufed.sandbox.kueue.check_kueue` does for
    Kueue: the managers have no ``--version`` and need a cluster to start."""

    def check(path: Path, version: str) -> str:
        check_build_info(path, module, version, what="workload operator", env=env)
        return f"{module.rsplit('/', 1)[-1]} {version}"

    return check


@dataclass(frozen=True)
class CertNames:
    """What a certificate rotator accepts: the CA's name and organization, the serving DNS name
    and, for a rotator that keeps them in a Secret, that Secret's ``(namespace, name)``."""

    ca_name: str
    organization: str
    service: str
    secret: tuple[str, str] | None = None


@dataclass(frozen=True)
class OperatorPorts:
    """The TCP ports on 127.0.0.1 one operator process listens on."""

    webhook: int
    metrics: int
    health: int


@dataclass(frozen=True)
class Operator:
    """One workload operator: its pinned build (``tool``), the CRD files in its module
    (``crds``), the kinds it serves (``Kind.group``), its webhook manifest in the module with
    the JSON patches upstream's kustomization applies to it (``webhook_patches``, only
    ``replace`` of whole webhooks), which webhooks to keep (``webhook_resources``: plural
    resource names their rules must be limited to), the names the webhook configurations get
    (``webhook_names``: kind -> name), the namespace it needs and its certificate names."""

    name: str
    tool: PinnedTool
    crds: tuple[str, ...]
    kinds: tuple[str, ...]
    namespace: str
    certs: CertNames
    webhooks: str | None = None
    webhook_patches: tuple[str, ...] = ()
    webhook_resources: frozenset[str] = frozenset()
    webhook_names: Mapping[str, str] = field(default_factory=dict)
    #: its CRDs are installed in the hub cluster too: the hub federates its kind when applied
    #: there with ``managedBy: gpufed.io/hub`` (only JobSet: docs/hub.md says why not the others)
    on_hub: bool = False

    def component(self, member: str) -> str:
        """Supervisor component name, ``<operator>/<member>``."""
        return f"{self.name}/{member}"


def _tool(name: str, module: str, package: str, ldflags: str, env: str, cold: str) -> PinnedTool:
    return PinnedTool(
        name=name,
        module=module,
        package=package,
        ldflags=lambda version: ldflags.format(version=version),
        check=_build_info_check(module, env),
        env=env,
        cold=cold,
    )


JOBSET = Operator(
    name="jobset",
    tool=_tool(
        "jobset",
        "sigs.k8s.io/jobset",
        "sigs.k8s.io/jobset",
        "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion={version}",
        "GPUFED_JOBSET",
        "~9 min wall on 2 busy cores",
    ),
    crds=("config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",),
    kinds=("JobSet.jobset.x-k8s.io",),
    on_hub=True,
    namespace="jobset-system",
    certs=CertNames("jobset-ca", "jobset", "jobset-webhook-service.jobset-system.svc"),
    webhooks="config/components/webhook/manifests.yaml",
    # the pod webhooks only for the JobSet's pods (objectSelector), as upstream installs them
    webhook_patches=(
        "config/components/webhook/patches/mutating-patch.yaml",
        "config/components/webhook/patches/validating-patch.yaml",
    ),
    webhook_resources=frozenset({"jobsets", "pods"}),
    webhook_names={
        "MutatingWebhookConfiguration": "jobset-mutating-webhook-configuration",
        "ValidatingWebhookConfiguration": "jobset-validating-webhook-configuration",
    },
)

TRAINING_OPERATOR = Operator(
    name="training-operator",
    tool=_tool(
        "training-operator",
        "github.com/kubeflow/training-operator",
        "github.com/kubeflow/training-operator/cmd/training-operator.v1",
        "-s -w",
        "GPUFED_TRAINING_OPERATOR",
        "~13 min wall on 2 busy cores",
    ),
    crds=("manifests/base/crds/kubeflow.org_pytorchjobs.yaml",),
    kinds=("PyTorchJob.kubeflow.org",),
    namespace="kubeflow",
    # what its rotator (pkg/cert) checks and keeps: the Secret, CA and service names
    certs=CertNames(
        "training-operator-ca",
        "training-operator",
        "training-operator.kubeflow.svc",
        secret=("kubeflow", "training-operator-webhook-cert"),
    ),
    webhooks="manifests/base/webhook/manifests.yaml",
    webhook_resources=frozenset({"pytorchjobs"}),
    # the name its rotator injects the CA into (manifests/base/webhook/patch.yaml)
    webhook_names={"ValidatingWebhookConfiguration": "validator.training-operator.kubeflow.org"},
)

KUBERAY = Operator(
    name="kuberay",
    tool=_tool(
        "kuberay",
        "github.com/ray-project/kuberay/ray-operator",
        "github.com/ray-project/kuberay/ray-operator",
        "-s -w",
        "GPUFED_KUBERAY",
        "~18 min wall on 2 busy cores",
    ),
    crds=(
        "config/crd/bases/ray.io_rayclusters.yaml",
        "config/crd/bases/ray.io_rayjobs.yaml",
        "config/crd/bases/ray.io_rayservices.yaml",
    ),
    kinds=("RayJob.ray.io", "RayCluster.ray.io"),
    namespace="ray-system",
    certs=CertNames("kuberay-ca", "kuberay", "kuberay-webhook.ray-system.svc"),
)

#: The file the training-operator's certificate rotator waits for (a fixed path in its code,
#: pkg/cert); only its presence counts, what it serves comes from the process's ``$TMPDIR``.
ROTATOR_CERT_FILE = Path("/tmp/k8s-webhook-server/serving-certs/tls.crt")

#: Every operator by its fleet name, in :data:`KNOWN_OPERATORS` order.
OPERATORS: dict[str, Operator] = {op.name: op for op in (JOBSET, TRAINING_OPERATOR, KUBERAY)}
assert tuple(OPERATORS) == KNOWN_OPERATORS


def operator(name: str) -> Operator:
    """The operator named ``name``; ``KeyError`` naming the known ones otherwise."""
    try:
        return OPERATORS[name]
    except KeyError:
        raise KeyError(f"unknown operator {name!r}; known: {', '.join(OPERATORS)}") from None


def used_operators(fleet: FleetSpec) -> list[Operator]:
    """The operators some member of ``fleet`` enables, in :data:`OPERATORS` order."""
    wanted = {name for c in fleet.clusters for name in c.operators}
    return [op for name, op in OPERATORS.items() if name in wanted]


def build_operators(
    names: Sequence[str] = KNOWN_OPERATORS, *, force: bool = False, progress: Progress | None = None
) -> dict[str, Path]:
    """Build the named operators (default: all) into the binary cache; skipped when current.
    Returns each binary's path by name. Raises :class:`BinariesError` (Go missing, a build
    failed: the message names its log)."""
    return {n: operator(n).tool.build(force=force, progress=progress) for n in names}


# --- rendering (pure) --------------------------------------------------------------------------


def port_names(fleet: FleetSpec) -> list[str]:
    """Port keys of every operator process: ``<operator>/<member>/{webhook,metrics,health}``."""
    return [
        f"{op}/{c.name}/{kind}"
        for c in fleet.clusters
        for op in c.operators
        for kind in ("webhook", "metrics", "health")
    ]


def ports_of(op: Operator, member: str, ports: Mapping[str, int]) -> OperatorPorts:
    """The :class:`OperatorPorts` of ``op`` in ``member`` from the :func:`port_names` keys."""
    key = f"{op.name}/{member}"
    return OperatorPorts(ports[f"{key}/webhook"], ports[f"{key}/metrics"], ports[f"{key}/health"])


def _replace_patch(doc: dict[str, Any], ops: Any, source: str) -> dict[str, Any]:
    """``doc`` with upstream's JSON patch ``ops`` applied (only ``replace`` of
    ``/webhooks/<i>`` or ``/metadata/name``, the ops the operators' kustomizations use)."""
    out: dict[str, Any] = json.loads(json.dumps(doc))
    for op in ops or []:
        path = str(op.get("path", ""))
        parts = path.strip("/").split("/")
        if op.get("op") != "replace":
            raise ValueError(f"{source}: unsupported patch op {op.get('op')!r} at {path}")
        if len(parts) == 2 and parts[0] == "webhooks" and parts[1].isdigit():
            out["webhooks"][int(parts[1])] = op["value"]
        elif parts == ["metadata", "name"]:
            out["metadata"]["name"] = op["value"]
        else:
            raise ValueError(f"{source}: unsupported patch path {path}")
    return out


def webhook_configurations(
    op: Operator, module: Path, base_url: str, ca_bundle: str
) -> list[dict[str, Any]]:
    """``op``'s webhook configurations from its module (patched as upstream's kustomization
    does), each webhook's ``clientConfig.service`` turned into ``{url: <base_url><path>,
    caBundle}``, only webhooks whose rules name nothing but ``op.webhook_resources``, renamed to
    ``op.webhook_names``. Empty when ``op`` installs no webhook. ``ValueError`` when the
    manifest changed shape (no service path)."""
    if op.webhooks is None:
        return []
    docs = _load_all(module / op.webhooks)
    for patch in op.webhook_patches:
        ops = yaml.load((module / patch).read_text(), Loader=_LOADER)
        # each patch file targets the configuration of one kind, which it names by its ops
        kind = "Mutating" if "mutating" in patch else "Validating"
        docs = [
            _replace_patch(d, ops, patch) if str(d.get("kind", "")).startswith(kind) else d
            for d in docs
        ]
    out = []
    for doc in docs:
        name = op.webhook_names.get(str(doc.get("kind")))
        if name is None:
            continue
        hooks = []
        for hook in doc.get("webhooks") or []:
            resources = {r for rule in hook.get("rules") or [] for r in rule.get("resources", [])}
            if not resources or not resources <= op.webhook_resources:
                continue
            hooks.append(wc.url_webhook(hook, base_url, ca_bundle, source=op.webhooks))
        out.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": doc["kind"],
                "metadata": {"name": name},
                "webhooks": hooks,
            }
        )
    return out


def without_descriptions(schema: Any) -> Any:
    """``schema`` (an OpenAPI v3 schema) without its ``description`` texts, as controller-gen's
    ``crd:maxDescLen=0`` writes it: only string-valued ``description`` keys go, so a property
    *named* ``description`` (a schema object) stays. Validation is unchanged."""
    if isinstance(schema, dict):
        return {
            k: without_descriptions(v)
            for k, v in schema.items()
            if not (k == "description" and isinstance(v, str))
        }
    if isinstance(schema, list):
        return [without_descriptions(v) for v in schema]
    return schema


def crds(op: Operator, module: Path) -> list[dict[str, Any]]:
    """``op``'s CustomResourceDefinitions as shipped in its module (one per listed file), their
    schemas without descriptions (:func:`without_descriptions`): KubeRay's three CRDs are 3.2 MB
    of YAML, mostly the Kubernetes field docs of embedded pod templates, and a loaded 2-core
    API server timed out (504) building their OpenAPI; without descriptions they are a fraction
    of that. Served versions, schemas and subresources are as shipped."""
    out = []
    for rel in op.crds:
        for doc in _load_crd_file(module / rel):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                spec = dict(doc["spec"])
                spec["versions"] = [
                    {**v, "schema": without_descriptions(v["schema"])} if "schema" in v else v
                    for v in spec.get("versions") or []
                ]
                out.append({**doc, "metadata": {"name": doc["metadata"]["name"]}, "spec": spec})
    return out


def objects(
    op: Operator, module: Path, ports: OperatorPorts, certs: WebhookCerts
) -> list[dict[str, Any]]:
    """What ``op`` needs in a member before its process starts, in apply order: its namespace,
    the seeded rotator Secret (if any), its CRDs and its webhook configurations."""
    out: list[dict[str, Any]] = [kc.namespace(op.namespace)]
    if op.certs.secret is not None:
        ns, name = op.certs.secret
        out.append(wc.webhook_secret(certs, name=name, namespace=ns))
    out += crds(op, module)
    base = f"https://127.0.0.1:{ports.webhook}"
    out += webhook_configurations(op, module, base, certs.ca_bundle)
    return out


def create_certs(op: Operator) -> WebhookCerts:
    """A CA and serving certificate for ``op``'s webhook (``127.0.0.1`` and the names its
    rotator checks)."""
    c = op.certs
    return wc.create_webhook_certs(
        ca_name=c.ca_name, organization=c.organization, service=c.service
    )


def jobset_configuration(ports: OperatorPorts, cert_dir: Path) -> dict[str, Any]:
    """JobSet's ``config.jobset.x-k8s.io/v1alpha1`` Configuration: ports on 127.0.0.1, the
    webhook certificates in ``cert_dir`` (internal certificate management off), no leader
    election."""
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "webhook": {"host": "127.0.0.1", "port": ports.webhook, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": f"127.0.0.1:{ports.metrics}"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.health}"},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 100, "burst": 200},
    }


def component(
    op: Operator, member: str, binary: Path, kubeconfig: Path, ports: OperatorPorts, workdir: Path
) -> ComponentSpec:
    """The process of ``op`` in ``member``: ``binary`` run with ``kubeconfig`` (``KUBECONFIG``)
    and its files under ``workdir`` (``config.yaml`` for JobSet; ``tmp/`` as ``TMPDIR`` for the
    training-operator, whose webhook server reads its certificates from
    ``$TMPDIR/k8s-webhook-server/serving-certs``). Ready when ``/readyz`` on its health port
    answers 200 (JobSet and the training-operator: certificates loaded and webhook serving)."""
    env = {"KUBECONFIG": str(kubeconfig)}
    health = f"127.0.0.1:{ports.health}"
    if op.name == "jobset":
        argv = [str(binary), f"--config={workdir / 'config.yaml'}", "--zap-log-level=info"]
    elif op.name == "training-operator":
        argv = [
            str(binary),
            "--enable-scheme=pytorchjob",
            f"--metrics-bind-address=127.0.0.1:{ports.metrics}",
            f"--health-probe-bind-address={health}",
            f"--webhook-server-port={ports.webhook}",
            "--leader-elect=false",
            "--controller-threads=4",
        ]
        env.update({"TMPDIR": str(workdir / "tmp"), "MY_POD_NAMESPACE": op.namespace})
    else:
        argv = [
            str(binary),
            f"--metrics-addr=127.0.0.1:{ports.metrics}",
            f"--health-probe-bind-address={health}",
            "--enable-leader-election=false",
            "--log-stdout-encoder=console",
        ]
    return ComponentSpec(
        name=op.component(member),
        argv=argv,
        env=env,
        cwd=str(workdir),
        ports=[ports.webhook, ports.metrics, ports.health] if op.webhooks else [ports.health],
        probe=Probe(kind="http", url=f"http://{health}/readyz"),
        start_timeout_s=120,
    )


def write_files(op: Operator, workdir: Path, ports: OperatorPorts, certs: WebhookCerts) -> None:
    """The files :func:`component` names: the webhook certificates where the process reads
    them and JobSet's configuration."""
    workdir.mkdir(parents=True, exist_ok=True)
    if op.name == "jobset":
        wc.write_cert_dir(certs, workdir / "certs")
        config = jobset_configuration(ports, workdir / "certs")
        (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    elif op.name == "training-operator":
        wc.write_cert_dir(certs, workdir / "tmp" / "k8s-webhook-server" / "serving-certs")
        # Its rotator waits for a file at this fixed path (where a pod mounts the Secret)
        # before it lets the controllers start; the webhook server reads $TMPDIR's copy.
        marker = ROTATOR_CERT_FILE
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_bytes(certs.tls_crt)


# --- bring-up ----------------------------------------------------------------------------------


def _path(obj: Mapping[str, Any]) -> str:
    prefix, plural, namespaced = CORE_PATHS[obj["kind"]]
    meta = obj["metadata"]
    ns = f"/namespaces/{meta['namespace']}" if namespaced else ""
    return f"{prefix}{ns}/{plural}/{meta['name']}"


def _apply(api: k8s.ApiClient, obj: Mapping[str, Any]) -> None:
    server_side_apply(api, _path(obj), obj)


def apply_objects(api: k8s.ApiClient, objs: Sequence[Mapping[str, Any]], timeout_s: float) -> None:
    """Server-side apply ``objs`` in order, then wait until every CRD among them is
    Established. A busy API server's 500/503/504 (building a large CRD's OpenAPI) and dropped
    connections are retried until ``timeout_s`` seconds have passed; then, or for any other
    refusal, :class:`SandboxError` naming the object."""
    deadline = time.monotonic() + timeout_s
    for obj in objs:
        while True:
            try:
                _apply(api, obj)
                break
            except ApiException as exc:
                if exc.status not in (500, 503, 504) or time.monotonic() > deadline:
                    raise SandboxError(
                        f"cannot apply {obj['kind']} {obj['metadata']['name']}: HTTP "
                        f"{exc.status} {exc.reason}"
                    ) from None
            except (HTTPError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise SandboxError(
                        f"cannot apply {obj['kind']} {obj['metadata']['name']}: {exc}"
                    ) from None
            time.sleep(1.0)
    deadline = time.monotonic() + timeout_s
    for obj in objs:
        if obj["kind"] != "CustomResourceDefinition":
            continue
        while True:
            try:
                got = kube_request(api, "GET", _path(obj), timeout_s=10)
                conds = (got.get("status") or {}).get("conditions") or []
                if any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                    break
            except (ApiException, HTTPError, OSError):
                pass
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"CRD {obj['metadata']['name']} not Established after {timeout_s:.0f}s"
                )
            time.sleep(0.2)


def start_operators(
    supervisor: Supervisor,
    info: SandboxInfo,
    fleet: FleetSpec,
    ports: Mapping[str, int],
    *,
    timeout_s: float = 180.0,
) -> list[str]:
    """Run every operator ``fleet`` enables: per member write its files under
    ``<state>/operators/<operator>/<member>/``, install its objects (:func:`objects`, CRDs
    waited for until Established), register its process; install its CRDs (only) in the hub
    cluster when ``op.on_hub`` (the hub federates that kind applied there with ``managedBy:
    gpufed.io/hub``); then start the processes and return once
    each answers ``/readyz``. Returns the component names. ``ports`` holds every
    :func:`port_names` key. :class:`SandboxError` when a binary is not built (naming `gpufed
    local build`) or the module's YAML cannot be read."""
    started = []
    for op in used_operators(fleet):
        try:
            binary = op.tool.ensure(build_if_missing=False)
            module = op.tool.module_dir()
        except BinariesError as exc:
            raise SandboxError(f"operator {op.name}: {exc}") from None
        certs = create_certs(op)
        for c in fleet.clusters:
            if op.name not in c.operators:
                continue
            p = ports_of(op, c.name, ports)
            workdir = info.state_dir / "operators" / op.name / c.name
            write_files(op, workdir, p, certs)
            apply_objects(info.api_client(c.name), objects(op, module, p, certs), timeout_s)
            kubeconfig = info.clusters[c.name].kubeconfig
            supervisor.register(component(op, c.name, binary, kubeconfig, p, workdir))
            started.append(op.component(c.name))
        if op.on_hub and HUB_CLUSTER_NAME in info.clusters:
            # the hub cluster serves the kind too (CRDs only: no process, no webhook), so a
            # workload of that kind applied there with managedBy gpufed.io/hub is federated
            # (docs/hub.md "Plain workloads on the hub"); only kinds the hub can accept: each
            # CRD costs the hub API server an OpenAPI build (KubeRay's three are the largest)
            apply_objects(info.api_client(HUB_CLUSTER_NAME), crds(op, module), timeout_s)
    if started:
        supervisor.start_many(started, timeout=timeout_s)
    return started
