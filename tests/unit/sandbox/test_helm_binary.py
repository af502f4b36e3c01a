"""The pinned helm (gpufed.sandbox.helm), driven by the fake `go` of conftest.py: its own cache
directory, stamp and lock (a helm pin never touches the control-plane binaries' directory),
skip-when-current, rebuild on a pin change, the version check, ``GPUFED_HELM``."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufed.sandbox import binaries as b
from gpufed.sandbox import helm as h


def helm_builds(log: Path) -> list[str]:
    return [ln for ln in log.read_text().splitlines() if " build " in ln and "cmd/helm" in ln]


def test_the_pin_is_read_from_the_wrapper_go_mod() -> None:
    assert h.helm_version() == "v4.3.2"
    assert h.helm_dirname("v4.3.2", "go1.26.8") == "helm-v4.3.2_go1.26.8"


def test_helm_builds_into_its_own_directory_with_its_own_stamp_and_lock(
    fake_go: Path, recipe: Path, tmp_path: Path
) -> None:
    lines: list[str] = []
    path = h.build_helm(progress=lines.append, gobuild=recipe)
    assert path == tmp_path / "cache" / "bin" / "helm-v4.3.2_go1.26.8" / "helm"
    assert {p.name for p in path.parent.iterdir()} >= {"helm", "stamp.json", ".lock"}
    assert [p.name for p in (tmp_path / "cache" / "bin").iterdir()] == ["helm-v4.3.2_go1.26.8"]
    (call,) = helm_builds(fake_go)
    assert call.startswith("GOTOOLCHAIN=local CGO_ENABLED=0 build -trimpath")
    assert "helm.sh/helm/v4/internal/version.version=v4.3.2" in call
    assert any(" built " in ln and "v4.3.2" in ln for ln in lines)


def test_the_control_plane_directory_key_ignores_the_helm_recipe(recipe: Path) -> None:
    before = b.recipe_hash(recipe)
    gomod = recipe / "helm" / "go.mod"
    gomod.write_text(gomod.read_text().replace("v4.3.2", "v4.3.3"))
    assert b.recipe_hash(recipe) == before
    assert h.helm_version(recipe) == "v4.3.3"


def test_helm_is_skipped_when_current_and_rebuilt_when_the_pin_changes(
    fake_go: Path, recipe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h.build_helm(gobuild=recipe)
    lines: list[str] = []
    h.build_helm(progress=lines.append, gobuild=recipe)
    assert len(helm_builds(fake_go)) == 1
    assert " present " in lines[0]
    gosum = recipe / "helm" / "go.sum"
    gosum.write_text(gosum.read_text() + "\n")
    h.build_helm(gobuild=recipe)
    assert len(helm_builds(fake_go)) == 2


def test_a_helm_reporting_another_version_is_refused(
    fake_go: Path, recipe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HELM", "v3.0.0")
    with pytest.raises(b.BinariesError, match=r"expected 'v4.3.2'.*gpufed local build"):
        h.build_helm(gobuild=recipe)


def test_ensure_helm_finds_a_build_and_says_how_to_get_one_when_there_is_none(
    fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(b.BinariesError, match="run `gpufed local build`"):
        h.ensure_helm(build_if_missing=False)
    built = h.build_helm()
    assert h.ensure_helm(build_if_missing=False) == built
    monkeypatch.setenv("GPUFED_HELM", str(built))
    assert h.ensure_helm(build_if_missing=False) == built
