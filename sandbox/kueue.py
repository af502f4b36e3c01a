"""The pinned Kueue manager binary and its module: built from the Go module proxy into its own
cache directory, the CRDs and webhook manifests read from the module at run time.

Kueue's MultiKueue is the peer gpufed is measured against (:mod:`gpufed.sandbox.multikueue`
runs it). The wrapper Go module ``sandbox/gobuild/kueue`` pins the release (``tool
sigs.k8s.io/kueue/cmd/kueue`` and its go.sum), the way :mod:`gpufed.sandbox.helm` pins helm. It
is built apart from the control planes, so that a Kueue pin change never rebuilds them::

    ~/.cache/gpufed/bin/kueue-v0.17.0_go1.26.8/
        kueue                 # the manager (upstream's cmd/kueue, "bin/manager" in its Makefile)
        stamp.json            # go.mod/go.sum hash and pins of the build
        .lock                 # one build at a time

``GPUFED_KUEUE`` points at a prebuilt manager instead (checked for the pinned module version in
its Go build info, never built). Kueue's YAML (CRDs under ``config/components/crd``, the webhook
manifests under ``config/components/webhook``) is not committed here: :func:`kueue_module_dir`
finds the module in ``go env GOMODCACHE`` (``go mod download`` puts it there; the build does).

Callers: ``gpufed local build`` (CLI, after helm), :mod:`gpufed.sandbox.multikueue`, the
MultiKueue smoke test (``tests/integration/test_multikueue.py``) through :func:`ensure_kueue`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpufed.sandbox.binaries import (
    GOBUILD_DIR,
)
from gpufed.sandbox.gotool import PinnedTool, check_build_info

KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_PACKAGE = f"{KUEUE_MODULE}/cmd/kueue"

Progress = Callable[[str], None]


def check_kueue(path: Path, version: str) -> str:
    """Check that ``path`` is a Kueue manager built from ``version``: its Go build info (which
    ``go build`` embeds as plain text) names the module at that version. The manager has no
    ``--version`` flag and starting it needs a cluster. Returns ``"kueue <version>"``; raises
    :class:`BinariesError` naming the file and the fix otherwise."""
    check_build_info(path, KUEUE_MODULE, version, what="Kueue manager", env="GPUFED_KUEUE")
    return f"kueue {version}"


KUEUE = PinnedTool(
    name="kueue",
    module=KUEUE_MODULE,
    package=KUEUE_PACKAGE,
    ldflags=lambda version: (
        f"-s -w -X {KUEUE_MODULE}/pkg/version.GitVersion={version} "
        f"-X {KUEUE_MODULE}/pkg/version.BuildDate=1970-01-01T00:00:00Z"
    ),
    check=check_kueue,
    env="GPUFED_KUEUE",
    cold="~9 CPU-minutes",
)


def kueue_recipe(gobuild: Path = GOBUILD_DIR) -> Path:
    """The wrapper module directory (``sandbox/gobuild/kueue``)."""
    return KUEUE.recipe(gobuild)


def kueue_version(gobuild: Path = GOBUILD_DIR) -> str:
    """The Kueue release pinned by the wrapper go.mod (``v0.17.0``); :class:`BinariesError`
    when the go.mod does not require Kueue."""
    return KUEUE.version(gobuild)


def kueue_recipe_hash(gobuild: Path = GOBUILD_DIR) -> str:
    """sha256 over the Kueue wrapper's go.mod and go.sum: changes when the pin changes."""
    return KUEUE.recipe_hash(gobuild)


def kueue_dirname(version: str, go: str) -> str:
    """Cache directory name, e.g. ``kueue-v0.17.0_go1.26.8``."""
    return KUEUE.dirname(version, go)


def build_kueue(
    *, force: bool = False, progress: Progress | None = None, gobuild: Path = GOBUILD_DIR
) -> Path:
    """Build the pinned Kueue manager into ``cache_root()/bin/kueue-<ver>_<go>/kueue``; skip
    when current (:meth:`PinnedTool.build`). Cold: about 9 CPU-minutes (see docs/sandbox.md
    for the wall time measured on a shared 2-core machine); with a warm Go build cache about
    30 s."""
    return KUEUE.build(force=force, progress=progress, gobuild=gobuild)


def find_kueue(gobuild: Path = GOBUILD_DIR) -> Path | None:
    """A cached Kueue of the current recipe, whatever Go built it (no Go needed), or None."""
    return KUEUE.find(gobuild)


def ensure_kueue(*, build_if_missing: bool = True, progress: Progress | None = None) -> Path:
    """Path of the pinned Kueue manager: ``$GPUFED_KUEUE`` (checked), else a current cached
    build, else :func:`build_kueue` unless ``build_if_missing`` is false. Raises
    :class:`BinariesError` saying what is missing and how to get it."""
    return KUEUE.ensure(build_if_missing=build_if_missing, progress=progress)


def kueue_module_dir(gobuild: Path = GOBUILD_DIR) -> Path:
    """The pinned Kueue module's directory in the Go module cache (read-only files, e.g.
    ``config/components/crd/bases/*.yaml``), downloading it (checked against the committed
    go.sum) when it is not there yet (:meth:`PinnedTool.module_dir`). Needs Go;
    :class:`BinariesError` when the download fails or Go is missing."""
    return KUEUE.module_dir(gobuild)


def kueue_crd_dir(gobuild: Path = GOBUILD_DIR) -> Path:
    """``config/components/crd`` of the pinned module: ``bases/`` (one CRD per file) and
    ``patches/`` (the conversion webhook stanzas)."""
    return kueue_module_dir(gobuild) / "config" / "components" / "crd"


def kueue_webhook_manifests(gobuild: Path = GOBUILD_DIR) -> Path:
    """``config/components/webhook/manifests.yaml`` of the pinned module (controller-gen's
    Mutating/ValidatingWebhookConfiguration with Service client configs)."""
    return kueue_module_dir(gobuild) / "config" / "components" / "webhook" / "manifests.yaml"
