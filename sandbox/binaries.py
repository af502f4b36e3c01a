"""Control-plane binaries: build the pinned etcd, Kubernetes and kwok from the Go module proxy.

The wrapper Go modules in ``sandbox/gobuild/{k8s,etcd,kwok}`` are the project's build recipe
(``shared/notes/control-planes.md`` §A): ``k8s.io/kubernetes`` and ``go.etcd.io/etcd/server/v3``
cannot be ``go install``-ed because their go.mod files carry local ``replace`` directives, so a
wrapper module pins the release (and, for Kubernetes, maps every staging module to its published
version). :func:`build` compiles them into a cache directory named after the pins::

    ~/.cache/gpufed/bin/k8s-v1.36.3_etcd-v3.6.16_kwok-v0.8.0_go1.26.8/
        etcd kube-apiserver kube-controller-manager kube-scheduler kwok [kubectl]
        stamp.json            # go.mod/go.sum hashes and flags of the build

``GPUFED_CACHE_DIR`` replaces ``~/.cache/gpufed``; ``GPUFED_BIN_DIR`` points at a directory of
prebuilt binaries instead (checked with ``--version``, never built into).

Callers: ``gpufed local build`` (CLI), :func:`ensure_binaries` (the sandbox, the hub's embedded
etcd, test fixtures).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from gpufed.api.errors import GpufedError

log = structlog.get_logger("gpufed.sandbox.binaries")

#: Versions ``--regenerate`` writes into the wrapper go.mod files. What is built is read from
#: the go.mod files themselves (a unit test keeps the two in step).
K8S_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"

GOBUILD_DIR = Path(__file__).resolve().parent / "gobuild"

_K8S_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
CORE_BINARIES = ("etcd", *_K8S_COMMANDS, "kwok")
KUBECTL = "kubectl"

Progress = Callable[[str], None]


class BinariesError(GpufedError, RuntimeError):
    """The binaries cannot be built or found; the message names the missing tool or step and
    the fix."""


@dataclass(frozen=True)
class Pins:
    """Upstream versions built, read from the wrapper go.mod files, plus the Go version."""

    k8s: str
    etcd: str
    kwok: str
    go: str

    @property
    def dirname(self) -> str:
        """Cache directory name, e.g. ``k8s-v1.36.3_etcd-v3.6.16_kwok-v0.8.0_go1.26.8``."""
        return f"k8s-{self.k8s}_etcd-{self.etcd}_kwok-{self.kwok}_{self.go}"


@dataclass(frozen=True)
class BinDir:
    """A directory holding the control-plane binaries (paths only; see :func:`ensure_binaries`)."""

    path: Path

    def binary(self, name: str) -> Path:
        """Path of binary ``name`` (``etcd``, ``kube-apiserver``, ``kwok`` …), present or not."""
        return self.path / name

    @property
    def etcd(self) -> Path:
        return self.binary("etcd")

    @property
    def kube_apiserver(self) -> Path:
        return self.binary("kube-apiserver")

    @property
    def kube_controller_manager(self) -> Path:
        return self.binary("kube-controller-manager")

    @property
    def kube_scheduler(self) -> Path:
        return self.binary("kube-scheduler")

    @property
    def kwok(self) -> Path:
        return self.binary("kwok")

    @property
    def kubectl(self) -> Path:
        return self.binary(KUBECTL)

    def missing(self, names: Sequence[str] = CORE_BINARIES) -> list[str]:
        """Names of binaries that are absent or not executable."""
        return [n for n in names if not os.access(self.binary(n), os.X_OK)]


# --- pins and cache locations ------------------------------------------------------------------


def cache_root() -> Path:
    """``$GPUFED_CACHE_DIR`` or ``$XDG_CACHE_HOME/gpufed`` or ``~/.cache/gpufed``."""
    if env := os.environ.get("GPUFED_CACHE_DIR"):
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gpufed"


def _module_version(gomod: Path, module: str) -> str:
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", gomod.read_text(), re.M)
    if not m:
        raise BinariesError(
            f"{gomod} does not require {module}; regenerate it with "
            "`gpufed local build --regenerate`"
        )
    return m.group(1)


def recipe_versions(gobuild: Path = GOBUILD_DIR) -> tuple[str, str, str]:
    """(k8s, etcd, kwok) versions pinned by the wrapper go.mod files."""
    return (
        _module_version(gobuild / "k8s" / "go.mod", "k8s.io/kubernetes"),
        _module_version(gobuild / "etcd" / "go.mod", "go.etcd.io/etcd/server/v3"),
        _module_version(gobuild / "kwok" / "go.mod", "sigs.k8s.io/kwok"),
    )


def recipe_hash(gobuild: Path = GOBUILD_DIR) -> str:
    """sha256 over the wrapper go.mod and go.sum files: changes when any pin changes."""
    h = hashlib.sha256()
    for sub in ("etcd", "k8s", "kwok"):
        for name in ("go.mod", "go.sum"):
            f = gobuild / sub / name
            h.update(f"{sub}/{name}\0".encode())
            h.update(f.read_bytes() if f.exists() else b"")
    return h.hexdigest()


def go_binary() -> str:
    """Path of ``go``; :class:`BinariesError` naming Go and how to install it when absent."""
    go = shutil.which("go")
    if go is None:
        raise BinariesError(
            "Go is not installed: the `go` command is not on PATH. The sandbox builds etcd, "
            "kube-apiserver, kube-controller-manager, kube-scheduler and kwok from source with "
            "Go >= 1.26 (see sandbox/gobuild/*/go.mod). Install Go from https://go.dev/dl/ "
            "(or your package manager), or set GPUFED_BIN_DIR to a directory of prebuilt "
            "binaries, then re-run `gpufed local build`."
        )
    return go


def go_env() -> dict[str, str]:
    """The environment of every ``go`` run: the local toolchain only, no cgo, no GOFLAGS."""
    env = dict(os.environ)
    # GOTOOLCHAIN=local: a pin that needs a newer Go fails loudly instead of downloading one.
    env.update({"GOTOOLCHAIN": "local", "CGO_ENABLED": "0"})
    env.pop("GOFLAGS", None)
    return env


def go_version(go: str | None = None) -> str:
    """``go1.26.8`` for the Go on PATH."""
    out = subprocess.run(
        [go or go_binary(), "env", "GOVERSION"],
        capture_output=True,
        text=True,
        check=True,
        env=go_env(),
    )
    return out.stdout.strip()


def _required_go(gobuild: Path) -> tuple[int, ...]:
    need: tuple[int, ...] = (0,)
    for sub in ("etcd", "k8s", "kwok"):
        m = re.search(r"^go\s+(\d+(?:\.\d+)*)", (gobuild / sub / "go.mod").read_text(), re.M)
        if m:
            need = max(need, tuple(int(x) for x in m.group(1).split(".")))
    return need


def pins(go: str | None = None, gobuild: Path = GOBUILD_DIR) -> Pins:
    """The pins of the recipe with the Go on PATH (raises :class:`BinariesError` without Go)."""
    k8s, etcd, kwok = recipe_versions(gobuild)
    return Pins(k8s, etcd, kwok, go_version(go))


# --- version checks -------------------------------------------------------------------------------


def _expected_version(name: str, p: Pins) -> tuple[list[str], str]:
    if name == "etcd":
        return ["--version"], f"etcd Version: {p.etcd.removeprefix('v')}"
    if name == "kwok":
        return ["--version"], f"kwok version {p.kwok}"
    if name == KUBECTL:
        return ["version", "--client"], f"Client Version: {p.k8s}"
    return ["--version"], f"Kubernetes {p.k8s}"


def check_version(path: Path, name: str, p: Pins) -> str:
    """Run ``<binary> --version``; return its first line, or raise :class:`BinariesError` when it
    does not report the pinned version."""
    args, want = _expected_version(name, p)
    try:
        out = subprocess.run(
            [str(path), *args], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError as exc:
        raise BinariesError(f"{path} does not run: {exc}") from None
    text = (out.stdout + out.stderr).strip()
    if want not in text:
        raise BinariesError(
            f"{path} reports {text.splitlines()[0] if text else '(nothing)'!r}, expected "
            f"{want!r}; delete it and run `gpufed local build`"
        )
    return text.splitlines()[0]


# --- building --------------------------------------------------------------------------------------


def _k8s_ldflags(version: str) -> str:
    # hack/lib/version.sh sets these on both packages; without them /version says v0.0.0-master.
    m = re.match(r"v(\d+)\.(\d+)", version)
    major, minor = (m.group(1), m.group(2)) if m else ("0", "0")
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return " ".join(flags)


@dataclass(frozen=True)
class _Group:
    """One ``go build`` invocation: a wrapper module and the binaries it produces."""

    module_dir: str
    outputs: tuple[str, ...]
    packages: tuple[str, ...]
    tags: str
    ldflags: str


def _groups(p: Pins, with_kubectl: bool) -> list[_Group]:
    k8s_bins = (*_K8S_COMMANDS, *((KUBECTL,) if with_kubectl else ()))
    return [
        _Group("etcd", ("etcd",), ("go.etcd.io/etcd/server/v3",), "", "-s -w"),
        _Group("kwok", ("kwok",), ("sigs.k8s.io/kwok/cmd/kwok",), "", "-s -w"),
        _Group(
            "k8s",
            k8s_bins,
            tuple(f"k8s.io/kubernetes/cmd/{b}" for b in k8s_bins),
            # upstream hack/lib/golang.sh build tags
            "selinux,notest,grpcnotrace",
            _k8s_ldflags(p.k8s),
        ),
    ]


def _build_argv(go: str, g: _Group, out: Path) -> list[str]:
    argv = [go, "build", "-trimpath"]
    if g.tags:
        argv += ["-tags", g.tags]
    argv += ["-ldflags", g.ldflags]
    # One output file per package: name it (etcd's main package would be called "v3");
    # several packages: -o DIR/ names each after its last path element.
    argv += ["-o", str(out / g.outputs[0]) if len(g.packages) == 1 else f"{out}/"]
    return [*argv, *g.packages]


@contextlib.contextmanager
def build_lock(root: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``root/.lock`` (one build of a directory at a time)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_stamp(bin_dir: Path) -> dict[str, object]:
    """``bin_dir/stamp.json`` as a dict ({} when absent or unreadable)."""
    try:
        data = json.loads((bin_dir / "stamp.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _is_current(bin_dir: Path, names: Sequence[str], recipe: str) -> bool:
    stamp = read_stamp(bin_dir)
    return stamp.get("recipe_sha256") == recipe and not BinDir(bin_dir).missing(names)


def _echo(msg: str) -> None:
    print(msg, flush=True)


def build(
    *,
    with_kubectl: bool = False,
    force: bool = False,
    progress: Progress | None = _echo,
    gobuild: Path = GOBUILD_DIR,
) -> BinDir:
    """Build the pinned binaries into ``cache_root()/bin/<pins>/``; skip what is current.

    Prints one progress line per binary (``progress``; ``None`` for silence) with its version
    check. A directory counts as current when its ``stamp.json`` records the same go.mod/go.sum
    hash and every wanted binary is there. ``force`` rebuilds anyway. Raises
    :class:`BinariesError` when Go is missing or too old, or a build or version check fails
    (naming the log file with the compiler output).
    """
    say = progress or (lambda _m: None)
    go = go_binary()
    p = pins(go, gobuild)
    need = _required_go(gobuild)
    have = tuple(int(x) for x in re.findall(r"\d+", p.go)[:3])
    if have < need:
        raise BinariesError(
            f"{p.go} is too old: the pinned modules need Go >= {'.'.join(map(str, need))} "
            "(GOTOOLCHAIN=local, so Go is not downloaded); install a newer Go"
        )
    wanted = (*CORE_BINARIES, *((KUBECTL,) if with_kubectl else ()))
    root = cache_root() / "bin"
    target = root / p.dirname
    recipe = recipe_hash(gobuild)
    with build_lock(root):
        if not force and _is_current(target, wanted, recipe):
            for name in wanted:
                say(f"  {name:<24} present  {check_version(target / name, name, p)}")
            return BinDir(target)
        stale = read_stamp(target).get("recipe_sha256") != recipe
        target.mkdir(parents=True, exist_ok=True)
        if stale or force:
            (target / "stamp.json").unlink(missing_ok=True)
        say(f"building control-plane binaries into {target} (cold build: ~6 min on 2 cores)")
        log_path = target / "build.log"
        started_all = time.monotonic()
        for g in _groups(p, with_kubectl):
            todo = [n for n in g.outputs if force or stale or not os.access(target / n, os.X_OK)]
            if not todo:
                for name in g.outputs:
                    say(f"  {name:<24} present  {check_version(target / name, name, p)}")
                continue
            _run_group(go, g, gobuild, target, p, log_path, say)
        (target / "stamp.json").write_text(
            json.dumps(
                {
                    "recipe_sha256": recipe,
                    "pins": p.__dict__,
                    "binaries": sorted(wanted),
                    "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                },
                indent=2,
            )
            + "\n"
        )
        log.info("binaries.built", dir=str(target), seconds=round(time.monotonic() - started_all))
        return BinDir(target)


def run_go_build(argv: list[str], cwd: Path, log_path: Path, what: str) -> None:
    """Run one ``go build`` in ``cwd``, appending its output to ``log_path``; raise
    :class:`BinariesError` naming ``what``, the log and its last lines when it fails."""
    with open(log_path, "a") as logf:
        logf.write(f"\n$ (cd {cwd} && {' '.join(argv)})\n")
        logf.flush()
        proc = subprocess.run(
            argv, cwd=cwd, env=go_env(), stdout=logf, stderr=subprocess.STDOUT, check=False
        )
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        raise BinariesError(
            f"go build of {what} failed (exit {proc.returncode}); "
            f"full output in {log_path}:\n" + "\n".join(tail)
        )


def _run_group(
    go: str, g: _Group, gobuild: Path, target: Path, p: Pins, log_path: Path, say: Progress
) -> None:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=target, prefix=".build-") as tmp:
        tmp_dir = Path(tmp)
        argv = _build_argv(go, g, tmp_dir)
        run_go_build(argv, gobuild / g.module_dir, log_path, ", ".join(g.outputs))
        took = time.monotonic() - started
        for name in g.outputs:
            version = check_version(tmp_dir / name, name, p)
            os.replace(tmp_dir / name, target / name)
            size = (target / name).stat().st_size / 1e6
            say(f"  {name:<24} built    {version}  ({size:.0f} MB, {took:.0f}s)")


def find_current(gobuild: Path = GOBUILD_DIR) -> BinDir | None:
    """A cached build of the current recipe, whatever Go built it (no Go needed), or None."""
    root = cache_root() / "bin"
    k8s, etcd, kwok = recipe_versions(gobuild)
    recipe = recipe_hash(gobuild)
    prefix = f"k8s-{k8s}_etcd-{etcd}_kwok-{kwok}_go"
    candidates = sorted(root.glob(f"{prefix}*"), reverse=True) if root.is_dir() else []
    for d in candidates:
        if _is_current(d, CORE_BINARIES, recipe):
            return BinDir(d)
    return None


def ensure_binaries(*, build_if_missing: bool = True, progress: Progress | None = _echo) -> BinDir:
    """The directory with etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok.

    Order: ``$GPUFED_BIN_DIR`` (must hold all five), else a current cached build (any Go
    version), else :func:`build` (minutes; one progress line per binary) unless
    ``build_if_missing`` is false. Raises :class:`BinariesError` saying what is missing and how
    to get it.
    """
    if env := os.environ.get("GPUFED_BIN_DIR"):
        bd = BinDir(Path(env).expanduser())
        if missing := bd.missing():
            raise BinariesError(
                f"GPUFED_BIN_DIR={env} lacks {', '.join(missing)}; build them with "
                "`gpufed local build` or unset GPUFED_BIN_DIR"
            )
        return bd
    if found := find_current():
        return found
    if not build_if_missing:
        raise BinariesError(
            "the control-plane binaries are not built yet (looked in "
            f"{cache_root() / 'bin'}); run `gpufed local build`"
        )
    return build(progress=progress)


# --- regenerating the recipe -------------------------------------------------------------------------

_HEADERS = {
    "k8s": (
        "// Build recipe for the Kubernetes control-plane binaries used by the gpufed sandbox.\n"
        '// k8s.io/kubernetes cannot be built with "go install" (its go.mod replaces staging modules\n'
        "// with local paths), so this wrapper module pins the release and maps each staging module\n"
        "// to its published version. Regenerate with: gpufed local build --regenerate\n"
    ),
    "etcd": (
        "// Build recipe for the etcd server used by the gpufed sandbox and the hub's embedded store.\n"
        '// go.etcd.io/etcd/server/v3 has local replace directives, so "go install" refuses it; this\n'
        "// wrapper module pins the release instead.\n"
    ),
    "kwok": "// Build recipe for kwok (simulated nodes and pod lifecycles) used by the gpufed sandbox.\n",
}


def regenerate(
    *,
    k8s: str = K8S_VERSION,
    etcd: str = ETCD_VERSION,
    kwok: str = KWOK_VERSION,
    gobuild: Path = GOBUILD_DIR,
    progress: Progress | None = _echo,
) -> None:
    """Rewrite the wrapper go.mod/go.sum files for the given versions (control-planes.md §A.3).

    The Kubernetes wrapper takes its ``go``/``godebug`` lines and the list of staging modules
    from the release's own go.mod (every ``k8s.io/X => ./staging/...`` replace becomes
    ``k8s.io/X => k8s.io/X v0.<minor>.<patch>``). Needs Go and the module proxy.
    """
    say = progress or (lambda _m: None)
    go = go_binary()
    env = go_env()

    def run(argv: list[str], cwd: Path | None = None) -> str:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BinariesError(f"`{' '.join(argv)}` failed:\n{proc.stderr.strip()}")
        return proc.stdout

    info = json.loads(run([go, "mod", "download", "-json", f"k8s.io/kubernetes@{k8s}"]))
    upstream = Path(info["GoMod"]).read_text()
    go_line = re.search(r"^go\s+\S+", upstream, re.M)
    godebug = re.search(r"^godebug\s+.*$", upstream, re.M)
    staging = re.findall(r"^\s*(k8s\.io/\S+)\s*=>\s*\./staging/", upstream, re.M)
    staging_version = "v0." + k8s.removeprefix("v1.")
    plans = {
        "k8s": (
            "gpufed.invalid/gobuild/k8s",
            (go_line.group(0) if go_line else "go 1.26.0"),
            (godebug.group(0) if godebug else ""),
            # kubectl is a tool too, so `build --with-kubectl` works from the committed go.sum.
            [f"k8s.io/kubernetes/cmd/{b}@{k8s}" for b in (*_K8S_COMMANDS, KUBECTL)],
            [f"{m} => {m} {staging_version}" for m in staging],
        ),
        "etcd": (
            "gpufed.invalid/gobuild/etcd",
            "go 1.26.0",
            "",
            [f"go.etcd.io/etcd/server/v3@{etcd}"],
            [],
        ),
        "kwok": (
            "gpufed.invalid/gobuild/kwok",
            "go 1.26.0",
            "",
            [f"sigs.k8s.io/kwok/cmd/kwok@{kwok}"],
            [],
        ),
    }
    for sub, (module, go_directive, godebug_line, tools, replaces) in plans.items():
        d = gobuild / sub
        d.mkdir(parents=True, exist_ok=True)
        say(f"  regenerating {d / 'go.mod'}")
        body = f"{_HEADERS[sub]}module {module}\n\n{go_directive}\n"
        if godebug_line:
            body += f"\n{godebug_line}\n"
        if replaces:
            # Unversioned left sides also match k8s.io/kubernetes' "v0.0.0" requirements.
            body += "\nreplace (\n" + "".join(f"\t{r}\n" for r in replaces) + ")\n"
        (d / "go.mod").write_text(body)
        (d / "go.sum").unlink(missing_ok=True)
        run([go, "get", "-tool", *tools], cwd=d)
        run([go, "mod", "tidy"], cwd=d)
