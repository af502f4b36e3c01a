"""The pure parts of `gpufed bench e2e` and its `--compare`: the fleet sizing, the job
manifests each system is given, percentiles, the API servers' request counter as parsed from
`/metrics`, the ratios, and the CLI's refusals (nothing starts)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufed.cli.main import app
from gpufed.sandbox import e2e_compare
from gpufed.sandbox.apimetrics import (
    counter_total,
    counts_deltas,
    request_counts_of,
    request_deltas,
)
from gpufed.sandbox.e2e_bench import bench_fleet, gpufed_result, gpujob, job_sizes
from gpufed.sandbox.e2e_compare import (
    check_peer,
    kueue_job,
    multikueue_system,
    ratio,
    ratios,
)
from gpufed.sandbox.e2e_harness import (
    Clock,
    is_complete,
    job_names,
    per_job,
    percentile_ms,
    requests_by_kind,
)
from gpufed.sandbox.multikueue import MultiKueueInfo

METRICS = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",verb="GET",resource="jobs"} 12
apiserver_request_total{code="201",component="apiserver",verb="POST",resource="jobs"} 3.5e1
apiserver_request_total{code="200",dry_run="",scope="x {y}",verb="WATCH"} 2 1700000000000
apiserver_request_total 1
apiserver_request_total_bogus{code="200"} 1000
apiserver_request_duration_seconds_count{verb="GET"} 999
"""


def test_the_bench_fleet_holds_every_job_at_once() -> None:
    sizes = job_sizes(200, seed=1)
    assert sizes == job_sizes(200, seed=1)  # seeded
    assert set(sizes) <= set(range(1, 9))
    fleet = bench_fleet(sizes, members=2)
    gpus = sum(c.node_count * 8 for c in fleet.clusters)
    assert gpus >= sum(sizes) * 1.2
    assert [c.name for c in fleet.clusters] == ["bench-0", "bench-1"]


def test_bench_jobs_and_percentiles() -> None:
    job = gpujob("job-00001", 3, 2.0)
    pod = job["spec"]["template"]["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"gpufed.io/sim-duration": "2s"}
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 3}
    assert percentile_ms([], 0.5) is None
    values = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    assert percentile_ms(values, 0.5) == 50.0
    assert percentile_ms(values, 0.99) == 99.0
    assert job_names(3) == ["job-00000", "job-00001", "job-00002"]


def test_a_kueue_job_carries_the_same_job_spec_as_the_gpujob_plus_its_queue() -> None:
    gj = gpujob("job-00007", 5, 3.0)
    kj = kueue_job("job-00007", 5, 3.0, namespace="bench", local_queue="lq")
    assert (kj["apiVersion"], kj["kind"]) == ("batch/v1", "Job")
    assert kj["metadata"] == {
        "name": "job-00007",
        "namespace": "bench",
        "labels": {"kueue.x-k8s.io/queue-name": "lq"},
    }
    spec = dict(kj["spec"])
    assert spec.pop("suspend") is True  # Kueue admits by unsuspending
    assert spec == gj["spec"]["template"]["spec"]  # same pod template, annotation included


def test_the_multikueue_system_watches_jobs_of_its_namespace_and_counts_the_kueue_managers() -> (
    None
):
    mk = MultiKueueInfo(
        namespace="work", local_queue="lq", components=["kueue/hub", "kueue/bench-0"]
    )
    system = multikueue_system(mk, "multikueue_fast")
    assert system.name == "multikueue_fast"
    assert (system.hub.group, system.hub.plural, system.hub.namespace) == ("batch", "jobs", "work")
    assert system.member == system.hub
    assert system.components == ("kueue/hub", "kueue/bench-0")
    job = system.manifest("job-00001", 2, 1.0)
    assert job["metadata"]["namespace"] == "work"
    assert job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "lq"}


def test_the_request_counter_sums_every_label_set_and_nothing_else() -> None:
    # 12 + 35 + 2 (timestamp ignored, brace inside a quoted value) + 1 (no labels)
    assert counter_total(METRICS) == 50.0
    assert counter_total("# only comments\n") == 0.0
    assert counter_total(METRICS, "apiserver_request_duration_seconds_count") == 999.0


