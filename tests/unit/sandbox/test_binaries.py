"""The binaries builder (gpufed.sandbox.binaries), driven by a fake `go` that writes fake
binaries: pins, cache layout, skip-when-current, rebuild on a pin change, version checks, and
the error when Go is missing. The real compile is exercised by `make binaries`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufed.sandbox import binaries as b


def builds(log: Path) -> list[str]:
    return [ln for ln in log.read_text().splitlines() if " build " in ln]


def test_pins_in_go_mod_match_the_regenerate_defaults() -> None:
    assert b.recipe_versions() == (b.K8S_VERSION, b.ETCD_VERSION, b.KWOK_VERSION)


def test_pins_dirname_names_every_version() -> None:
    p = b.Pins("v1.36.3", "v3.6.16", "v0.8.0", "go1.26.8")
    assert p.dirname == "k8s-v1.36.3_etcd-v3.6.16_kwok-v0.8.0_go1.26.8"


def test_cache_root_honours_gpufed_cache_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFED_CACHE_DIR", "/x/y")
    assert b.cache_root() == Path("/x/y")
    monkeypatch.delenv("GPUFED_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/c")
    assert b.cache_root() == Path("/c/gpufed")


def test_build_compiles_each_binary_once_with_one_progress_line_each(
    fake_go: Path, recipe: Path, tmp_path: Path
) -> None:
    lines: list[str] = []
    bins = b.build(progress=lines.append, gobuild=recipe)
    assert bins.path == tmp_path / "cache" / "bin" / "k8s-v1.36.3_etcd-v3.6.16_kwok-v0.8.0_go1.26.8"
    assert bins.missing() == []
    per_binary = [ln for ln in lines if ln.startswith("  ")]
    assert [ln.split()[0] for ln in per_binary] == [
        "etcd",
        "kwok",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ]
    assert all(" built " in ln for ln in per_binary)
    assert "Kubernetes v1.36.3" in per_binary[2]
    calls = builds(fake_go)
    assert len(calls) == 3  # etcd, kwok, and one go build for the three k8s commands
    assert all(c.startswith("GOTOOLCHAIN=local CGO_ENABLED=0 build -trimpath") for c in calls)
    k8s_call = calls[2]
    assert "-tags selinux,notest,grpcnotrace" in k8s_call
    assert "k8s.io/component-base/version.gitVersion=v1.36.3" in k8s_call
    assert "k8s.io/client-go/pkg/version.gitVersion=v1.36.3" in k8s_call
    assert (bins.path / "stamp.json").exists()


def test_build_skips_when_present_and_pins_unchanged(fake_go: Path, recipe: Path) -> None:
    b.build(progress=None, gobuild=recipe)
    lines: list[str] = []
    b.build(progress=lines.append, gobuild=recipe)
    assert len(builds(fake_go)) == 3  # nothing compiled the second time
    assert len(lines) == 5
    assert all(" present " in ln for ln in lines)


def test_build_rebuilds_when_a_pin_changes(fake_go: Path, recipe: Path) -> None:
    b.build(progress=None, gobuild=recipe)
    with open(recipe / "etcd" / "go.sum", "a") as fh:
        fh.write("example.invalid/x v0.0.1 h1:AAAA=\n")
    b.build(progress=None, gobuild=recipe)
    assert len(builds(fake_go)) == 6


def test_with_kubectl_adds_it_to_the_kubernetes_build(fake_go: Path, recipe: Path) -> None:
    b.build(progress=None, gobuild=recipe)
    bins = b.build(with_kubectl=True, progress=None, gobuild=recipe)
    assert bins.missing((b.KUBECTL,)) == []
    last = builds(fake_go)[-1]
    assert "k8s.io/kubernetes/cmd/kubectl" in last


def test_version_mismatch_fails_and_names_the_binary(
    fake_go: Path, recipe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_ETCD", "3.5.1")
    with pytest.raises(b.BinariesError, match=r"etcd reports 'etcd Version: 3.5.1', expected"):
        b.build(progress=None, gobuild=recipe)


def test_missing_go_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recipe: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        b.BinariesError, match=r"Go is not installed: the `go` command is not on PATH"
    ):
        b.build(progress=None, gobuild=recipe)


def test_ensure_binaries_finds_a_current_build_without_go(
    fake_go: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = b.build(progress=None)  # the repo's own recipe, fake compiler
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert b.ensure_binaries(build_if_missing=False) == built


def test_ensure_binaries_without_a_build_says_how_to_get_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GPUFED_BIN_DIR", raising=False)
    with pytest.raises(b.BinariesError, match="run `gpufed local build`"):
        b.ensure_binaries(build_if_missing=False)


def test_gpufed_bin_dir_must_hold_every_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "prebuilt"
    d.mkdir()
    for name in ("etcd", "kwok"):
        (d / name).write_text("#!/bin/sh\n")
        os.chmod(d / name, 0o755)
    monkeypatch.setenv("GPUFED_BIN_DIR", str(d))
    with pytest.raises(b.BinariesError, match="lacks kube-apiserver, kube-controller-manager"):
        b.ensure_binaries()
