"""Pod Security Standards: the checks of the ``privileged``, ``baseline`` and ``restricted``
levels over one pod template, as Kubernetes' Pod Security Admission evaluates a Pod.

Called by the hub's intake (:mod:`gpufed.hub.rules.admission`) for every pod template of a GPUJob
before placement, and shared with the agent (which labels the member namespaces it creates
with the same level, so the member's own Pod Security Admission enforces it again). Pure
functions over plain dicts (the JSON form of a pod template); no I/O.

The rules are those of https://kubernetes.io/docs/concepts/security/pod-security-standards/
at the latest policy version (the upstream ``k8s.io/pod-security-admission`` ``policy``
checks are the reference; this is our own implementation). Levels are cumulative: restricted
runs every baseline check and its own. "Containers" means ``containers``, ``initContainers``
and ``ephemeralContainers``. A value of the wrong type counts as set (the member would refuse
it anyway), so a malformed field never slips through as "absent".

Baseline: HostProcess, host namespaces, privileged, capabilities (add only the default set),
hostPath volumes, host ports, AppArmor, SELinux, ``/proc`` mount type, seccomp (not
``Unconfined``), sysctls (the safe set), the ``host`` field of probes and lifecycle hooks.
Restricted: volume types, privilege escalation, running as non-root, non-root user (UID 0),
seccomp (``RuntimeDefault`` or ``Localhost`` required), capabilities (drop ``ALL``, add only
``NET_BIND_SERVICE``). As upstream, a pod with ``spec.os.name: windows`` is exempt from the
restricted seccomp, capabilities and privilege-escalation checks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpufed.api.work import PodSecurityLevel

#: A level's name (the one definition is the protocol's, :data:`gpufed.api.work.PodSecurityLevel`).
Level = PodSecurityLevel

#: The levels from loosest to strictest.
LEVELS: Final[tuple[Level, ...]] = ("privileged", "baseline", "restricted")

#: Capabilities a baseline container may add (the container runtimes' default set).
BASELINE_CAPABILITIES: Final = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
#: Sysctls a baseline pod may set (namespaced and isolated from other pods).
SAFE_SYSCTLS: Final = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
#: SELinux types a baseline pod may use ("" too).
SELINUX_TYPES: Final = frozenset(
    {"container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
#: Volume sources a restricted pod may use.
RESTRICTED_VOLUMES: Final = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
_APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
_EMPTY: Mapping[str, Any] = {}
_HOOKS = ("postStart", "preStop")


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: ``field`` is the path in the GPUJob
    (``spec.template.spec.template.spec.containers[0].securityContext.privileged``), ``check``
    the standard's control name (``Privileged Containers``), ``message`` what is wrong and what
    is allowed, ``level`` the level whose rule it is."""

    field: str
    check: str
    message: str
    level: Level


def parse_level(value: str | None, default: Level) -> Level:
    """The level a ``pod-security.kubernetes.io/enforce`` label value names.

    None (no label) gives ``default``; a value that is not a level gives ``restricted``, as
    Pod Security Admission evaluates a namespace with an invalid level label.
    """
    if value is None:
        return default
    for level in LEVELS:
        if value == level:
            return level
    return "restricted"


def check_pod_template(template: Mapping[str, Any], path: str, level: Level) -> list[Violation]:
    """Every rule of ``level`` that the pod template at ``path`` breaks (empty: it passes).

    ``template``: a pod template (``metadata`` + ``spec``) as JSON; ``path``: its field path
    in the GPUJob (``spec.template.spec.template``). Violations come in the order of the
    standard's table, containers in list order.
    """
    if level == "privileged":
        return []
    pod = _PodView(template, path)
    out = list(_baseline(pod))
    if level == "restricted":
        out.extend(_restricted(pod))
    return out


# --- the pod as the checks see it ----------------------------------------------------------------


class _PodView:
    """The parts of a pod template the checks read, with their field paths."""

    def __init__(self, template: Mapping[str, Any], path: str) -> None:
        self.meta = _m(template.get("metadata"))
        self.meta_path = f"{path}.metadata"
        self.spec = _m(template.get("spec"))
        self.spec_path = f"{path}.spec"
        self.sc = _m(self.spec.get("securityContext"))
        self.sc_path = f"{self.spec_path}.securityContext"
        self.windows = _m(self.spec.get("os")).get("name") == "windows"
        self.containers: list[tuple[str, Mapping[str, Any]]] = []
        for key in _CONTAINER_LISTS:
            for i, c in enumerate(_l(self.spec.get(key))):
                self.containers.append((f"{self.spec_path}.{key}[{i}]", _m(c)))
        #: (path of ``securityContext``, the context) of every container, computed once: every
        #: control walks them
        self.contexts = [
            (f"{cpath}.securityContext", _m(c.get("securityContext")))
            for cpath, c in self.containers
        ]

    def container_contexts(self) -> list[tuple[str, Mapping[str, Any]]]:
        """(path of ``securityContext``, the context) of every container."""
        return self.contexts


