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

import hashlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gpufed.sandbox.binaries import (
    GOBUILD_DIR,
    BinariesError,
    build_lock,
    cache_root,
    go_binary,
    go_version,
    read_stamp,
    run_go_build,
)

HELM_MODULE = "helm.sh/helm/v4"
HELM_PACKAGE = f"{HELM_MODULE}/cmd/helm"

Progress = Callable[[str], None]


def helm_recipe(gobuild: Path = GOBUILD_DIR) -> Path:
    """The wrapper module directory (``sandbox/gobuild/helm``)."""
    return gobuild / "helm"


def helm_version(gobuild: Path = GOBUILD_DIR) -> str:
    """The helm release pinned by the wrapper go.mod (``v4.3.2``); :class:`BinariesError` when
    the go.mod does not require helm."""
    gomod = helm_recipe(gobuild) / "go.mod"
    for line in gomod.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["require"]:
            parts = parts[1:]
        if len(parts) >= 2 and parts[0] == HELM_MODULE and parts[1].startswith("v"):
            return parts[1]
    raise BinariesError(
        f"{gomod} does not require {HELM_MODULE}; regenerate it with "
        f"`go get -tool {HELM_PACKAGE}@<version> && go mod tidy` in {gomod.parent}"
    )


def helm_recipe_hash(gobuild: Path = GOBUILD_DIR) -> str:
    """sha256 over the helm wrapper's go.mod and go.sum: changes when the pin changes."""
    h = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        f = helm_recipe(gobuild) / name
        h.update(f"helm/{name}\0".encode())
        h.update(f.read_bytes() if f.exists() else b"")
    return h.hexdigest()


def helm_dirname(version: str, go: str) -> str:
    """Cache directory name, e.g. ``helm-v4.3.2_go1.26.8``."""
    return f"helm-{version}_{go}"


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


def _is_current(target: Path, recipe: str) -> bool:
    return read_stamp(target).get("recipe_sha256") == recipe and os.access(target / "helm", os.X_OK)


def build_helm(
    *, force: bool = False, progress: Progress | None = None, gobuild: Path = GOBUILD_DIR
) -> Path:
    """Build the pinned helm into ``cache_root()/bin/helm-<ver>_<go>/helm``; skip when current.

    Current: ``stamp.json`` records the same go.mod/go.sum hash and the binary is there.
    ``force`` rebuilds anyway. Prints one progress line. Returns the binary's path. Raises
    :class:`BinariesError` when Go is missing, the build or its version check fails (naming
    the log with the compiler output). Cold: about 7 CPU-minutes (22 min wall measured on a
    shared 2-core machine); with a warm Go build cache about 20 s.
    """
    say = progress or (lambda _m: None)
    go = go_binary()
    version = helm_version(gobuild)
    goversion = go_version(go)
    target = cache_root() / "bin" / helm_dirname(version, goversion)
    recipe = helm_recipe_hash(gobuild)
    with build_lock(target):
        if not force and _is_current(target, recipe):
            say(f"  {'helm':<24} present  {check_helm(target / 'helm', version)}")
            return target / "helm"
        (target / "stamp.json").unlink(missing_ok=True)
        say(f"building helm {version} into {target} (cold: ~7 CPU-minutes)")
        log_path = target / "build.log"
        started = time.monotonic()
        ldflags = (
            f"-s -w -X {HELM_MODULE}/internal/version.version={version} "
            f"-X {HELM_MODULE}/internal/version.gitTreeState=clean"
        )
        with tempfile.TemporaryDirectory(dir=target, prefix=".build-") as tmp:
            out = Path(tmp) / "helm"
            argv = [go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(out), HELM_PACKAGE]
            run_go_build(argv, helm_recipe(gobuild), log_path, "helm")
            reported = check_helm(out, version)
            os.replace(out, target / "helm")
        took = time.monotonic() - started
        (target / "stamp.json").write_text(
            json.dumps(
                {
                    "recipe_sha256": recipe,
                    "pins": {"helm": version, "go": goversion},
                    "binaries": ["helm"],
                    "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                },
                indent=2,
            )
            + "\n"
        )
        size = (target / "helm").stat().st_size / 1e6
        say(f"  {'helm':<24} built    {reported}  ({size:.0f} MB, {took:.0f}s)")
        return target / "helm"


def find_helm(gobuild: Path = GOBUILD_DIR) -> Path | None:
    """A cached helm of the current recipe, whatever Go built it (no Go needed), or None."""
    root = cache_root() / "bin"
    prefix = f"helm-{helm_version(gobuild)}_go"
    recipe = helm_recipe_hash(gobuild)
    candidates = sorted(root.glob(f"{prefix}*"), reverse=True) if root.is_dir() else []
    for d in candidates:
        if _is_current(d, recipe):
            return d / "helm"
    return None


def ensure_helm(*, build_if_missing: bool = True, progress: Progress | None = None) -> Path:
    """Path of the pinned helm: ``$GPUFED_HELM`` (checked), else a current cached build, else
    :func:`build_helm` unless ``build_if_missing`` is false. Raises :class:`BinariesError`
    saying what is missing and how to get it."""
    if env := os.environ.get("GPUFED_HELM"):
        path = Path(env).expanduser()
        check_helm(path, helm_version())
        return path
    if found := find_helm():
        return found
    if not build_if_missing:
        raise BinariesError(
            f"helm {helm_version()} is not built yet (looked in {cache_root() / 'bin'}); run "
            "`gpufed local build`"
        )
    return build_helm(progress=progress)
