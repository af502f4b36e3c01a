"""The pinned Kueue manager (gpufed.sandbox.kueue), driven by the fake `go` of conftest.py: its
own cache directory, stamp and lock (a Kueue pin never touches the control-plane binaries'
directory), skip-when-current, rebuild on a pin change, the build-info version check,
``GPUFED_KUEUE``."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufed.sandbox import binaries as b
from gpufed.sandbox import kueue as k


def kueue_builds(log: Path) -> list[str]:
    return [ln for ln in log.read_text().splitlines() if " build " in ln and "cmd/kueue" in ln]


def test_the_pin_is_read_from_the_wrapper_go_mod() -> None:
    assert k.kueue_version() == "v0.17.0"
    assert k.kueue_dirname("v0.17.0", "go1.26.8") == "kueue-v0.17.0_go1.26.8"


def test_kueue_builds_into_its_own_directory_with_its_own_stamp_and_lock(
    fake_go: Path, recipe: Path, tmp_path: Path
) -> None:
    lines: list[str] = []
    path = k.build_kueue(progress=lines.append, gobuild=recipe)
    assert path == tmp_path / "cache" / "bin" / "kueue-v0.17.0_go1.26.8" / "kueue"
    assert {p.name for p in path.parent.iterdir()} >= {"kueue", "stamp.json", ".lock"}
    assert [p.name for p in (tmp_path / "cache" / "bin").iterdir()] == ["kueue-v0.17.0_go1.26.8"]
    (call,) = kueue_builds(fake_go)
    assert call.startswith("GOTOOLCHAIN=local CGO_ENABLED=0 build -trimpath")
    assert "sigs.k8s.io/kueue/pkg/version.GitVersion=v0.17.0" in call
    assert b.read_stamp(path.parent)["pins"] == {"kueue": "v0.17.0", "go": "go1.26.8"}
    assert any(" built " in ln and "v0.17.0" in ln for ln in lines)


def test_the_control_plane_directory_key_ignores_the_kueue_recipe(recipe: Path) -> None:
    before = b.recipe_hash(recipe)
    gomod = recipe / "kueue" / "go.mod"
    gomod.write_text(
        gomod.read_text().replace("sigs.k8s.io/kueue v0.17.0", "sigs.k8s.io/kueue v0.17.1")
    )
    assert b.recipe_hash(recipe) == before
    assert k.kueue_version(recipe) == "v0.17.1"


def test_kueue_is_skipped_when_current_and_rebuilt_when_the_pin_changes(
    fake_go: Path, recipe: Path
) -> None:
    k.build_kueue(gobuild=recipe)
    lines: list[str] = []
    k.build_kueue(progress=lines.append, gobuild=recipe)
    assert len(kueue_builds(fake_go)) == 1
    assert " present " in lines[0]
    gosum = recipe / "kueue" / "go.sum"
    gosum.write_text(gosum.read_text() + "\n")
    k.build_kueue(gobuild=recipe)
    assert len(kueue_builds(fake_go)) == 2


def test_a_kueue_built_from_another_version_is_refused(
    fake_go: Path, recipe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_KUEUE", "v0.16.0")
    with pytest.raises(b.BinariesError, match=r"not a Kueue manager built from.*v0.17.0"):
        k.build_kueue(gobuild=recipe)


def test_ensure_kueue_finds_a_build_and_says_how_to_get_one_when_there_is_none(
    fake_go: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("GPUFED_KUEUE", raising=False)
    with pytest.raises(b.BinariesError, match="run `gpufed local build`"):
        k.ensure_kueue(build_if_missing=False)
    built = k.build_kueue()
    assert k.ensure_kueue(build_if_missing=False) == built
    monkeypatch.setenv("GPUFED_KUEUE", str(built))
    assert k.ensure_kueue(build_if_missing=False) == built
    other = tmp_path / "not-kueue"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setenv("GPUFED_KUEUE", str(other))
    with pytest.raises(b.BinariesError, match="unset GPUFED_KUEUE"):
        k.ensure_kueue(build_if_missing=False)