@pytest.mark.parametrize(
    "line", ['apiserver_request_total{code="200"} x', 'apiserver_request_total{code="200" 1']
)
def test_a_broken_sample_of_the_counter_is_an_error_naming_it(line: str) -> None:
    with pytest.raises(ValueError, match="apiserver_request_total"):
        counter_total(line)


def test_requests_are_counted_by_kind_and_code() -> None:
    text = (
        METRICS
        + 'apiserver_request_total{code="409",verb="PATCH",resource="gpujobs",'
        + 'subresource="status",x="a\\"b,c=\\"d"} 3\n'
        + 'apiserver_request_total{code="200",verb="PATCH",resource="gpujobs",subresource="status"} 7\n'
    )
    assert request_counts_of(text) == {
        ("GET jobs", "200"): 12.0,
        ("POST jobs", "201"): 35.0,
        ("WATCH -", "200"): 2.0,
        ("- -", "-"): 1.0,
        ("PATCH gpujobs/status", "409"): 3.0,
        ("PATCH gpujobs/status", "200"): 7.0,
    }
    with pytest.raises(ValueError, match="apiserver_request_total"):
        request_counts_of("apiserver_request_total{code=200} 1")


def test_the_per_job_table_sums_codes_and_shows_every_error_row() -> None:
    before = {"hub": {("PATCH gpujobs/status", "200"): 5.0}, "m": {("GET pods", "200"): 50.0}}
    after = {
        "hub": {
            ("PATCH gpujobs/status", "200"): 45.0,
            ("PATCH gpujobs/status", "409"): 2.0,
            ("GET gpujobs", "200"): 2.0,
            ("POST events", "201"): 40.0,
            ("GET leases", "200"): 0.5,
        },
        "m": {("GET pods", "200"): 4.0},  # restarted: counts from zero
    }
    deltas = counts_deltas(before, after)
    assert deltas["m"] == {("GET pods", "200"): 4.0}
    table = requests_by_kind(deltas, 20)
    assert table["hub"] == {
        "PATCH gpujobs/status": 2.1,
        "POST events": 2.0,
        "GET gpujobs": 0.1,
        "PATCH gpujobs/status 409": 0.1,
    }  # GET leases (0.025/job) is under the floor; the 409 row would be shown anyway
    assert list(table["hub"])[:2] == ["PATCH gpujobs/status", "POST events"]
    # a rare error is shown although its kind's total is under the floor
    assert requests_by_kind({"hub": {("PATCH x", "422"): 1.0}}, 100) == {
        "hub": {"PATCH x 422": 0.01}
    }


def test_request_deltas_count_a_restarted_api_server_from_zero() -> None:
    assert request_deltas({"hub": 100, "m": 50}, {"hub": 130, "m": 7}) == {"hub": 30, "m": 7}


def test_ratios_are_ours_over_the_fast_peer_and_none_without_a_figure() -> None:
    ours = {"dispatch_p99_ms": 100.0, "status_p99_ms": 300.0, "cpu_per_job_ms": 5.0}
    theirs = {"dispatch_p99_ms": 400.0, "status_p99_ms": 0.0, "cpu_per_job_ms": 20.0}
    assert ratios(ours, theirs) == {
        "dispatch_p99": 0.25,
        "status_p99": None,  # division by zero
        "cpu_per_job": 0.25,
        "api_requests_per_job": None,  # missing on both
    }
    assert ratio(None, 1.0) is None
    assert ratio(1.0, 3.0) == 0.333


def test_per_job_figures() -> None:
    assert per_job(1.5, 3, 1000.0) == 500.0
    assert per_job(7, 0) is None


def test_the_clock_keeps_first_sightings_and_pairs_latencies() -> None:
    clock = Clock()
    clock.first(clock.created, "bench/a", 1.0)
    clock.first(clock.created, "bench/a", 5.0)  # a later event does not move it
    clock.first(clock.dispatched, "bench/a", 1.25)
    clock.first(clock.created, "bench/b", 2.0)  # never dispatched: left out
    clock.first(clock.member_complete, "bench/a", 4.0)
    clock.first(clock.hub_complete, "bench/a", 4.5)
    assert clock.last_event == 4.5
    assert clock.latencies({"bench/a", "bench/b"}) == ([0.25], [0.5])


