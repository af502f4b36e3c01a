"""`gpufed submit`: files and directories to GPUJobs (a workload plus its objects is one GPUJob),
--dry-run's JSON/YAML shape, and --wait's outcome over recorded job states (fake time)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufed.cli.follow import follow
from gpufed.cli.main import app
from gpufed.cli.submit import SubmitError, gpujobs_of, read_sources

JOB = """apiVersion: batch/v1
kind: Job
metadata:
  name: train
  annotations: {gpufed.io/gpu-products: H100}
spec:
  parallelism: 2
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: c
        image: trainer
        resources: {limits: {nvidia.com/gpu: 8}}
        envFrom: [{configMapRef: {name: train-config}}]
"""
CONFIG = """apiVersion: v1
kind: ConfigMap
metadata: {name: train-config}
data: {EPOCHS: "3"}
"""
SERVICE = """apiVersion: v1
kind: Service
metadata: {name: train}
spec: {clusterIP: None, selector: {job-name: train}}
"""
RAYJOB = """apiVersion: ray.io/v1
kind: RayJob
metadata: {name: tune}
spec:
  entrypoint: python tune.py
  rayClusterSpec:
    headGroupSpec:
      template: {spec: {containers: [{name: head, image: ray}]}}
    workerGroupSpecs:
    - groupName: gpu
      replicas: 2
      template:
        spec:
          containers:
          - {name: w, image: ray, resources: {limits: {nvidia.com/gpu: 4}}}