def _m(value: Any) -> Mapping[str, Any]:
    # ``type is dict`` first: decoded JSON is always a dict, and the ABC check costs 10 times more.
    return value if type(value) is dict or isinstance(value, Mapping) else _EMPTY


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _set(value: Any) -> bool:
    """A boolean field that is set to anything but false/absent."""
    return value is not None and value is not False


# --- baseline ------------------------------------------------------------------------------------


def _baseline(pod: _PodView) -> Iterator[Violation]:
    def v(field: str, check: str, message: str) -> Violation:
        return Violation(field, check, message, "baseline")

    # HostProcess
    if _set(_m(pod.sc.get("windowsOptions")).get("hostProcess")):
        yield v(
            f"{pod.sc_path}.windowsOptions.hostProcess", "HostProcess", "must be unset or false"
        )
    for sc_path, sc in pod.container_contexts():
        if _set(_m(sc.get("windowsOptions")).get("hostProcess")):
            yield v(
                f"{sc_path}.windowsOptions.hostProcess", "HostProcess", "must be unset or false"
            )
    # Host Namespaces
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if _set(pod.spec.get(key)):
            yield v(f"{pod.spec_path}.{key}", "Host Namespaces", "must be unset or false")
    # Privileged Containers
    for sc_path, sc in pod.container_contexts():
        if _set(sc.get("privileged")):
            yield v(f"{sc_path}.privileged", "Privileged Containers", "must be unset or false")
    # Capabilities
    for sc_path, sc in pod.container_contexts():
        for i, cap in enumerate(_l(_m(sc.get("capabilities")).get("add"))):
            if cap not in BASELINE_CAPABILITIES:
                yield v(
                    f"{sc_path}.capabilities.add[{i}]",
                    "Capabilities",
                    f"{cap!r} may not be added; allowed: {', '.join(sorted(BASELINE_CAPABILITIES))}",
                )
    # HostPath Volumes
    for i, vol in enumerate(_l(pod.spec.get("volumes"))):
        if _m(vol).get("hostPath") is not None:
            yield v(
                f"{pod.spec_path}.volumes[{i}].hostPath",
                "HostPath Volumes",
                "hostPath volumes are not allowed",
            )
    # Host Ports
    for cpath, c in pod.containers:
        for i, port in enumerate(_l(c.get("ports"))):
            host_port = _m(port).get("hostPort")
            if host_port not in (None, 0):
                yield v(f"{cpath}.ports[{i}].hostPort", "Host Ports", "must be unset or 0")
    yield from _apparmor(pod, v)
    yield from _selinux(pod, v)
    # /proc Mount Type
    for sc_path, sc in pod.container_contexts():
        if sc.get("procMount") not in (None, "Default"):
            yield v(f"{sc_path}.procMount", "/proc Mount Type", "must be unset or Default")
    # Seccomp
    for sc_path, sc in [(pod.sc_path, pod.sc), *pod.container_contexts()]:
        if _m(sc.get("seccompProfile")).get("type") == "Unconfined":
            yield v(
                f"{sc_path}.seccompProfile.type",
                "Seccomp",
                "Unconfined is not allowed (use RuntimeDefault or Localhost, or leave it unset)",
            )
    # Sysctls
    for i, sysctl in enumerate(_l(pod.sc.get("sysctls"))):
        name = _m(sysctl).get("name")
        if name not in SAFE_SYSCTLS:
            yield v(
                f"{pod.sc_path}.sysctls[{i}].name",
                "Sysctls",
                f"{name!r} is not a safe sysctl; allowed: {', '.join(sorted(SAFE_SYSCTLS))}",
            )
    # Host Probes / Lifecycle Hooks
    for cpath, c in pod.containers:
        handlers = [(f"{cpath}.{p}", _m(c.get(p))) for p in _PROBES]
        lifecycle = _m(c.get("lifecycle"))
        handlers += [(f"{cpath}.lifecycle.{h}", _m(lifecycle.get(h))) for h in _HOOKS]
        for hpath, handler in handlers:
            for action in ("httpGet", "tcpSocket"):
                if _m(handler.get(action)).get("host") not in (None, ""):
                    yield v(
                        f"{hpath}.{action}.host",
                        "Host Probes / Lifecycle Hooks",
                        "must be unset or empty (a probe may not reach other hosts)",
                    )


