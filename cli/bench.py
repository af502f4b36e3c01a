"""``gpufed bench``: benchmarks that print one JSON line (``gpufed bench placement``, ``gpufed
bench e2e`` and its ``--compare multikueue``, ``gpufed bench scale``, ``gpufed bench soak``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from gpufed.placement.sim.bench import run_placement_bench, run_preemption_bench

app = typer.Typer(help="Benchmarks that print one JSON line.", no_args_is_help=True)


@app.command("placement")
def placement(
    clusters: int = typer.Option(10, "--clusters", min=1, help="Member clusters in the fleet."),
    nodes_per_cluster: int = typer.Option(
        500, "--nodes-per-cluster", min=1, help="Nodes in each member."
    ),
    decisions: int = typer.Option(2000, "--decisions", min=1, help="Jobs to place."),
    seed: int = typer.Option(1, "--seed", help="Seed of the synthetic fleet and job mix."),
    window: int | None = typer.Option(
        None,
        "--window",
        min=1,
        help="Live reservations before the oldest is released (default: ~5% of the GPUs).",
    ),
    queues: int = typer.Option(
        0,
        "--queues",
        min=0,
        max=10_000,
        help="Also run with a tree of N queues admitting by quota; prints both runs side by "
        "side (no_queues, with_queues) and the p99 ratio.",
    ),
    preemption: bool = typer.Option(
        False,
        "--preemption",
        help="Also run a full fleet (every GPU running a low-priority job) and a stream of "
        "higher-priority jobs, each decision place() then plan_preemption(); prints both "
        "runs side by side (no_preemption, with_preemption) and the p99 ratio.",
    ),
    dra: bool = typer.Option(
        False,
        "--dra",
        help="Also run with every other rack of the HGX members publishing its GPUs through "
        "DRA and 40% of "
        "the HGX jobs claiming through DRA (half with a CEL selector); prints both runs side "
        "by side (no_dra, with_dra) and the p99 ratio.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON line."),
) -> None:
    """Time place() over a seeded synthetic fleet (mixed HGX / NVL72, 50-80% occupied)."""
    if sum((preemption, bool(queues), dra)) > 1:
        raise typer.BadParameter("use one of --preemption, --queues and --dra at a time")
    result = run_placement_bench(clusters, nodes_per_cluster, decisions, seed, window=window)
    if preemption:
        with_p = run_preemption_bench(clusters, nodes_per_cluster, decisions, seed)
        result = _side_by_side("preemption", result, with_p)
    if queues:
        with_q = run_placement_bench(
            clusters, nodes_per_cluster, decisions, seed, window=window, queues=queues
        )
        result = _side_by_side("queues", result, with_q)
    if dra:
        with_dra = run_placement_bench(
            clusters, nodes_per_cluster, decisions, seed, window=window, dra=True
        )
        result = _side_by_side("dra", result, with_dra)
    if as_json:
        typer.echo(json.dumps(result))
        return
    for key, value in result.items():
        typer.echo(f"{key:>18}: {value}")


def _side_by_side(what: str, base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """``{no_<what>, with_<what>, p99_ratio, cpu_p99_ratio}`` of two runs."""
    return {
        f"no_{what}": base,
        f"with_{what}": other,
        "p99_ratio": round(other["p99_ms"] / base["p99_ms"], 3) if base["p99_ms"] else None,
        "cpu_p99_ratio": (
            round(other["cpu_p99_ms"] / base["cpu_p99_ms"], 3) if base["cpu_p99_ms"] else None
        ),
    }


@app.command("e2e")
def e2e(
    jobs: int = typer.Option(200, "--jobs", min=1, help="GPUJobs to submit (1-8 GPUs each)."),
    rate: float = typer.Option(25.0, "--rate", min=0.1, help="GPUJobs created per second."),
    duration: float = typer.Option(3.0, "--duration", min=0.0, help="Seconds each job runs."),
    members: int = typer.Option(2, "--members", min=1, help="Member clusters in the fleet."),
    seed: int = typer.Option(1, "--seed", help="Seed of the job sizes."),
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="Sandbox state dir (default: a temporary one, removed)."
    ),
    keep: bool = typer.Option(False, "--keep", help="Leave the sandbox running afterwards."),
    trace: Path | None = typer.Option(
        None, "--trace", help="Write each job's event times (wall clock) here, JSON lines."
    ),
    compare: str | None = typer.Option(
        None,
        "--compare",
        metavar="PEER",
        help="Also run the same job stream through PEER (multikueue: Kueue's MultiKueue, at "
        "default client QPS and at QPS/burst 1000), each in a fresh sandbox, one after the "
        "other; prints {gpufed, multikueue, multikueue_fast, ratio}. With --state-dir, each "
        "run uses a subdirectory; with --trace, each run its own file (t.gpufed.jsonl, ...).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON line."),
) -> None:
    """GPUJobs through a fresh sandbox with hub and agents: dispatch (GPUJob created on the hub
    -> its Job exists in the member) and status (member Job Complete -> GPUJob shows it)
    latencies from watch events on one clock, throughput, CPU and API requests per job, hub and
    agent memory."""
    from gpufed.cli.local import configure_logging, fail_cleanly

    configure_logging(False)

    def progress(msg: str) -> None:
        typer.echo(msg, err=True)

    if compare is not None:
        from gpufed.sandbox.e2e_compare import check_peer, run_compare

        try:
            check_peer(compare)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--compare") from None
        if keep:
            raise typer.BadParameter(
                "--keep leaves one sandbox running; --compare starts three one after the "
                "other (drop --keep, or run gpufed bench e2e without --compare)",
                param_hint="--keep",
            )
        with fail_cleanly():
            result = run_compare(
                compare,
                jobs,
                rate,
                duration_s=duration,
                members=members,
                seed=seed,
                state_dir=state_dir,
                progress=progress,
                trace=trace,
            )
        _print(result, as_json)
        return

    from gpufed.sandbox.e2e_bench import run_bench

    with fail_cleanly():
        result = run_bench(
            jobs,
            rate,
            duration_s=duration,
            members=members,
            seed=seed,
            state_dir=state_dir,
            keep=keep,
            progress=progress,
            trace=trace,
        )
    _print(result, as_json)


def _print(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result))
        return
    for key, value in result.items():
        typer.echo(f"{key:>18}: {value}")


@app.command("soak")
def soak(
    minutes: float = typer.Option(
        30.0, "--minutes", min=0.5, max=24 * 60, help="How long jobs stream and faults strike."
    ),
    seed: int = typer.Option(1, "--seed", help="Seed of the job stream and the fault schedule."),
    faults: str = typer.Option(
        "all",
        "--faults",
        help="Comma-separated fault kinds (leader-kill, leader-pause, agent-kill, etcd-restart, "
        "apiserver-stop, node-delete, kwok-stop, gpu-withdraw) or 'all'.",
    ),
    rate: float = typer.Option(
        6.0, "--rate", min=0.1, max=600, help="Jobs created per minute (Poisson)."
    ),
    drain: float = typer.Option(
        600.0, "--drain", min=0, max=86_400, help="Seconds to wait for every job to end."
    ),
    history: Path | None = typer.Option(
        None,
        "--history",
        help="Write the observed history here (JSON lines; default: a temp file).",
    ),
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="Sandbox state dir (default: a temporary one, removed)."
    ),
    keep: bool = typer.Option(False, "--keep", help="Leave the sandbox running afterwards."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON line."),
) -> None:
    """Chaos soak: a fresh sandbox with two hub replicas streams seeded jobs through GPUQueues
    while seeded faults strike; a checker that reads only the API servers reports submitted,
    succeeded, failed, lost, double_running, quota_overruns and recovery times per fault kind
    (docs/benchmarks.md, "Chaos soak"). Exit code 1 when lost, double_running or
    quota_overruns is not 0."""
    from gpufed.cli.local import configure_logging, fail_cleanly
    from gpufed.sandbox.faults import parse_kinds
    from gpufed.sandbox.soak import run_soak

    try:
        kinds = parse_kinds(faults)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--faults") from None
    configure_logging(False)
    with fail_cleanly():
        result = run_soak(
            minutes,
            seed,
            kinds=kinds,
            rate_per_min=rate,
            drain_s=drain,
            state_dir=state_dir,
            history=history,
            keep=keep,
            progress=lambda m: typer.echo(m, err=True),
        )
    _print(result, as_json)
    if result["lost"] or result["double_running"] or result["quota_overruns"]:
        raise typer.Exit(1)


@app.command("scale")
def scale(
    members: int = typer.Option(..., "--members", min=1, max=1000, help="Simulated members."),
    nodes_per_member: int = typer.Option(
        ..., "--nodes-per-member", min=1, max=15_000, help="Nodes each simulated agent reports."
    ),
    join_rate: float = typer.Option(
        10.0, "--join-rate", min=0.01, max=1000, help="Agents dialling the hub per second."
    ),
    jobs: int = typer.Option(
        2000, "--jobs", min=0, max=1_000_000, help="GPUJobs to submit (1-8 GPUs, seeded)."
    ),
    rate: float = typer.Option(
        25.0, "--rate", min=0.1, max=1000, help="GPUJobs created per second."
    ),
    churn: float = typer.Option(
        100.0,
        "--churn",
        min=0.0,
        max=100_000,
        help="Background pod starts per second across the fleet (each ends 10 s later).",
    ),
    duration: float = typer.Option(
        5.0, "--duration", min=0.0, max=86_400, help="Seconds each job runs."
    ),
    workers: int = typer.Option(
        4, "--workers", min=1, max=64, help="Processes the simulated agents run in."
    ),
    seed: int = typer.Option(1, "--seed", help="Seed of job sizes and churn."),
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="Sandbox state dir (default: a temporary one, removed)."
    ),
    keep: bool = typer.Option(False, "--keep", help="Leave the sandbox running afterwards."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON line."),
) -> None:
    """The hub at fleet scale: a real hub, its API server and etcd, and simulated agents over
    real gRPC (TLS, join tokens) reporting synthetic HGX and NVL72 nodes, with churn. Prints
    registration, dispatch, status and placement percentiles, hub peak RSS and etcd's db size
    (docs/benchmarks.md, "The hub at fleet scale"). Set GPUFED_SCALE_PROFILE=FILE to run the
    hub under cProfile."""
    from gpufed.cli.hubadmin import register_member
    from gpufed.cli.local import configure_logging, fail_cleanly
    from gpufed.sandbox.controlplane import TOKEN_NAMESPACE
    from gpufed.sandbox.scale_bench import ScaleOptions, run_scale_bench

    configure_logging(False)
    opts = ScaleOptions(
        members=members,
        nodes_per_member=nodes_per_member,
        join_rate=join_rate,
        jobs=jobs,
        rate=rate,
        churn=churn,
        duration_s=duration,
        workers=workers,
        seed=seed,
    )
    with fail_cleanly():
        result = run_scale_bench(
            opts,
            state_dir=state_dir,
            keep=keep,
            progress=lambda m: typer.echo(m, err=True),
            joiner=lambda api, name: register_member(api, name, token_namespace=TOKEN_NAMESPACE),
        )
    if as_json:
        typer.echo(json.dumps(result))
        return
    for key, value in result.items():
        typer.echo(f"{key:>22}: {value}")
