"""``gpufed hub`` flag checks: a bad value fails naming the flag, before any side effect (no CA
in --data-dir, no kubeconfig read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpufed.cli import hub as hub_cli
from gpufed.cli import kube
from gpufed.cli.main import app
from gpufed.hub.components.config import HubConfig


@pytest.fixture(autouse=True)
def no_kubeconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the kubeconfig was read before the flags were checked")

    monkeypatch.setattr(kube, "resolve", refuse)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--queue-order", "bogus"], "Invalid value for --queue-order: use smallest-first or fifo"),
        (["--queue-oldest-first", "-5"], "Invalid value for --queue-oldest-first: must be >= 0"),
        (["--queue-max-holds", "-1"], "Invalid value for --queue-max-holds: must be >= 0"),
        (["--queue-starvation", "-1"], "Invalid value for --queue-starvation: must be >= 0"),
        (
            ["--queue-holds-per-shape", "0"],
            "Invalid value for --queue-holds-per-shape: must be >= 1",
        ),
        (
            ["--queue-holds-per-shape", "65"],
            "Invalid value for --queue-holds-per-shape: must be <= 64",
        ),
        (["--queue-holds-per-shape", "two"], "--queue-holds-per-shape"),
        (["--queue-size-aging", "-1"], "Invalid value for --queue-size-aging: must be >= 0"),
        (["--queue-size-aging", "nan"], "Invalid value for --queue-size-aging"),
        (["--allocation", "pack"], "Invalid value for --allocation: use binpack or spread"),
        (["--default-pod-security", "open"], "Invalid value for --default-pod-security: use"),
        (["--member-lease", "0"], "Invalid value for --member-lease: must be > 0"),
        (["--preemption-deadline", "0"], "Invalid value for --preemption-deadline: must be > 0"),
        (["--leader-lease", "1"], "Invalid value for --leader-lease: must be >= 2"),
        (["--max-unacked", "0"], "Invalid value for --max-unacked: must be >= 1"),
        (["--etcd-prefix", "x/"], "--etcd-prefix: 'x/' must start and end with '/'"),
        (["--member-lost-timeout", "5"], "--member-lost-timeout (5.0) must be at least"),
        (["--origin", ""], "Invalid value for --origin: must not be empty"),
        (["--log-format", "xml"], "Invalid value for --log-format: use json or console"),
        (["--log-level", "loud"], "Invalid value for --log-level: use debug"),
        (["--pod-name", "p"], "--pod-name needs --pod-namespace"),
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        (["--listen", "host:grpc"], "Invalid value for --listen: 'host:grpc' is not host:port"),
        (["--http-listen", "x:99999"], "Invalid value for --http-listen: 'x:99999' is not"),
        (["--etcd", "etcd"], "Invalid value for --etcd: etcd endpoint 'etcd' is not host:port"),
        (
            ["--unlisted-namespaces", "deny"],
            "Invalid value for --unlisted-namespaces: use default-queue or reject",
        ),
        (
            ["--default-queue-max-priority", "2147483648"],
            "Invalid value for --default-queue-max-priority: must be <= 2147483647",
        ),
        (
            ["--default-queue-max-priority", "-2147483649"],
            "Invalid value for --default-queue-max-priority: must be >= -2147483648",
        ),
        (["--default-queue-max-priority", "high"], "--default-queue-max-priority"),
    ],
)
def test_a_bad_flag_names_the_flag_before_any_side_effect(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    data_dir = tmp_path / "hub"
    result = CliRunner().invoke(app, ["hub", "--data-dir", str(data_dir), *args])
    output = " ".join(result.output.split())  # rich wraps the usage box
    assert result.exit_code == 2, result.output
    assert expected in output
    assert "pydantic" not in output
    assert "validation error" not in output
    assert not data_dir.exists()  # no CA written first


def test_the_queue_help_says_seconds_and_the_default_in_hours() -> None:
    result = CliRunner().invoke(app, ["hub", "--help"], env={"COLUMNS": "240"})
    text = " ".join(result.output.replace("│", " ").split())
    assert "ahead of every younger job of its queue and priority" in text
    assert "[default: 16 h (57600 s)]" in text
    assert "issue 14" not in text


@pytest.mark.parametrize(
    ("args", "unlisted", "cap"),
    [
        ([], "default-queue", None),
        (
            ["--unlisted-namespaces", "reject", "--default-queue-max-priority", "1000"],
            "reject",
            1000,
        ),
        (["--default-queue-max-priority", "-2147483648"], "default-queue", -(2**31)),
        (["--default-queue-max-priority", "2147483647"], "default-queue", 2**31 - 1),
    ],
)
def test_the_unlisted_namespace_flags_reach_the_hub_config(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    unlisted: str,
    cap: int | None,
) -> None:
    """Defaults: today's behaviour (the default queue, no cap); the int32 bounds are accepted."""
    config = config_of(tmp_path, monkeypatch, args)
    assert (config.unlisted_namespaces, config.default_queue_max_priority) == (unlisted, cap)


@pytest.mark.parametrize(
    ("args", "per_shape", "aging"),
    [
        ([], 4, 1800.0),
        (["--queue-holds-per-shape", "1", "--queue-size-aging", "0"], 1, 0.0),
        (["--queue-holds-per-shape", "64", "--queue-size-aging", "3600"], 64, 3600.0),
    ],
)
def test_the_backfill_knobs_reach_the_hub_config_with_the_simulators_defaults(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    per_shape: int,
    aging: float,
) -> None:
    """--queue-holds-per-shape / --queue-size-aging reach HubConfig and its BackfillRule; the
    defaults are those ``gpufed simulate`` runs with (its flags of the same names)."""
    from typer.main import get_command

    from gpufed.placement.queue import BackfillRule

    rule = config_of(tmp_path, monkeypatch, args).backfill_rule
    assert (rule.holds_per_shape, rule.size_aging_s) == (per_shape, aging)
    if not args:
        sim = get_command(app).commands["simulate"]  # type: ignore[attr-defined]
        defaults = {p.name: p.default for p in sim.params}
        assert (defaults["holds_per_shape"], defaults["size_aging_s"]) == (4, 1800.0)
        assert defaults["carry_holds"] == ("on" if rule.carry_holds else "off")
        assert defaults["spare_whole_nodes_s"] == rule.spare_whole_nodes_s
        assert rule == BackfillRule()


def config_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> HubConfig:
    """The HubConfig ``gpufed hub ARGS`` builds, stopping before any side effect."""
    seen: list[HubConfig] = []
    validate = hub_cli._validate

    def first_check_only(values: dict[str, Any], *, insecure: bool) -> HubConfig:
        seen.append(validate(values, insecure=insecure))
        raise typer.Exit(0)  # stop before any side effect

    monkeypatch.setattr(hub_cli, "_validate", first_check_only)
    result = CliRunner().invoke(app, ["hub", "--data-dir", str(tmp_path / "hub"), *args])
    assert result.exit_code == 0, result.output
    (config,) = seen
    return config