def _apparmor(pod: _PodView, v: Any) -> Iterator[Violation]:
    for sc_path, sc in [(pod.sc_path, pod.sc), *pod.container_contexts()]:
        kind = _m(sc.get("appArmorProfile")).get("type")
        if kind not in (None, "RuntimeDefault", "Localhost"):
            yield v(
                f"{sc_path}.appArmorProfile.type",
                "AppArmor",
                "must be unset, RuntimeDefault or Localhost",
            )
    for key, value in _m(pod.meta.get("annotations")).items():
        if str(key).startswith(_APPARMOR_ANNOTATION) and not (
            value == "runtime/default"
            or (isinstance(value, str) and value.startswith("localhost/"))
        ):
            yield v(
                f"{pod.meta_path}.annotations[{key}]",
                "AppArmor",
                "must be runtime/default or localhost/<profile>",
            )


def _selinux(pod: _PodView, v: Any) -> Iterator[Violation]:
    for sc_path, sc in [(pod.sc_path, pod.sc), *pod.container_contexts()]:
        opts = _m(sc.get("seLinuxOptions"))
        if opts.get("type") not in (None, "", *SELINUX_TYPES):
            yield v(
                f"{sc_path}.seLinuxOptions.type",
                "SELinux",
                f"must be unset, empty or one of {', '.join(sorted(SELINUX_TYPES))}",
            )
        for key in ("user", "role"):
            if opts.get(key) not in (None, ""):
                yield v(f"{sc_path}.seLinuxOptions.{key}", "SELinux", "must be unset or empty")


# --- restricted ----------------------------------------------------------------------------------


def _restricted(pod: _PodView) -> Iterator[Violation]:
    def v(field: str, check: str, message: str) -> Violation:
        return Violation(field, check, message, "restricted")

    # Volume Types
    for i, vol in enumerate(_l(pod.spec.get("volumes"))):
        sources = [k for k in _m(vol) if k != "name"]
        for src in sources:
            if src not in RESTRICTED_VOLUMES:
                yield v(
                    f"{pod.spec_path}.volumes[{i}].{src}",
                    "Volume Types",
                    f"{src} volumes are not allowed; allowed: {', '.join(sorted(RESTRICTED_VOLUMES))}",
                )
    contexts = list(pod.container_contexts())
    # Privilege Escalation
    if not pod.windows:
        for sc_path, sc in contexts:
            if sc.get("allowPrivilegeEscalation") is not False:
                yield v(
                    f"{sc_path}.allowPrivilegeEscalation", "Privilege Escalation", "must be false"
                )
    # Running as Non-root: the pod says true (and no container says false), or every container
    # says true.
    pod_nonroot = pod.sc.get("runAsNonRoot")
    if pod_nonroot is not None and pod_nonroot is not True:
        yield v(f"{pod.sc_path}.runAsNonRoot", "Running as Non-root", "must be true")
    for sc_path, sc in contexts:
        own = sc.get("runAsNonRoot")
        if own is not None and own is not True:
            yield v(f"{sc_path}.runAsNonRoot", "Running as Non-root", "must be true")
        elif own is None and pod_nonroot is not True:
            yield v(
                f"{sc_path}.runAsNonRoot",
                "Running as Non-root",
                f"must be true here or in {pod.sc_path}.runAsNonRoot",
            )
    # Running as Non-root user
    for sc_path, sc in [(pod.sc_path, pod.sc), *contexts]:
        uid = sc.get("runAsUser")
        if uid is not None and (not isinstance(uid, int) or isinstance(uid, bool) or uid == 0):
            yield v(f"{sc_path}.runAsUser", "Running as Non-root user", "must not be 0")
    if pod.windows:
        return
    # Seccomp: set in the pod or in every container; every value set is RuntimeDefault/Localhost.
    allowed_seccomp = ("RuntimeDefault", "Localhost")
    pod_seccomp = _m(pod.sc.get("seccompProfile")).get("type")
    if pod_seccomp is not None and pod_seccomp not in allowed_seccomp:
        yield v(
            f"{pod.sc_path}.seccompProfile.type", "Seccomp", "must be RuntimeDefault or Localhost"
        )
    for sc_path, sc in contexts:
        own = _m(sc.get("seccompProfile")).get("type")
        if own is not None and own not in allowed_seccomp:
            yield v(
                f"{sc_path}.seccompProfile.type", "Seccomp", "must be RuntimeDefault or Localhost"
            )
        elif own is None and pod_seccomp is None:
            yield v(
                f"{sc_path}.seccompProfile.type",
                "Seccomp",
                f"must be RuntimeDefault or Localhost here or in {pod.sc_path}.seccompProfile",
            )
    # Capabilities
    for sc_path, sc in contexts:
        caps = _m(sc.get("capabilities"))
        if "ALL" not in _l(caps.get("drop")):
            yield v(f"{sc_path}.capabilities.drop", "Capabilities", "must include ALL")
        for i, cap in enumerate(_l(caps.get("add"))):
            if cap != "NET_BIND_SERVICE":
                yield v(
                    f"{sc_path}.capabilities.add[{i}]",
                    "Capabilities",
                    f"{cap!r} may not be added (only NET_BIND_SERVICE)",
                )
