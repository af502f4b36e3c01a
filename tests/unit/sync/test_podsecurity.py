"""Pod Security Standards, rule by rule: for each control of baseline and restricted, a pod
template that breaks it (the violation names the field and the level) and the same template
with the field fixed (no violation). Pod and container paths are those of a batch Job."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gpufed.sync.podsecurity import Level, check_pod_template, parse_level

PATH = "spec.template.spec.template"
C0 = f"{PATH}.spec.containers[0]"
SC0 = f"{C0}.securityContext"
PSC = f"{PATH}.spec.securityContext"

Edit = Callable[[dict[str, Any]], None]


def baseline_pod() -> dict[str, Any]:
    """The default, minimally specified pod: passes baseline, not restricted."""
    return {"spec": {"containers": [{"name": "main", "image": "trainer:1.0"}]}}


def restricted_pod() -> dict[str, Any]:
    """A pod hardened as restricted asks."""
    return {
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "image": "trainer:1.0",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        }
    }


def spec(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]  # type: ignore[no-any-return]


def ctx(pod: dict[str, Any], i: int = 0) -> dict[str, Any]:
    return spec(pod)["containers"][i].setdefault("securityContext", {})  # type: ignore[no-any-return]


def psc(pod: dict[str, Any]) -> dict[str, Any]:
    return spec(pod).setdefault("securityContext", {})  # type: ignore[no-any-return]


# (control, the field the violation names, break it, fix it)
BASELINE: list[tuple[str, str, Edit, Edit]] = [
    (
        "HostProcess",
        f"{PSC}.windowsOptions.hostProcess",
        lambda p: psc(p).update(windowsOptions={"hostProcess": True}),
        lambda p: psc(p).update(windowsOptions={"hostProcess": False}),
    ),
    (
        "HostProcess",
        f"{SC0}.windowsOptions.hostProcess",
        lambda p: ctx(p).update(windowsOptions={"hostProcess": True}),
        lambda p: ctx(p).update(windowsOptions={}),
    ),
    (
        "Host Namespaces",
        f"{PATH}.spec.hostNetwork",
        lambda p: spec(p).update(hostNetwork=True),
        lambda p: spec(p).update(hostNetwork=False),
    ),
    (
        "Host Namespaces",
        f"{PATH}.spec.hostPID",
        lambda p: spec(p).update(hostPID=True),
        lambda p: spec(p).update(hostPID=False),
    ),
    (
        "Host Namespaces",
        f"{PATH}.spec.hostIPC",
        lambda p: spec(p).update(hostIPC=True),
        lambda p: spec(p).update(hostIPC=False),
    ),
    (
        "Privileged Containers",
        f"{SC0}.privileged",
        lambda p: ctx(p).update(privileged=True),
        lambda p: ctx(p).update(privileged=False),
    ),
    (
        "Capabilities",
        f"{SC0}.capabilities.add[1]",
        lambda p: ctx(p).update(capabilities={"add": ["CHOWN", "SYS_ADMIN"]}),
        lambda p: ctx(p).update(capabilities={"add": ["CHOWN", "NET_BIND_SERVICE"]}),
    ),
    (
        "HostPath Volumes",
        f"{PATH}.spec.volumes[0].hostPath",
        lambda p: spec(p).update(volumes=[{"name": "h", "hostPath": {"path": "/"}}]),
        lambda p: spec(p).update(volumes=[{"name": "h", "emptyDir": {}}]),
    ),
    (
        "Host Ports",
        f"{C0}.ports[0].hostPort",
        lambda p: spec(p)["containers"][0].update(ports=[{"containerPort": 80, "hostPort": 80}]),
        lambda p: spec(p)["containers"][0].update(ports=[{"containerPort": 80}]),
    ),
    (
        "AppArmor",
        f"{SC0}.appArmorProfile.type",
        lambda p: ctx(p).update(appArmorProfile={"type": "Unconfined"}),
        lambda p: ctx(p).update(appArmorProfile={"type": "RuntimeDefault"}),
    ),
    (
        "AppArmor",
        f"{PATH}.metadata.annotations[container.apparmor.security.beta.kubernetes.io/main]",
        lambda p: p.update(
            metadata={
                "annotations": {"container.apparmor.security.beta.kubernetes.io/main": "unconfined"}
            }
        ),
        lambda p: p.update(
            metadata={
                "annotations": {
                    "container.apparmor.security.beta.kubernetes.io/main": "localhost/x"
                }
            }
        ),
    ),
    (
        "SELinux",
        f"{SC0}.seLinuxOptions.type",
        lambda p: ctx(p).update(seLinuxOptions={"type": "spc_t"}),
        lambda p: ctx(p).update(seLinuxOptions={"type": "container_t", "level": "s0:c1"}),
    ),
    (
        "SELinux",
        f"{PSC}.seLinuxOptions.user",
        lambda p: psc(p).update(seLinuxOptions={"user": "root"}),
        lambda p: psc(p).update(seLinuxOptions={"user": ""}),
    ),
    (
        "/proc Mount Type",
        f"{SC0}.procMount",
        lambda p: ctx(p).update(procMount="Unmasked"),
        lambda p: ctx(p).update(procMount="Default"),
    ),
    (
        "Seccomp",
        f"{PSC}.seccompProfile.type",
        lambda p: psc(p).update(seccompProfile={"type": "Unconfined"}),
        lambda p: psc(p).update(seccompProfile={"type": "Localhost", "localhostProfile": "x"}),
    ),
    (
        "Sysctls",
        f"{PSC}.sysctls[0].name",
        lambda p: psc(p).update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
        lambda p: psc(p).update(sysctls=[{"name": "net.ipv4.tcp_syncookies", "value": "1"}]),
    ),
    (
        "Host Probes / Lifecycle Hooks",
        f"{C0}.livenessProbe.httpGet.host",
        lambda p: spec(p)["containers"][0].update(
            livenessProbe={"httpGet": {"port": 80, "host": "10.0.0.1"}}
        ),
        lambda p: spec(p)["containers"][0].update(livenessProbe={"httpGet": {"port": 80}}),
    ),
    (
        "Host Probes / Lifecycle Hooks",
        f"{C0}.lifecycle.preStop.tcpSocket.host",
        lambda p: spec(p)["containers"][0].update(
            lifecycle={"preStop": {"tcpSocket": {"port": 80, "host": "metadata"}}}
        ),
        lambda p: spec(p)["containers"][0].update(
            lifecycle={"preStop": {"tcpSocket": {"port": 80, "host": ""}}}
        ),
    ),
]

RESTRICTED: list[tuple[str, str, Edit, Edit]] = [
    (
        "Volume Types",
        f"{PATH}.spec.volumes[0].nfs",
        lambda p: spec(p).update(volumes=[{"name": "d", "nfs": {"server": "x", "path": "/"}}]),
        lambda p: spec(p).update(
            volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "c"}}]
        ),
    ),
    (
        "Privilege Escalation",
        f"{SC0}.allowPrivilegeEscalation",
        lambda p: ctx(p).pop("allowPrivilegeEscalation"),
        lambda p: None,
    ),
    (
        "Running as Non-root",
        f"{SC0}.runAsNonRoot",
        lambda p: psc(p).pop("runAsNonRoot"),
        lambda p: ctx(p).update(runAsNonRoot=True),
    ),
    (
        "Running as Non-root",
        f"{SC0}.runAsNonRoot",
        lambda p: ctx(p).update(runAsNonRoot=False),
        lambda p: ctx(p).pop("runAsNonRoot"),
    ),
    (
        "Running as Non-root user",
        f"{SC0}.runAsUser",
        lambda p: ctx(p).update(runAsUser=0),
        lambda p: ctx(p).update(runAsUser=1000),
    ),
    (
        "Seccomp",
        f"{SC0}.seccompProfile.type",
        lambda p: psc(p).pop("seccompProfile"),
        lambda p: ctx(p).update(seccompProfile={"type": "RuntimeDefault"}),
    ),
    (
        "Capabilities",
        f"{SC0}.capabilities.drop",
        lambda p: ctx(p).update(capabilities={"drop": ["NET_RAW"]}),
        lambda p: ctx(p).update(capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}),
    ),
    (
        "Capabilities",
        f"{SC0}.capabilities.add[0]",
        lambda p: ctx(p).update(capabilities={"drop": ["ALL"], "add": ["CHOWN"]}),
        lambda p: ctx(p).update(capabilities={"drop": ["ALL"]}),
    ),
]


def fields(template: dict[str, Any], level: Level) -> list[str]:
    return [v.field for v in check_pod_template(template, PATH, level)]


@pytest.mark.parametrize("level", ["baseline", "restricted"])
@pytest.mark.parametrize(
    ("check", "field", "breaks", "fixes"), BASELINE, ids=[f"{c}:{f}" for c, f, _, _ in BASELINE]
)
def test_each_baseline_rule_refuses_its_field_and_passes_the_allowed_value(
    level: Level, check: str, field: str, breaks: Edit, fixes: Edit
) -> None:
    """Baseline rules hold at restricted too (levels are cumulative)."""
    base = restricted_pod() if level == "restricted" else baseline_pod()
    bad = copy.deepcopy(base)
    breaks(bad)
    found = check_pod_template(bad, PATH, level)
    assert field in [v.field for v in found]
    assert next(v for v in found if v.field == field).check == check
    good = copy.deepcopy(base)
    fixes(good)
    assert [v.field for v in check_pod_template(good, PATH, level) if v.level == "baseline"] == []
    assert fields(bad, "privileged") == []


@pytest.mark.parametrize(
    ("check", "field", "breaks", "fixes"), RESTRICTED, ids=[f"{c}:{f}" for c, f, _, _ in RESTRICTED]
)
def test_each_restricted_rule_refuses_its_field_and_passes_the_allowed_value(
    check: str, field: str, breaks: Edit, fixes: Edit
) -> None:
    bad = restricted_pod()
    breaks(bad)
    found = check_pod_template(bad, PATH, "restricted")
    assert field in [v.field for v in found]
    violation = next(v for v in found if v.field == field)
    assert (violation.check, violation.level) == (check, "restricted")
    good = restricted_pod()
    breaks(good)
    fixes(good)
    if check == "Privilege Escalation":
        ctx(good)["allowPrivilegeEscalation"] = False
    if check == "Running as Non-root" and "runAsNonRoot" not in psc(good):
        ctx(good)["runAsNonRoot"] = True
    assert fields(good, "restricted") == []
    assert fields(bad, "baseline") == [], "restricted-only rules do not apply at baseline"


def test_the_default_pod_passes_baseline_and_fails_restricted_on_every_hardening_rule() -> None:
    assert fields(baseline_pod(), "baseline") == []
    assert set(fields(baseline_pod(), "restricted")) == {
        f"{SC0}.allowPrivilegeEscalation",
        f"{SC0}.runAsNonRoot",
        f"{SC0}.seccompProfile.type",
        f"{SC0}.capabilities.drop",
    }
    assert fields(restricted_pod(), "restricted") == []


def test_init_and_ephemeral_containers_are_checked_with_their_own_paths() -> None:
    pod = baseline_pod()
    spec(pod)["initContainers"] = [{"name": "init", "securityContext": {"privileged": True}}]
    spec(pod)["ephemeralContainers"] = [{"name": "dbg", "securityContext": {"privileged": True}}]
    assert fields(pod, "baseline") == [
        f"{PATH}.spec.initContainers[0].securityContext.privileged",
        f"{PATH}.spec.ephemeralContainers[0].securityContext.privileged",
    ]


def test_a_wrongly_typed_value_counts_as_set() -> None:
    """``privileged: "true"`` is no loophole: only false or absent pass."""
    pod = baseline_pod()
    ctx(pod)["privileged"] = "true"
    spec(pod)["hostNetwork"] = 1
    assert fields(pod, "baseline") == [f"{PATH}.spec.hostNetwork", f"{SC0}.privileged"]


def test_windows_pods_are_exempt_from_the_linux_only_restricted_rules() -> None:
    pod = restricted_pod()
    spec(pod)["os"] = {"name": "windows"}
    del psc(pod)["seccompProfile"]
    ctx(pod).clear()
    assert fields(pod, "restricted") == []


@pytest.mark.parametrize(
    ("value", "level"),
    [
        (None, "baseline"),
        ("privileged", "privileged"),
        ("restricted", "restricted"),
        ("lax", "restricted"),
    ],
)
def test_the_enforce_label_value_names_the_level_and_an_invalid_one_means_restricted(
    value: str | None, level: Level
) -> None:
    assert parse_level(value, "baseline") == level
