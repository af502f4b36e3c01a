"""Helpers of the end-to-end tests: the hub and member API servers as a user and an operator
see them, GPUJob builders named after their shapes, and polling with timeouts (the hub, the
agents and the clusters are external processes: there is nothing in-process to await).
"""

from __future__ import annotations

import contextlib
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpufed.api.gpujob import GPUJob
from gpufed.api.labels import (
    GROUP,
    JOB_UID_LABEL,
    SIM_DURATION_ANNOTATION,
    SIM_EXIT_CODE_ANNOTATION,
    VERSION,
)
from gpufed.api.membercluster import MemberCluster
from gpufed.sandbox.runtime import Sandbox, SandboxInfo

T = TypeVar("T")
H100 = "NVIDIA-H100-80GB-HBM3"
GB200 = "NVIDIA-GB200"
#: Namespace of the drills' GPUJobs (emptied after each test).
DRILL_NS = "drill"


def wait_until(check: Callable[[], T | None], what: str, timeout_s: float = 60.0) -> T:
    """Poll ``check`` every 0.2 s until it returns something truthy; AssertionError naming
    ``what`` (and the last value) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (ApiException, OSError) as exc:  # a restarting API server: ask again
            last = None
            if isinstance(exc, ApiException) and exc.status not in (None, 0, 500, 503, 504):
                raise
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of a GET of ``url`` (None: no answer: refused, killed, timed out)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


@contextlib.contextmanager
def priority_classes(api: k8s.ApiClient, classes: Mapping[str, int]) -> Iterator[None]:
    """PriorityClasses ``name -> value`` (``preemptionPolicy: PreemptLowerPriority``) on the
    hub cluster for the length of the block (one left by an earlier run is reused)."""
    scheduling: Any = k8s.SchedulingV1Api(api)
    for name, value in classes.items():
        try:
            scheduling.create_priority_class(
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": name},
                    "value": value,
                    "preemptionPolicy": "PreemptLowerPriority",
                }
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
    try:
        yield
    finally:
        for name in classes:
            with contextlib.suppress(ApiException):
                scheduling.delete_priority_class(name)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:5]}"


def batch_job(
    gpus: int = 1,
    *,
    pods: int = 1,
    run_for: str | None = None,
    exit_code: int | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    resource: str = "nvidia.com/gpu",
) -> dict[str, Any]:
    """A batch/v1 Job template: ``pods`` pods of ``gpus`` (of ``resource``) each. Without
    ``run_for`` the pods run until deleted; ``exit_code`` makes them fail after ``run_for``."""
    annotations: dict[str, str] = {}
    if run_for:
        annotations[SIM_DURATION_ANNOTATION] = run_for
    if exit_code is not None:
        annotations[SIM_EXIT_CODE_ANNOTATION] = str(exit_code)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {"name": "main", "image": "e2e:1.0", "resources": {"limits": {resource: gpus}}}
        ],
    }
    if tolerations:
        spec["tolerations"] = tolerations
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "backoffLimit": 0,
            "template": {"metadata": {"annotations": annotations}, "spec": spec},
        },
    }


class Hub:
    """The hub cluster's API as a user sees it (GPUJobs, MemberClusters, Events)."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self.api = api
        self.custom: Any = k8s.CustomObjectsApi(api)
        self.core: Any = k8s.CoreV1Api(api)

    def ensure_namespace(self, ns: str) -> None:
        try:
            self.core.create_namespace({"metadata": {"name": ns}})
        except ApiException as exc:
            if exc.status != 409:
                raise

    def create_queue(self, name: str, *, gpu_product: str, nominal: int) -> None:
        """A GPUQueue ``name`` over namespace ``name`` (created if missing) with a fleet-wide
        quota of ``nominal`` GPUs of ``gpu_product`` and no borrowing."""
        self.ensure_namespace(name)
        self.custom.create_cluster_custom_object(
            GROUP,
            VERSION,
            "gpuqueues",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "GPUQueue",
                "metadata": {"name": name},
                "spec": {
                    "namespaces": [name],
                    "quotas": [
                        {"gpuProduct": gpu_product, "nominal": nominal, "borrowingLimit": 0}
                    ],
                },
            },
        )

    def submit(
        self,
        name: str,
        template: dict[str, Any],
        *,
        namespace: str = DRILL_NS,
        placement: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Create a GPUJob; returns the created object (``metadata.uid`` set)."""
        obj: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "gpujobs",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "GPUJob",
                "metadata": {"name": name},
                "spec": {"template": template, "placement": placement or {}},
            },
        )
        return obj

    def job(self, name: str, namespace: str = DRILL_NS) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "gpujobs", name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def status(self, name: str, namespace: str = DRILL_NS) -> dict[str, Any]:
        return dict(((self.job(name, namespace) or {}).get("status")) or {})

    def phase(self, name: str, namespace: str = DRILL_NS) -> str | None:
        obj = self.job(name, namespace)
        return None if obj is None else GPUJob.model_validate(obj).phase

    def wait_phase(
        self,
        name: str,
        phases: str | tuple[str, ...],
        namespace: str = DRILL_NS,
        timeout_s: float = 60,
    ) -> dict[str, Any]:
        """Until the GPUJob's phase is one of ``phases``; returns its status."""
        want = (phases,) if isinstance(phases, str) else phases

        def check() -> dict[str, Any] | None:
            st = self.status(name, namespace)
            return st if st.get("phase", "Pending") in want else None

        return wait_until(check, f"GPUJob {namespace}/{name} in {'/'.join(want)}", timeout_s)

    def delete(self, name: str, namespace: str = DRILL_NS) -> None:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "gpujobs", name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def jobs(self, namespace: str = DRILL_NS) -> list[dict[str, Any]]:
        out = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "gpujobs")
        return list(out.get("items", []))

    def clear(self, namespace: str = DRILL_NS, timeout_s: float = 60) -> None:
        """Delete every GPUJob of ``namespace`` and wait until the hub let them go (finalizer
        removed once the member objects are deleted)."""
        for obj in self.jobs(namespace):
            self.delete(obj["metadata"]["name"], namespace)
        wait_until(lambda: not self.jobs(namespace), f"GPUJobs of {namespace} gone", timeout_s)

    def member(self, name: str) -> MemberCluster:
        raw = self.custom.get_cluster_custom_object(GROUP, VERSION, "memberclusters", name)
        return MemberCluster.model_validate(raw)

    def member_ready(self, name: str) -> bool | None:
        st = self.member(name).status
        return st.ready() if st else None

    def member_condition(self, name: str) -> tuple[str, str]:
        """(status, reason) of the member's Ready condition."""
        st = self.member(name).status
        for c in st.conditions if st else []:
            if c.type == "Ready":
                return c.status, c.reason
        return "Unknown", ""

    def suspects(self, member: str) -> list[str]:
        """The member's suspect nodes as its MemberCluster status shows them."""
        st = self.member(member).status
        return [s.node for s in (st.suspect_nodes if st else [])]

    def gpus_free(self, member: str, product: str) -> int:
        st = self.member(member).status
        return (st.gpus_free if st else {}).get(product, 0)

    def gpus_total(self, member: str, product: str) -> int:
        st = self.member(member).status
        return (st.gpus_total if st else {}).get(product, 0)

    def events(self, name: str, namespace: str = DRILL_NS) -> list[str]:
        """Reasons of the Events about a GPUJob."""
        evs = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        )
        return [e.reason for e in evs.items]

    def member_events(self, name: str) -> list[tuple[str, str, str]]:
        """(type, reason, involvedObject.uid) of the Events about MemberCluster ``name`` (in
        ``default``, where Events about cluster-scoped objects live)."""
        evs = self.core.list_namespaced_event(
            "default",
            field_selector=f"involvedObject.kind=MemberCluster,involvedObject.name={name}",
        )
        return [(e.type, e.reason, e.involved_object.uid) for e in evs.items]


