"""``gpufed simulate --seeds``: the seed list, the paired figures (medians worked by hand) and
the CLI, whose per-seed lines must be the lines of separate ``--seed`` runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufed.cli.main import app
from gpufed.placement.sim.simseeds import paired, parse_seeds, yardstick_of


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("0-4", [0, 1, 2, 3, 4]), ("3", [3]), ("2,0,7", [2, 0, 7]), ("0-2, 9", [0, 1, 2, 9])],
)
def test_seed_lists(text: str, seeds: list[int]) -> None:
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a", "'a' is not a seed"),
        ("4-1", "a range goes up"),
        ("1,0-2", "names a seed twice"),
        (" , ", "at least one seed"),
        ("-1", "is not a seed"),
        ("0-100", "at most 100 seeds"),
        ("0-99999999999999", "at most 100 seeds"),
    ],
)
def test_bad_seed_lists_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_seeds(text)


def test_the_yardstick_is_first_admit_when_it_runs() -> None:
    assert yardstick_of(["gpufed", "first-admit"]) == "first-admit"
    assert yardstick_of(["first-admit", "gpufed"]) == "first-admit"
    assert yardstick_of(["gpufed", "cluster-sum"]) == "cluster-sum"


def _line(seed: int, policy: str, mean: float, util: float, **by_size: float) -> dict:
    return {
        "seed": seed,
        "policy": policy,
        "wait_mean_s": mean,
        "gpu_utilization": util,
        "wait_mean_s_by_size": {k.lstrip("g"): v for k, v in by_size.items()},
    }


def test_paired_figures_worked_by_hand() -> None:
    lines = [
        _line(0, "gpufed", 80.0, 0.90, g1=10.0, g8=300.0, g64=50.0),
        _line(0, "first-admit", 100.0, 0.91, g1=20.0, g8=200.0, g64=0.0),
        _line(1, "gpufed", 90.0, 0.92, g1=15.0, g8=330.0, g64=10.0),
        _line(1, "first-admit", 100.0, 0.90, g1=20.0, g8=300.0, g64=20.0),
        _line(2, "gpufed", 210.0, 0.88, g1=40.0, g8=100.0),
        _line(2, "first-admit", 200.0, 0.89, g1=20.0, g8=200.0),
    ]
    out = paired(lines, "first-admit")
    assert out["against"] == "first-admit"
    assert out["seeds"] == [0, 1, 2]
    g = out["policies"]["gpufed"]
    # 80/100, 90/100, 210/200
    assert g["wait_mean_ratio"] == {
        "per_seed": [0.8, 0.9, 1.05],
        "median": 0.9,
        "min": 0.8,
        "max": 1.05,
    }
    # 0.90-0.91, 0.92-0.90, 0.88-0.89
    assert g["gpu_utilization_diff"]["per_seed"] == [-0.01, 0.02, -0.01]
    assert g["gpu_utilization_diff"]["median"] == -0.01
    # 1 GPU: 0.5, 0.75, 2.0; 8 GPUs: 1.5, 1.1, 0.5; 64 GPUs: no ratio on seed 0 (first-admit
    # 0 s) nor seed 2 (not run): left out
    assert g["wait_mean_ratio_by_size"] == {
        "1": {"per_seed": [0.5, 0.75, 2.0], "median": 0.75, "min": 0.5, "max": 2.0},
        "8": {"per_seed": [1.5, 1.1, 0.5], "median": 1.1, "min": 0.5, "max": 1.5},
    }
    assert list(out["policies"]) == ["gpufed"]


def test_a_seed_without_the_yardstick_is_refused() -> None:
    lines = [_line(0, "gpufed", 1.0, 0.5), _line(1, "gpufed", 1.0, 0.5)]
    lines.append(_line(0, "first-admit", 1.0, 0.5))
    with pytest.raises(ValueError, match="seed 1 has no run of the yardstick 'first-admit'"):
        paired(lines, "first-admit")


def test_a_yardstick_that_never_waited_gives_no_mean_ratio() -> None:
    lines = [_line(0, "gpufed", 5.0, 0.5), _line(0, "first-admit", 0.0, 0.5)]
    assert paired(lines, "first-admit")["policies"]["gpufed"]["wait_mean_ratio"] is None


FLEET = """clusters:
  - name: m1
    nodePools:
      - name: h100
        nodes: 2
        gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}
        nvlink: node
"""


def _files(tmp_path: Path) -> list[str]:
    """Two 8-GPU nodes; a 16-GPU job waits behind two 4-GPU ones and holds both nodes, while
    a stream of 4-GPU jobs may backfill by their drawn time limits (so seeds 0 and 2 differ)."""
    rows = ["job_id,submit_s,gpus,duration_s", "1,0,4,4000", "2,0,4,9000", "3,1,16,600"]
    rows += [f"{4 + k},{2000 + k * 300},4,{500 + (k * 137) % 900}" for k in range(30)]
    (tmp_path / "fleet.yaml").write_text(FLEET)
    (tmp_path / "trace.csv").write_text("\n".join(rows) + "\n")
    fleet, trace = str(tmp_path / "fleet.yaml"), str(tmp_path / "trace.csv")
    args = ["simulate", "--fleet", fleet, "--trace", trace, "--policy", "gpufed,first-admit"]
    return [*args, "--per-size", "--json"]


def _lines(args: list[str]) -> list[dict]:
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    for line in lines:
        line.pop("runtime_s", None)
    return lines


def test_the_cli_runs_each_seed_as_a_separate_run_would_and_pairs_them(tmp_path: Path) -> None:
    base = _files(tmp_path)
    alone = {seed: _lines([*base, "--seed", str(seed)]) for seed in (0, 2)}
    assert alone[0][0] != alone[2][0]  # the seed matters to gpufed on this trace
    *runs, last = _lines([*base, "--seeds", "0,2"])
    assert runs == [{"seed": s, **line} for s in (0, 2) for line in alone[s]]
    figures = last["paired"]["policies"]["gpufed"]
    want = [round(g["wait_mean_s"] / fa["wait_mean_s"], 3) for g, fa in (alone[0], alone[2])]
    assert figures["wait_mean_ratio"]["per_seed"] == want
    size = "16"
    want16 = [
        round(g["wait_mean_s_by_size"][size] / fa["wait_mean_s_by_size"][size], 2)
        for g, fa in (alone[0], alone[2])
    ]
    assert figures["wait_mean_ratio_by_size"][size]["per_seed"] == want16
    assert last["paired"]["against"] == "first-admit"


def test_the_cli_prints_the_paired_table(tmp_path: Path) -> None:
    args = [a for a in _files(tmp_path) if a != "--json"]
    out = CliRunner().invoke(app, [*args, "--seeds", "0-1"])
    assert out.exit_code == 0, out.output
    assert "seed 0" in out.output
    assert "seed 1" in out.output
    assert "gpufed against first-admit, seed by seed" in out.output
    assert "16 GPUs (x)" in out.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seeds", "x"], "'x' is not a seed"),
        (["--seeds", "0-1", "--seed", "3"], "give --seed or --seeds, not both"),
        (["--seeds", "0-1", "--plot", "p.png"], "writes one run"),
        (["--seeds", "0-1", "--jobs-out", "j.csv"], "writes one run"),
    ],
)
def test_the_cli_refuses_bad_seed_flags(tmp_path: Path, extra: list[str], message: str) -> None:
    out = CliRunner().invoke(app, [*_files(tmp_path), *extra])
    assert out.exit_code == 2
    assert message in out.output
    assert not (tmp_path / "p.png").exists()
