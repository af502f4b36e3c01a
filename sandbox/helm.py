"""The pinned ``helm`` binary: built from the Go module proxy into its own cache directory.

The charts in ``charts/`` are linted and rendered by the tests with this helm. The wrapper Go
module ``sandbox/gobuild/helm`` pins the release (``tool helm.sh/helm/v4/cmd/helm`` and its
go.sum), the way :mod:`gpufed.sandbox.binaries` pins the control planes. It is built apart
from them, so that a helm pin change never invalidates (nor rebuilds) the control-plane
binaries, whose directory key covers only the etcd, k8s and kwok recipes::

    ~/.cache/gpufed/bin/helm-v4.3.2_go1.26.8/
        helm
        stamp.json            # go.mod/go.sum hash and pins of the build
        .lock                 # one build at a time

``GPUFED_HELM`` points at a prebuilt helm instead (checked with ``helm version``, never built).

Callers: ``gpufed local build`` (CLI, after the control-plane binaries), the chart tests
(``tests/integration/test_helm_charts.py``) through :func:`ensure_helm`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from gpufed.sandbox.binaries import GOBUILD_DIR, BinariesError
from gpufed.sandbox.gotool import PinnedTool

HELM_MODULE = "helm.sh/helm/v4"
HELM_PACKAGE = f"{HELM_MODULE}/cmd/helm"

Progress = Callable[[str], None]


def check_helm(path: Path, version: str) -> str:
    """Run ``helm version --short``; return its output, or raise :class:`BinariesError` when it
    does not report ``version``."""
    try:
        out = subprocess.run(
            [str(path), "version", "--short"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except OSError as exc:
        raise BinariesError(f"{path} does not run: {exc}") from None
    text = (out.stdout + out.stderr).strip()
    if not text.startswith(version):
        raise BinariesError(
            f"{path} reports {text.splitlines()[0] if text else '(nothing)'!r}, expected "
            f"{version!r}; delete it and run `gpufed local build`"
        )
    return text.splitlines()[0]


HELM = PinnedTool(
    name="helm",
    module=HELM_MODULE,
    package=HELM_PACKAGE,
    ldflags=lambda version: (
        f"-s -w -X {HELM_MODULE}/internal/version.version={version} "
        f"-X {HELM_MODULE}/internal/version.gitTreeState=clean"
    ),
    check=check_helm,
    env="GPUFED_HELM",
    cold="~7 CPU-minutes",
)


def helm_recipe(gobuild: Path = GOBUILD_DIR) -> Path:
    """The wrapper module directory (``sandbox/gobuild/helm``)."""
    return HELM.recipe(gobuild)


def helm_version(gobuild: Path = GOBUILD_DIR) -> str:
    """The helm release pinned by the wrapper go.mod (``v4.3.2``); :class:`BinariesError` when
    the go.mod does not require helm."""
    return HELM.version(gobuild)


def helm_recipe_hash(gobuild: Path = GOBUILD_DIR) -> str:
    """sha256 over the helm wrapper's go.mod and go.sum: changes when the pin changes."""
    return HELM.recipe_hash(gobuild)


def helm_dirname(version: str, go: str) -> str:
    """Cache directory name, e.g. ``helm-v4.3.2_go1.26.8``."""
    return HELM.dirname(version, go)


def build_helm(
    *, force: bool = False, progress: Progress | None = None, gobuild: Path = GOBUILD_DIR
) -> Path:
    """Build the pinned helm into ``cache_root()/bin/helm-<ver>_<go>/helm``; skip when current
    (:meth:`PinnedTool.build`). Cold: about 7 CPU-minutes (22 min wall measured on a shared
    2-core machine); with a warm Go build cache about 20 s."""
    return HELM.build(force=force, progress=progress, gobuild=gobuild)


def find_helm(gobuild: Path = GOBUILD_DIR) -> Path | None:
    """A cached helm of the current recipe, whatever Go built it (no Go needed), or None."""
    return HELM.find(gobuild)


def ensure_helm(*, build_if_missing: bool = True, progress: Progress | None = None) -> Path:
    """Path of the pinned helm: ``$GPUFED_HELM`` (checked), else a current cached build, else
    :func:`build_helm` unless ``build_if_missing`` is false. Raises :class:`BinariesError`
    saying what is missing and how to get it."""
    return HELM.ensure(build_if_missing=build_if_missing, progress=progress)