"""


def docs(*texts: str) -> list[Any]:
    return [yaml.safe_load(t) for t in texts]


def test_a_workload_and_its_objects_in_one_file_become_one_gpujob() -> None:
    (job,) = gpujobs_of("f.yaml", docs(CONFIG, JOB, SERVICE), "team-a")
    assert job["metadata"] == {
        "name": "train",
        "namespace": "team-a",
        "labels": {},
        "annotations": {"gpufed.io/gpu-products": "H100"},
    }
    assert job["spec"]["placement"] == {"gpuProducts": ["H100"]}
    template = job["spec"]["template"]
    assert (template["kind"], [i["kind"] for i in template["items"]]) == (
        "List",
        ["ConfigMap", "Job", "Service"],
    )


def test_a_kubectl_list_document_counts_as_its_items() -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": docs(JOB, CONFIG)}
    (job,) = gpujobs_of("f.yaml", [listed], "team-a")
    assert len(job["spec"]["template"]["items"]) == 2


def test_several_workloads_alone_are_one_gpujob_each() -> None:
    jobs = gpujobs_of("f.yaml", docs(JOB, RAYJOB), "team-a")
    assert [(j["metadata"]["name"], j["spec"]["template"]["kind"]) for j in jobs] == [
        ("train", "Job"),
        ("tune", "RayJob"),
    ]


@pytest.mark.parametrize(
    ("texts", "match"),
    [
        ((CONFIG,), "with 0 workloads"),
        ((JOB, RAYJOB, CONFIG), "with 2 workloads"),
        (
            (
                "apiVersion: gpufed.io/v1alpha1\nkind: GPUJob\nmetadata: {name: g}\n"
                "spec: {template: {}}\n",
                CONFIG,
            ),
            "beside a GPUJob",
        ),
        ((JOB, CONFIG.replace("metadata: {", "metadata: {namespace: other, ")), "not the job's"),
    ],
)
def test_files_whose_objects_belong_to_no_one_workload_are_refused(
    texts: tuple[str, ...], match: str
) -> None:
    with pytest.raises(SubmitError, match=match) as err:
        gpujobs_of("f.yaml", docs(*texts), "team-a")
    assert "f.yaml document" in str(err.value)


def test_a_directory_submits_every_yaml_yml_and_json_file_by_name(tmp_path: Path) -> None:
    (tmp_path / "b.yml").write_text(RAYJOB)
    (tmp_path / "a.yaml").write_text(JOB + "---\n" + CONFIG)
    (tmp_path / "c.json").write_text(json.dumps(yaml.safe_load(JOB.replace("train", "eval"))))
    (tmp_path / "notes.txt").write_text("not a manifest")
    sources = read_sources([tmp_path])
    assert [Path(s).name for s, _ in sources] == ["a.yaml", "b.yml", "c.json"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(SubmitError, match=r"without \*\.yaml"):
        read_sources([tmp_path / "empty"])


def dry_run(tmp_path: Path, *args: str) -> Any:
    result = CliRunner().invoke(
        app, ["submit", "--dry-run", "-n", "team-a", *args], env={"KUBECONFIG": "/nonexistent"}
    )
    return result


def test_dry_run_prints_one_entry_per_gpujob_with_pod_sets_and_gpus(tmp_path: Path) -> None:
    (tmp_path / "train.yaml").write_text(JOB + "---\n" + CONFIG)
    (tmp_path / "tune.yaml").write_text(RAYJOB)
    result = dry_run(tmp_path, "-f", str(tmp_path), "-o", "json")
    assert result.exit_code == 0, result.output
    entries = json.loads(result.output)
    assert [(e["podSets"], e["gpus"]) for e in entries] == [
        ([{"name": "main", "count": 2, "gpusPerPod": 8}], 16),
        (
            [
                {"name": "head", "count": 1, "gpusPerPod": 0},
                {"name": "gpu", "count": 2, "gpusPerPod": 4},
            ],
            8,
        ),
    ]
    assert entries[0]["gpujob"]["kind"] == "GPUJob"
    assert entries[1]["gpujob"]["metadata"]["namespace"] == "team-a"
    as_yaml = dry_run(tmp_path, "-f", str(tmp_path / "tune.yaml"), "-o", "yaml")
    assert yaml.safe_load(as_yaml.output) == entries[1:]


def test_dry_run_refuses_what_the_hub_would_refuse_naming_the_field(tmp_path: Path) -> None:
    f = tmp_path / "j.yaml"
    f.write_text(JOB.replace("gpu-products: H100", "gpu-products: H1OO"))
    result = dry_run(tmp_path, "-f", str(f))
    assert result.exit_code == 1
    assert result.output.startswith("error: team-a/train: spec.placement.gpuProducts[0]")
    f.write_text(JOB + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")
    result = dry_run(tmp_path, "-f", str(f))
    assert "Pod may not be created in a member" in result.output


def test_dry_run_without_o_says_what_it_would_create(tmp_path: Path) -> None:
    f = tmp_path / "j.yaml"
    f.write_text(JOB)
    result = dry_run(tmp_path, "-f", str(f))
    assert result.output.strip() == (
        "gpujob.gpufed.io/train would be created (namespace team-a, dry run): "
        "pod sets main 2x8; 16 GPUs"
    )


# --- --wait ----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, s: float) -> None:
        self.now += s


def states(*phases: dict[tuple[str, str], str | None]) -> Any:
    """fetch(): the recorded phases, one read after the other (the last repeats)."""
    seq = list(phases)

    def fetch() -> dict[tuple[str, str], Any]:
        now = seq.pop(0) if len(seq) > 1 else seq[0]
        return {
            k: {"status": {"phase": p, "cluster": "m1", "message": f"{p}!"}}
            for k, p in now.items()
            if p is not None
        }

    return fetch


A, B = ("t", "a"), ("t", "b")


def run_follow(
    fetch: Any, keys: list[tuple[str, str]], timeout_s: float = 0.0
) -> tuple[int, list[str]]:
    clock, lines = Clock(), []
    code = follow(
        fetch,
        keys,
        timeout_s=timeout_s,
        sleep=clock.sleep,
        clock=lambda: clock.now,
        echo=lines.append,
    )
    return code, lines


def test_wait_exits_0_when_every_job_succeeded_printing_each_phase_change() -> None:
    code, lines = run_follow(
        states(
            {A: "Pending", B: "Pending"},
            {A: "Running", B: "Pending"},
            {A: "Succeeded", B: "Succeeded"},
        ),
        [A, B],
    )
    assert code == 0
    assert lines == [
        "t/a: Pending on m1: Pending!",
        "t/b: Pending on m1: Pending!",
        "t/a: Running on m1: Running!",
        "t/a: Succeeded on m1",
        "t/b: Succeeded on m1",
        "all 2 jobs succeeded in 2 s",
    ]


def test_wait_exits_1_naming_each_job_that_failed_or_vanished() -> None:
    code, lines = run_follow(states({A: "Running", B: "Running"}, {A: "Failed", B: None}), [A, B])
    assert code == 1
    assert "error: t/a Failed: Failed! (why: `gpufed explain t/a`)" in lines
    assert any(line.startswith("error: t/b Deleted: the GPUJob is gone") for line in lines)
    assert lines[-1] == "2 of 2 jobs did not succeed"


def test_wait_gives_up_at_the_timeout_naming_what_still_runs() -> None:
    code, lines = run_follow(states({A: "Running"}), [A], timeout_s=5)
    assert code == 1
    assert lines[-1].startswith("error: still running after 5 s: t/a")


def test_a_yaml_alias_bomb_is_refused_not_expanded(tmp_path: Path) -> None:
    """Nine levels of nine aliases (a "billion laughs", 1.3 kB on disk) hung `gpufed submit`
    serialising the expanded object; it is refused, bounded, naming the file."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    bomb = tmp_path / "lol.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(SubmitError, match=r"lol\.yaml: .*document 1"):
        read_sources([bomb])