class Member:
    """One member cluster's API as an operator sees it (what the agent created there)."""

    def __init__(self, name: str, api: k8s.ApiClient) -> None:
        self.name = name
        self.api = api
        self.batch: Any = k8s.BatchV1Api(api)
        self.core: Any = k8s.CoreV1Api(api)

    def jobs_of(self, uid: str) -> list[Any]:
        """batch/v1 Jobs labelled with GPUJob ``uid`` (every namespace)."""
        return list(
            self.batch.list_job_for_all_namespaces(label_selector=f"{JOB_UID_LABEL}={uid}").items
        )

    def pods_of(self, uid: str, *, running: bool = False) -> list[Any]:
        pods = self.core.list_pod_for_all_namespaces(label_selector=f"{JOB_UID_LABEL}={uid}").items
        return [p for p in pods if not running or p.status.phase == "Running"]

    def cordon(self, node: str, unschedulable: bool = True) -> None:
        self.core.patch_node(node, {"spec": {"unschedulable": unschedulable}})

    def node_names(self) -> list[str]:
        return sorted(n.metadata.name for n in self.core.list_node().items)


class E2E:
    """Everything a test needs: the sandbox (components to kill and start), the hub, the
    members."""

    def __init__(self, sandbox: Sandbox, info: SandboxInfo) -> None:
        self.sandbox = sandbox
        self.info = info
        self.hub = Hub(info.api_client("hub"))
        self.members = {m: Member(m, info.api_client(m)) for m in info.members}
        cp = info.control_plane
        assert cp is not None, "the e2e sandbox runs the hub and agents"
        self.options = cp.options

    def kill(self, component: str) -> None:
        self.sandbox.supervisor.kill(component)

    def start(self, component: str) -> None:
        self.sandbox.supervisor.start(component)

    def running(self, component: str) -> bool:
        return self.sandbox.supervisor.is_running(component)

    def wait_healthy(self, timeout_s: float = 90) -> None:
        """Start whatever a drill left stopped (etcd first), then wait until the hub leads and
        every member is Ready on it with all its nodes."""
        for name in self.sandbox.supervisor.names():
            if not self.running(name):
                self.start(name)
        self.sandbox.wait_control_plane(timeout_s, info=self.info)

    def copies(self, uid: str) -> dict[str, list[Any]]:
        """Member Jobs of GPUJob ``uid`` in every member (members with none left out)."""
        return {m: jobs for m, member in self.members.items() if (jobs := member.jobs_of(uid))}

    def close(self) -> None:
        for api in [self.hub.api, *(m.api for m in self.members.values())]:
            api.close()  # type: ignore[no-untyped-call]
