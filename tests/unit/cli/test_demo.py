"""`gpufed demo` pieces without a sandbox: the gpufed.io/expect grammar and checks, loading the
example jobs, and the table rows' shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufed.cli.demo import (
    EXAMPLE_JOBS,
    EXPECT_ANNOTATION,
    Expectation,
    RunResult,
    demo_rows,
    load_examples,
)


def status(phase: str, cluster: str | None = None, *reasons: str) -> dict[str, Any]:
    return {
        "status": {
            "phase": phase,
            "cluster": cluster,
            "conditions": [
                {"type": f"C{i}", "status": "True", "reason": r} for i, r in enumerate(reasons)
            ],
        }
    }


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("Succeeded", Expectation("Succeeded")),
        ("Succeeded on eu-nvl72", Expectation("Succeeded", "eu-nvl72")),
        (
            "Failed because BackoffLimitExceeded",
            Expectation("Failed", reason="BackoffLimitExceeded"),
        ),
        (
            "Failed unplaced because Rejected",
            Expectation("Failed", unplaced=True, reason="Rejected"),
        ),
        ("  Running  ", Expectation("Running")),
    ],
)
def test_expect_annotations_parse(text: str, want: Expectation) -> None:
    assert Expectation.parse(text) == want
    assert Expectation.parse(str(want)) == want


@pytest.mark.parametrize("text", ["succeeded", "Done", "Succeeded at eu", "Failed because", ""])
def test_a_bad_expect_annotation_names_the_grammar(text: str) -> None:
    with pytest.raises(ValueError, match=r"<Phase> \[on <cluster> \| unplaced\]"):
        Expectation.parse(text)


def test_unmet_says_what_differs_and_none_when_it_holds() -> None:
    want = Expectation("Succeeded", "eu-nvl72")
    assert want.unmet(status("Succeeded", "eu-nvl72")) is None
    assert want.unmet(status("Failed", "us-east-hgx")) == (
        "phase Failed, expected Succeeded; ran on us-east-hgx, expected eu-nvl72"
    )
    rejected = Expectation("Failed", unplaced=True, reason="Rejected")
    assert rejected.unmet(status("Failed", None, "Valid", "Rejected")) is None
    assert "placed on m1, expected no member" in (
        rejected.unmet(status("Failed", "m1", "Rejected")) or ""
    )
    assert "no condition with reason Rejected (reasons: Valid)" in (
        rejected.unmet(status("Failed", None, "Valid")) or ""
    )
    assert Expectation().unmet({}) == "phase Pending, expected Succeeded"


def test_the_examples_cover_the_demo_shapes_and_each_says_how_it_ends() -> None:
    examples = {ex.name: ex for ex in load_examples(EXAMPLE_JOBS)}
    assert len(examples) >= 6
    for ex in examples.values():
        assert EXPECT_ANNOTATION in ex.obj["metadata"]["annotations"], ex.source

    def limits(name: str) -> dict[str, Any]:
        pod = examples[name].obj["spec"]["template"]["spec"]["template"]["spec"]
        return dict(pod["containers"][0]["resources"]["limits"])

    assert limits("llama-finetune-h100") == {"nvidia.com/gpu": 8}
    assert examples["pretrain-nvl72"].obj["spec"]["placement"]["topology"] == {"nvlink": "Required"}
    assert examples["pretrain-nvl72"].expect.cluster == "eu-nvl72"
    assert limits("mig-inference") == {"nvidia.com/mig-1g.10gb": 1}
    assert limits("notebook-2gpu") == {"nvidia.com/gpu": 2}
    assert examples["eval-crash"].expect == Expectation("Failed", reason="BackoffLimitExceeded")
    assert examples["giant-nvlink"].expect.unplaced


def test_plain_workloads_are_wrapped_and_bad_files_name_themselves(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: plain\n  annotations:\n"
        "    gpufed.io/expect: Succeeded\nspec:\n  template:\n    spec:\n      containers: []\n"
    )
    (ex,) = load_examples(tmp_path, namespace="team-z")
    assert (ex.key, ex.obj["kind"], ex.expect) == ("team-z/plain", "GPUJob", Expectation())
    (tmp_path / "b.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(ValueError, match=r"b\.yaml: kind 'ConfigMap'"):
        load_examples(tmp_path)
    with pytest.raises(ValueError, match=r"no \*\.yaml files"):
        load_examples(tmp_path / "empty")


def test_rows_carry_exactly_the_documented_keys() -> None:
    ex = load_examples(EXAMPLE_JOBS)[:2]
    placed = {
        "status": {
            "phase": "Succeeded",
            "cluster": "eu-nvl72",
            "gpus": 32,
            "placement": {"outcome": "Placed", "nvlinkDomains": ["clique:a.0"]},
            "timings": {"placementMs": 3.5, "dispatchMs": 40.0},
        }
    }
    rows = demo_rows(ex, RunResult(jobs={ex[0].key: placed}))
    assert rows[0] == {
        "job": ex[0].key,
        "gpus": 32,
        "topology": "Preferred",
        "cluster": "eu-nvl72",
        "domain": "clique:a.0",
        "phase": "Succeeded",
        "placement_ms": 3.5,
        "dispatch_ms": 40.0,
    }
    assert (rows[1]["cluster"], rows[1]["domain"]) == (None, None)


class RunningSandbox:
    """A sandbox already running the example fleet with hub and agents (what the demo reuses)."""

    state_dir = Path("/tmp/state")

    def __init__(self, fleet_file: Path) -> None:
        self.fleet_file = fleet_file
        self.waited = False

    def running_components(self) -> list[str]:
        return ["hub"]

    def info(self) -> Any:
        return type("Info", (), {"control_plane": object(), "fleet_file": self.fleet_file})()

    def wait_control_plane(self, timeout_s: float) -> None:
        self.waited = True


def test_demo_refuses_a_named_fleet_the_running_sandbox_does_not_have(tmp_path: Path) -> None:
    # From a new user's report: --fleet was silently ignored while a sandbox ran.
    from gpufed.cli.demo import EXAMPLE_FLEET, _sandbox_for_demo
    from gpufed.sandbox.runtime import SandboxError

    sb = RunningSandbox(EXAMPLE_FLEET)
    other = tmp_path / "other.yaml"
    with pytest.raises(SandboxError, match=r"has the fleet .*example\.yaml, not .*other\.yaml"):
        _sandbox_for_demo(sb, other, None, print)  # type: ignore[arg-type]
    assert not sb.waited
    # no --fleet, or the very fleet it runs: reused
    assert _sandbox_for_demo(sb, None, None, print).fleet_file == EXAMPLE_FLEET  # type: ignore[arg-type]
    assert _sandbox_for_demo(sb, EXAMPLE_FLEET, None, print).fleet_file == EXAMPLE_FLEET  # type: ignore[arg-type]


def test_the_multikueue_example_is_a_kueue_job_the_demo_skips() -> None:
    doc = yaml.safe_load((EXAMPLE_JOBS / "multikueue-job.yaml").read_text())
    assert doc["kind"] == "Job"
    assert doc["metadata"]["namespace"] == "bench"
    assert doc["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "gpufed-bench"}
    pod = doc["spec"]["template"]
    assert pod["metadata"]["annotations"]["gpufed.io/sim-duration"]
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert "multikueue-demo" not in {ex.name for ex in load_examples(EXAMPLE_JOBS)}
