"""One pinned Go tool in its own cache directory: the build recipe, stamp, lock and lookup
that :mod:`gpufed.sandbox.helm` and :mod:`gpufed.sandbox.kueue` share.

A wrapper Go module ``sandbox/gobuild/<name>/`` pins the release (a ``tool`` line and its
go.sum). :meth:`PinnedTool.build` compiles the tool into a cache directory named after the pin
and the Go version, apart from the control-plane binaries, so that a pin change never rebuilds
(nor invalidates) them::

    ~/.cache/gpufed/bin/<name>-<version>_<go>/
        <name>
        stamp.json            # go.mod/go.sum hash and pins of the build
        .lock                 # one build at a time

``$<env>`` (e.g. ``GPUFED_HELM``) points at a prebuilt binary instead (checked, never built).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufed.sandbox.binaries import (
    GOBUILD_DIR,
    BinariesError,
    build_lock,
    cache_root,
    go_binary,
    go_env,
    go_version,
    read_stamp,
    run_go_build,
)

Progress = Callable[[str], None]


def check_build_info(path: Path, module: str, version: str, *, what: str, env: str) -> None:
    """Check that ``path`` is an executable whose Go build info (which ``go build`` embeds as
    plain text) names ``module`` at ``version``: how managers without ``--version`` (Kueue, the
    workload operators) are checked. Raises :class:`BinariesError` naming the file, ``what`` it
    should be and the fix (rebuild, or unset ``env``)."""
    needle = f"{module}\t{version}\t".encode()
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            found = mm.find(needle) >= 0
    except (OSError, ValueError) as exc:
        raise BinariesError(f"{path} cannot be read: {exc}") from None
    if not found or not os.access(path, os.X_OK):
        raise BinariesError(
            f"{path} is not a {what} built from {module} {version} (its Go build info does not "
            f"name that module version, or it is not executable); delete it and run `gpufed "
            f"local build`, or unset {env}"
        )


@dataclass(frozen=True)
class PinnedTool:
    """What differs between pinned tools.

    ``name``: the binary and the wrapper directory; ``module`` / ``package``: what the go.mod
    requires and what is built; ``ldflags(version)``: the linker flags; ``check(path,
    version)``: returns a one-line description or raises :class:`BinariesError`; ``env``: the
    variable naming a prebuilt binary; ``cold``: the cold build time said in progress lines.
    """

    name: str
    module: str
    package: str
    ldflags: Callable[[str], str]
    check: Callable[[Path, str], str]
    env: str
    cold: str

    def recipe(self, gobuild: Path = GOBUILD_DIR) -> Path:
        """The wrapper module directory (``sandbox/gobuild/<name>``)."""
        return gobuild / self.name

    def version(self, gobuild: Path = GOBUILD_DIR) -> str:
        """The release pinned by the wrapper go.mod; :class:`BinariesError` when the go.mod
        does not require the module."""
        gomod = self.recipe(gobuild) / "go.mod"
        for line in gomod.read_text().splitlines():
            parts = line.split()
            if parts[:1] == ["require"]:
                parts = parts[1:]
            if len(parts) >= 2 and parts[0] == self.module and parts[1].startswith("v"):
                return parts[1]
        raise BinariesError(
            f"{gomod} does not require {self.module}; regenerate it with "
            f"`go get -tool {self.package}@<version> && go mod tidy` in {gomod.parent}"
        )

    def recipe_hash(self, gobuild: Path = GOBUILD_DIR) -> str:
        """sha256 over the wrapper's go.mod and go.sum: changes when the pin changes."""
        h = hashlib.sha256()
        for fname in ("go.mod", "go.sum"):
            f = self.recipe(gobuild) / fname
            h.update(f"{self.name}/{fname}\0".encode())
            h.update(f.read_bytes() if f.exists() else b"")
        return h.hexdigest()

    def dirname(self, version: str, go: str) -> str:
        """Cache directory name, e.g. ``helm-v4.3.2_go1.26.8``."""
        return f"{self.name}-{version}_{go}"

    def is_current(self, target: Path, recipe: str) -> bool:
        """``target`` holds a build of ``recipe`` (its stamp says so and the binary is there)."""
        return read_stamp(target).get("recipe_sha256") == recipe and os.access(
            target / self.name, os.X_OK
        )

    def build(
        self, *, force: bool = False, progress: Progress | None = None, gobuild: Path = GOBUILD_DIR
    ) -> Path:
        """Build the pinned tool into ``cache_root()/bin/<name>-<ver>_<go>/<name>``; skip when
        current (``force`` rebuilds anyway). Prints one progress line; returns the binary's
        path. Raises :class:`BinariesError` when Go is missing, the build or its check fails
        (naming the log with the compiler output)."""
        say = progress or (lambda _m: None)
        go = go_binary()
        version = self.version(gobuild)
        goversion = go_version(go)
        target = cache_root() / "bin" / self.dirname(version, goversion)
        recipe = self.recipe_hash(gobuild)
        binary = target / self.name
        with build_lock(target):
            if not force and self.is_current(target, recipe):
                say(f"  {self.name:<24} present  {self.check(binary, version)}")
                return binary
            (target / "stamp.json").unlink(missing_ok=True)
            say(f"building {self.name} {version} into {target} (cold: {self.cold})")
            started = time.monotonic()
            with tempfile.TemporaryDirectory(dir=target, prefix=".build-") as tmp:
                out = Path(tmp) / self.name
                argv = [go, "build", "-trimpath", "-ldflags", self.ldflags(version)]
                argv += ["-o", str(out), self.package]
                run_go_build(argv, self.recipe(gobuild), target / "build.log", self.name)
                reported = self.check(out, version)
                os.replace(out, binary)
            took = time.monotonic() - started
            stamp = {
                "recipe_sha256": recipe,
                "pins": {self.name: version, "go": goversion},
                "binaries": [self.name],
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            (target / "stamp.json").write_text(json.dumps(stamp, indent=2) + "\n")
            size = binary.stat().st_size / 1e6
            say(f"  {self.name:<24} built    {reported}  ({size:.0f} MB, {took:.0f}s)")
            return binary

    def find(self, gobuild: Path = GOBUILD_DIR) -> Path | None:
        """A cached build of the current recipe, whatever Go built it (no Go needed), or None."""
        root = cache_root() / "bin"
        prefix = f"{self.name}-{self.version(gobuild)}_go"
        recipe = self.recipe_hash(gobuild)
        candidates = sorted(root.glob(f"{prefix}*"), reverse=True) if root.is_dir() else []
        for d in candidates:
            if self.is_current(d, recipe):
                return d / self.name
        return None

    def ensure(self, *, build_if_missing: bool = True, progress: Progress | None = None) -> Path:
        """Path of the pinned tool: ``$<env>`` (checked), else a current cached build, else
        :meth:`build` unless ``build_if_missing`` is false. Raises :class:`BinariesError`
        saying what is missing and how to get it."""
        if env := os.environ.get(self.env):
            path = Path(env).expanduser()
            self.check(path, self.version())
            return path
        if found := self.find():
            return found
        if not build_if_missing:
            raise BinariesError(
                f"{self.name} {self.version()} is not built yet (looked in "
                f"{cache_root() / 'bin'}); run `gpufed local build`"
            )
        return self.build(progress=progress)

    def module_dir(self, gobuild: Path = GOBUILD_DIR) -> Path:
        """The pinned module's directory in the Go module cache (read-only files: CRDs,
        webhook manifests), downloading it (checked against the committed go.sum) when it is
        not there yet. Needs Go; :class:`BinariesError` when the download fails or Go is
        missing."""
        version = self.version(gobuild)
        proc = subprocess.run(
            [go_binary(), "mod", "download", "-json", f"{self.module}@{version}"],
            cwd=self.recipe(gobuild),
            env=go_env(),
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            info = json.loads(proc.stdout) if proc.stdout.strip() else {}
        except ValueError:
            info = {}
        directory = info.get("Dir") if isinstance(info, dict) else None
        if proc.returncode != 0 or not directory:
            detail = (info.get("Error") if isinstance(info, dict) else None) or proc.stderr.strip()
            raise BinariesError(
                f"cannot find {self.module}@{version} in the Go module cache: `go mod download` "
                f"failed ({detail or 'no output'}); check the network or GOPROXY, then run "
                "`gpufed local build`"
            )
        return Path(directory)
