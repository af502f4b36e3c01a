"""Where Kubernetes credentials come from: kubectl's kubeconfig resolution, as one pure rule.

Every ``gpufed`` command that talks to an API server resolves its credentials here (through
``cli/kube.py``), and so do the hub (``hub/adapters/kube.py``) and the agent (``member-agent/kube.py``)
processes, so all of them agree with kubectl on which file and context they use:

1. ``--kubeconfig FILE`` (it must exist);
2. ``$KUBECONFIG``, a list separated by ``os.pathsep`` (``:``): with ``--context``, the first
   file that defines that context; without, the first file that sets ``current-context``
   (kubectl's merge: the first file to set a value wins); files that do not exist are skipped;
3. ``~/.kube/config`` when it exists;
4. in a pod (``KUBERNETES_SERVICE_HOST`` set): the in-cluster service account.

Unlike kubectl, files of ``$KUBECONFIG`` are not merged: the context's cluster and user must be
in the file that defines it. Only reads files (at most :data:`MAX_KUBECONFIG_BYTES` each); no
Kubernetes client is imported here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufed.api.errors import PermanentError

__all__ = [
    "IN_CLUSTER_NAMESPACE_FILE",
    "MAX_KUBECONFIG_BYTES",
    "KubeSource",
    "KubeconfigError",
    "resolve_kubeconfig",
]

#: A kubeconfig larger than this is refused before it is parsed (bounded input).
MAX_KUBECONFIG_BYTES = 16 * 1024 * 1024
#: The namespace of a pod's service account.
IN_CLUSTER_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

_FIX = (
    "pass --kubeconfig FILE (and --context NAME), set KUBECONFIG, or create ~/.kube/config; "
    "a local sandbox: `gpufed local up` prints its kubeconfig"
)


class KubeconfigError(PermanentError, ValueError):
    """No usable kubeconfig: the message names the file or variable and the fix."""


@dataclass(frozen=True)
class KubeSource:
    """The resolved credentials.

    ``path``: the kubeconfig file, None for the in-cluster service account; ``context``: the
    context to use (None: the file's ``current-context``); ``namespace``: the context's
    namespace (or the pod's), ``default`` when it names none; ``origin``: where it came from
    (``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``, ``in-cluster``), for messages.
    """

    path: Path | None
    context: str | None
    namespace: str
    origin: str

    @property
    def in_cluster(self) -> bool:
        return self.path is None

    def describe(self) -> str:
        """``kubeconfig /x (from $KUBECONFIG), context hub`` / ``in-cluster service account``."""
        if self.path is None:
            return "in-cluster service account"
        ctx = f", context {self.context}" if self.context else ""
        return f"kubeconfig {self.path} (from {self.origin}){ctx}"


def resolve_kubeconfig(
    kubeconfig: Path | str | None = None,
    context: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> KubeSource:
    """Resolve credentials as kubectl does (see the module docstring for the order).

    ``environ`` / ``home``: for tests (default ``os.environ`` and ``Path.home()``). Raises
    :class:`KubeconfigError` naming the file and the fix: ``--kubeconfig`` missing, a file that
    is not a kubeconfig, a ``--context`` no candidate file defines, or nothing to use at all.
    """
    env = os.environ if environ is None else environ
    if kubeconfig:
        path = Path(kubeconfig).expanduser()
        if not path.is_file():
            raise KubeconfigError(f"--kubeconfig {path}: no such file (fix: check the path)")
        return _from_file(path, context, "--kubeconfig")
    listed = env.get("KUBECONFIG", "")
    if listed:
        files = [Path(p).expanduser() for p in listed.split(os.pathsep) if p]
        existing = [p for p in files if p.is_file()]
        if not existing:
            raise KubeconfigError(
                f"$KUBECONFIG={listed}: none of its files exists (fix: point KUBECONFIG at a "
                "kubeconfig, or unset it to use ~/.kube/config)"
            )
        for path in existing:
            doc = _read(path)
            if context is not None and context in _contexts(doc):
                return _source(path, doc, context, "$KUBECONFIG")
            if context is None and doc.get("current-context"):
                return _source(path, doc, None, "$KUBECONFIG")
        if context is not None:
            raise KubeconfigError(
                f"context {context!r} is in none of $KUBECONFIG's files "
                f"({', '.join(map(str, existing))}) (fix: `kubectl config get-contexts`, or "
                "pass --kubeconfig FILE)"
            )
        return _from_file(existing[0], None, "$KUBECONFIG")
    default = (home if home is not None else Path.home()) / ".kube" / "config"
    if default.is_file():
        return _from_file(default, context, "~/.kube/config")
    if env.get("KUBERNETES_SERVICE_HOST"):
        if context is not None:
            raise KubeconfigError(
                f"--context {context}: in a pod without a kubeconfig there are no contexts "
                "(fix: drop --context, or pass --kubeconfig FILE)"
            )
        return KubeSource(None, None, _pod_namespace(), "in-cluster")
    raise KubeconfigError(
        "no kubeconfig: --kubeconfig not given, $KUBECONFIG unset, ~/.kube/config missing, and "
        f"not running in a pod (fix: {_FIX})"
    )


def _from_file(path: Path, context: str | None, origin: str) -> KubeSource:
    doc = _read(path)
    contexts = _contexts(doc)
    if context is not None and context not in contexts:
        have = ", ".join(contexts) or "none"
        raise KubeconfigError(
            f"context {context!r} is not in {path} (it has: {have}) (fix: pass one of them to "
            "--context, or `kubectl config get-contexts`)"
        )
    if context is None and not doc.get("current-context"):
        raise KubeconfigError(
            f"{path} sets no current-context (fix: pass --context NAME, or "
            "`kubectl config use-context NAME`)"
        )
    return _source(path, doc, context, origin)


def _source(path: Path, doc: dict[str, Any], context: str | None, origin: str) -> KubeSource:
    name = context or str(doc.get("current-context"))
    ctx = _contexts(doc).get(name) or {}
    namespace = ctx.get("namespace") if isinstance(ctx, dict) else None
    return KubeSource(path, context, str(namespace or "default"), origin)


def _read(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
        if size > MAX_KUBECONFIG_BYTES:
            raise KubeconfigError(
                f"{path}: {size} bytes, larger than a kubeconfig can be "
                f"({MAX_KUBECONFIG_BYTES}) (fix: check the path)"
            )
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise KubeconfigError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise KubeconfigError(
            f"{path}: not YAML{line} (fix: check the file, e.g. `kubectl config view "
            f"--kubeconfig {path}`)"
        ) from exc
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise KubeconfigError(
            f"{path}: not a kubeconfig (a mapping with contexts, clusters, users)"
        )
    return doc


def _contexts(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for entry in doc.get("contexts") or []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            out[entry["name"]] = entry.get("context") or {}
    return out


def _pod_namespace() -> str:
    try:
        return IN_CLUSTER_NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"