def test_complete_means_a_true_complete_condition() -> None:
    assert is_complete({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    assert not is_complete({"status": {"conditions": [{"type": "Complete", "status": "False"}]}})
    assert not is_complete({"status": None})


def test_the_gpufed_result_names_hub_and_agent_memory() -> None:
    info: Any = SimpleNamespace(members=["bench-0", "bench-1"])
    out = gpufed_result({"jobs": 1, "rss_mib": {"hub": 150, "agent/bench-0": 140}}, info)
    assert out == {"jobs": 1, "hub_rss_mib": 150, "agents_rss_mib": {"bench-0": 140, "bench-1": 0}}


def test_an_unknown_peer_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match=r"--compare 'kueue'.*multikueue"):
        check_peer("kueue")
    result = CliRunner().invoke(app, ["bench", "e2e", "--compare", "karmada", "--json"])
    assert result.exit_code == 2
    assert "--compare" in result.output
    assert "multikueue" in result.output


def test_compare_refuses_keep() -> None:
    result = CliRunner().invoke(app, ["bench", "e2e", "--compare", "multikueue", "--keep"])
    assert result.exit_code == 2
    assert "--keep" in result.output


def test_compare_runs_gpufed_then_multikueue_default_then_fast_each_in_its_own_sandbox(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The driver's order and wiring (sandboxes, Kueue and the harness replaced by recorders):
    one fresh sandbox per run, gpufed with its control plane, MultiKueue on clusters only with
    default then 1000/1000 client QPS, and the ratios taken against the fast run."""
    events: list[tuple[str, Any]] = []
    info: Any = SimpleNamespace(members=["bench-0", "bench-1"])

    class Recorder:
        def __init__(self, state_dir: Path | None) -> None:
            self.state_dir = state_dir

        def up(self, fleet: Any, control_plane: Any = None) -> Any:
            events.append(("up", (self.state_dir, control_plane is not None)))
            return info

    @contextlib.contextmanager
    def sandbox(state_dir: Path | None, **_kw: Any) -> Iterator[Recorder]:
        yield Recorder(state_dir)

    def kueue(_sb: Any, _info: Any, *, namespace: str, options: Any, progress: Any) -> Any:
        events.append(("kueue", (options.qps, options.burst)))
        return MultiKueueInfo(namespace=namespace, local_queue="lq", components=["kueue/hub"])

    p99 = {"gpufed": 100.0, "multikueue": 9000.0, "multikueue_fast": 400.0}

    async def timed(_sb: Any, _info: Any, system: Any, sizes: list[int], *_a: Any, **kw: Any):
        events.append(("measure", (system.name, len(sizes), kw["trace"])))
        return {
            "dispatch_p99_ms": p99[system.name],
            "status_p99_ms": 10.0,
            "cpu_per_job_ms": 1.0,
            "api_requests_per_job": 20.0,
            "rss_mib": {},
        }

    monkeypatch.setattr(e2e_compare, "fresh_sandbox", sandbox)
    monkeypatch.setattr(e2e_compare, "start_multikueue", kueue)
    monkeypatch.setattr(e2e_compare, "measure", timed)
    out = e2e_compare.run_compare(jobs=7, state_dir=tmp_path, trace=tmp_path / "t.jsonl")

    assert list(out) == ["gpufed", "multikueue", "multikueue_fast", "ratio"]
    assert events == [
        ("up", (tmp_path / "gpufed", True)),
        ("measure", ("gpufed", 7, tmp_path / "t.gpufed.jsonl")),
        ("up", (tmp_path / "multikueue", False)),
        ("kueue", (None, None)),
        ("measure", ("multikueue", 7, tmp_path / "t.multikueue.jsonl")),
        ("up", (tmp_path / "multikueue_fast", False)),
        ("kueue", (1000, 1000)),
        ("measure", ("multikueue_fast", 7, tmp_path / "t.multikueue_fast.jsonl")),
    ]
    assert out["ratio"] == {
        "dispatch_p99": 0.25,
        "status_p99": 1.0,
        "cpu_per_job": 1.0,
        "api_requests_per_job": 1.0,
    }
    assert "hub_rss_mib" in out["gpufed"]
