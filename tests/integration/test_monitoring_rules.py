"""The alert rules under a real promtool: ``promtool check rules`` accepts rules.yaml and
``promtool test rules`` passes rules_test.yaml (every alert fires where it should and stays
quiet where it should not). promtool comes from scripts/ensure_prometheus.sh (the setup step
of scripts/test.sh)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

MONITORING = Path(__file__).resolve().parents[2] / "manifests" / "monitoring"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not on PATH: run ./scripts/ensure_prometheus.sh (make test does)")
    return found


def run(*args: str) -> str:
    done = subprocess.run(
        [promtool(), *args], cwd=MONITORING, capture_output=True, text=True, timeout=120
    )
    out = done.stdout + done.stderr
    print(out)
    assert done.returncode == 0, out
    return out


def test_promtool_checks_the_rules() -> None:
    out = run("check", "rules", "rules.yaml")
    assert "SUCCESS" in out


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    out = run("test", "rules", "rules_test.yaml")
    assert "SUCCESS" in out
