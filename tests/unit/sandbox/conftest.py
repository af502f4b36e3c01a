"""Fixtures of the binaries tests: a fake `go` that writes fake binaries, and a copy of the
wrapper Go modules (gpufed.sandbox.binaries, gpufed.sandbox.helm, gpufed.sandbox.kueue)."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from gpufed.sandbox import binaries as b

FAKE_GO = r"""#!/usr/bin/env bash
echo "GOTOOLCHAIN=$GOTOOLCHAIN CGO_ENABLED=$CGO_ENABLED $*" >> "$FAKE_GO_LOG"
if [ "$1" = env ] && [ "$2" = GOVERSION ]; then echo go1.26.8; exit 0; fi
[ "$1" = build ] || exit 0
out=""; pkgs=()
shift
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=$2; shift 2;;
    -tags|-ldflags) shift 2;;
    -*) shift;;
    *) pkgs+=("$1"); shift;;
  esac
done
for p in "${pkgs[@]}"; do
  case "$p" in
    go.etcd.io/etcd/server/v3) f=$out; v="etcd Version: ${FAKE_ETCD:-3.6.16}";;
    sigs.k8s.io/kwok/cmd/kwok) f=$out; v="kwok version v0.8.0 go1.26.8 (linux/amd64)";;
    helm.sh/helm/v4/cmd/helm) f=$out; v="${FAKE_HELM:-v4.3.2}";;
    sigs.k8s.io/kueue/cmd/kueue)
      # The real manager has no --version: its Go build info names the module version.
      printf '#!/bin/sh\n# dep\tsigs.k8s.io/kueue\t%s\th1:x=\n' "${FAKE_KUEUE:-v0.17.0}" > "$out"
      chmod +x "$out"; continue;;
    sigs.k8s.io/jobset|*/training-operator.v1|github.com/ray-project/kuberay/ray-operator)
      # The workload operators likewise: their module at the version the go.mod in cwd pins.
      m=${p%/cmd/*}; v=$(awk -v m="$m" '$1 == m {print $2}' go.mod)
      printf '#!/bin/sh\n# dep\t%s\t%s\th1:x=\n' "$m" "${FAKE_OPERATOR:-$v}" > "$out"
      chmod +x "$out"; continue;;
    */kubectl) f=$out/kubectl; v="Client Version: v1.36.3";;
    *) f=$out/${p##*/}; v="Kubernetes v1.36.3";;
  esac
  printf '#!/bin/sh\necho "%s"\n' "$v" > "$f"; chmod +x "$f"
done
"""


@pytest.fixture
def fake_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `go` first on PATH; returns the file it logs its invocations to."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    go = bindir / "go"
    go.write_text(FAKE_GO)
    go.chmod(go.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "go.log"
    log.touch()
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_GO_LOG", str(log))
    monkeypatch.setenv("GPUFED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GPUFED_BIN_DIR", raising=False)
    return log


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    """A copy of the wrapper Go modules, to change pins without touching the repo."""
    dst = tmp_path / "gobuild"
    shutil.copytree(b.GOBUILD_DIR, dst)
    return dst
