"""`gpufed get`'s shared printing (cli/output.py): -o formats, kubectl label selectors, and the
watch loop over recorded event streams (no API server, no sleeps)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufed.cli import output
from gpufed.cli.main import app
from tests.unit.cli.fake_api import kubeconfig, serving


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("team=a", "team=a"),
        ("team==a", "team=a"),
        ("team!=a", "team!=a"),
        ("tier in (gold, silver),gpu", "tier in (gold,silver),gpu"),
        ("tier notin (bronze),!spot", "tier notin (bronze),!spot"),
        ("gpufed.io/team=ml-infra", "gpufed.io/team=ml-infra"),
    ],
)
def test_kubectl_selectors_parse_to_the_canonical_string(text: str, canonical: str) -> None:
    assert output.parse_selector(text).text() == canonical


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("team=a", {"team": "a"}, True),
        ("team=a", {"team": "b"}, False),
        ("team!=a", {}, True),  # != holds for an absent key (Kubernetes semantics)
        ("tier in (gold,silver)", {"tier": "silver"}, True),
        ("tier notin (gold)", {}, True),
        ("tier notin (gold)", {"tier": "gold"}, False),
        ("gpu", {"gpu": ""}, True),
        ("!gpu", {"gpu": "h100"}, False),
        ("team=a,gpu", {"team": "a"}, False),  # ANDed
        ("", {"anything": "x"}, True),
    ],
)
def test_selectors_match_as_the_api_server_does(
    selector: str, labels: dict[str, str], matches: bool
) -> None:
    assert output.parse_selector(selector).matches(labels) is matches


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("team=a,", "empty requirement"),
        ("tier in (gold", "without its ')'"),
        ("tier in ()", "lists no values"),
        ("bad key=a", "not a requirement"),
        ("team=a b", "not a requirement"),
        ("-team=a", "not a label key"),
        ("team=-a", "not a label value"),
        ("k=" + "v" * 64, "not a label value"),
        (",".join(f"k{i}" for i in range(65)), "more than 64"),
        ("k" * 5000, "longer than 4096"),
    ],
)
def test_a_bad_selector_names_l_and_what_is_wrong(text: str, names: str) -> None:
    with pytest.raises(output.SelectorError, match="-l") as err:
        output.parse_selector(text)
    assert names in str(err.value)


ROWS = [
    {"name": "a", "phase": "Running", "note": "x"},
    {"name": "b", "phase": "Pending", "note": ""},
]
COLUMNS = (
    output.Column("NAME", lambda r: str(r["name"])),
    output.Column("PHASE", lambda r: str(r["phase"])),
    output.Column("NOTE", lambda r: str(r["note"]), wide=True),
)


def _render(fmt: output.Format) -> str:
    return output.render(ROWS, COLUMNS, fmt, name_of=lambda r: str(r["name"]), resource="thing.x")


def test_formats_print_the_same_rows_in_each_shape() -> None:
    assert _render("table").splitlines() == ["NAME   PHASE", "a      Running", "b      Pending"]
    assert _render("wide").splitlines()[0] == "NAME   PHASE     NOTE"
    assert json.loads(_render("json")) == ROWS
    assert yaml.safe_load(_render("yaml")) == ROWS
    assert _render("name").splitlines() == ["thing.x/a", "thing.x/b"]


def test_json_is_an_alias_of_o_json_and_disagreeing_flags_are_refused() -> None:
    assert output.output_format(None, True) == "json"
    assert output.output_format("json", True) == "json"
    assert output.output_format(None, False) == "table"
    with pytest.raises(Exception, match="disagree"):
        output.output_format("yaml", True)
    with pytest.raises(Exception, match="not one of"):
        output.output_format("xml", False)


# --- the watch loop -------------------------------------------------------------------------------


def _job(name: str, phase: str, rv: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "t", "resourceVersion": rv, "labels": labels or {}},
        "status": {"phase": phase},
    }


class FakeAPI:
    """A list, then recorded watch streams, one per watch request; records what was asked."""

    def __init__(self, items: list[dict[str, Any]], streams: list[list[dict[str, Any]]]) -> None:
        self.items = items
        self.streams = streams
        self.lists: list[str] = []
        self.watches: list[tuple[str, str, int]] = []
        self.now = 0.0

    def list_objects(self, selector: str) -> Mapping[str, Any]:
        self.lists.append(selector)
        return {"metadata": {"resourceVersion": "10"}, "items": self.items}

    def watch_objects(self, version: str, selector: str, timeout: int) -> Iterable[Any]:
        self.watches.append((version, selector, timeout))
        if not self.streams:
            self.now += timeout  # the request ran out on the server
            return []
        return self.streams.pop(0)


def _listing(api: FakeAPI, server_side: bool = True) -> output.Listing:
    return output.Listing(
        resource="gpujob.gpufed.io",
        columns=(
            output.Column("NAME", lambda r: str(r["name"])),
            output.Column("PHASE", lambda r: str(r["phase"])),
        ),
        rows=lambda objs: [
            {"name": o["metadata"]["name"], "phase": o["status"]["phase"]}
            for o in sorted(objs, key=lambda o: o["metadata"]["name"])
        ],
        list_objects=api.list_objects,
        watch_objects=api.watch_objects,
        empty="No GPUJobs.",
        server_side_selector=server_side,
        clock=lambda: api.now,
    )


def test_watch_prints_rows_as_they_change_and_a_deleted_row_a_last_time() -> None:
    api = FakeAPI(
        [_job("a", "Pending", "5")],
        [
            [
                {"type": "MODIFIED", "object": _job("a", "Pending", "11")},  # same row: silent
                {"type": "MODIFIED", "object": _job("a", "Running", "12")},
                {"type": "ADDED", "object": _job("b", "Pending", "13")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "14"}}},
                {"type": "DELETED", "object": _job("a", "Running", "15")},
            ]
        ],
    )
    lines: list[str] = []
    output.show(
        _listing(api),
        "table",
        output.Selector(),
        watch=True,
        watch_timeout_s=600,
        echo=lines.append,
    )
    text = "\n".join(lines).splitlines()
    assert text == [
        "NAME   PHASE",
        "a      Pending",
        "a      Running",
        "b      Pending",
        "a      Running",
    ]
    # resumed from the last resourceVersion seen (the bookmark's), each request bounded
    assert api.watches[0] == ("10", "", output.WATCH_REQUEST_S)
    assert api.watches[1][0] == "15"


def test_watch_in_json_prints_one_event_document_per_change() -> None:
    api = FakeAPI([], [[{"type": "ADDED", "object": _job("a", "Pending", "11")}]])
    lines: list[str] = []
    output.show(
        _listing(api), "json", output.Selector(), watch=True, watch_timeout_s=1, echo=lines.append
    )
    assert [json.loads(x) for x in lines] == [
        {"type": "ADDED", "object": {"name": "a", "phase": "Pending"}}
    ]


def test_a_410_gone_relists_and_prints_what_changed_meanwhile() -> None:
    api = FakeAPI(
        [_job("a", "Pending", "5")],
        [[{"type": "ERROR", "object": {"code": 410}}]],
    )
    lines: list[str] = []
    listing = _listing(api)
    calls = iter([[_job("a", "Pending", "5")], [_job("a", "Succeeded", "30")]])
    listing.list_objects = lambda sel: {  # type: ignore[method-assign]
        "metadata": {"resourceVersion": "30"},
        "items": next(calls),
    }
    output.show(
        listing, "table", output.Selector(), watch=True, watch_timeout_s=1, echo=lines.append
    )
    assert lines[-1] == "a      Succeeded"
    assert api.watches[-1][0] == "30"  # watched on from the new list's version


def test_a_selector_matched_here_filters_listed_and_watched_objects() -> None:
    api = FakeAPI(
        [_job("a", "Pending", "5", {"team": "x"}), _job("b", "Pending", "6", {"team": "y"})],
        [
            [
                {"type": "MODIFIED", "object": _job("b", "Running", "11", {"team": "y"})},
                # a relabelled object leaves the selection: printed a last time
                {"type": "MODIFIED", "object": _job("a", "Running", "12", {"team": "z"})},
            ]
        ],
    )
    lines: list[str] = []
    sel = output.parse_selector("team=x")
    output.show(
        _listing(api, server_side=False),
        "table",
        sel,
        watch=True,
        watch_timeout_s=1,
        echo=lines.append,
    )
    assert api.lists == [""]  # not sent: matched here
    assert "\n".join(lines).splitlines() == ["NAME   PHASE", "a      Pending", "a      Pending"]


def test_watch_timeout_ends_the_watch() -> None:
    api = FakeAPI([], [])
    lines: list[str] = []
    output.show(
        _listing(api), "table", output.Selector(), watch=True, watch_timeout_s=30, echo=lines.append
    )
    assert lines == ["No GPUJobs."]
    assert api.watches == [("10", "", 30)]


# --- through the CLI, against a one-route API server ---------------------------------------------

JOBS = {
    "kind": "GPUJobList",
    "metadata": {"resourceVersion": "1"},
    "items": [
        {
            "apiVersion": "gpufed.io/v1alpha1",
            "kind": "GPUJob",
            "metadata": {"name": "train", "namespace": "default", "labels": {"team": "a"}},
            "spec": {"template": {"kind": "Job"}},
            "status": {"phase": "Running", "cluster": "m1", "gpus": 8, "message": "ok"},
        }
    ],
}


@pytest.mark.parametrize(
    ("args", "check"),
    [
        (["--json"], lambda out: json.loads(out)[0]["cluster"] == "m1"),
        (["-o", "json"], lambda out: json.loads(out)[0]["gpus"] == 8),
        (["-o", "yaml"], lambda out: yaml.safe_load(out)[0]["phase"] == "Running"),
        (["-o", "name"], lambda out: out.strip() == "gpujob.gpufed.io/train"),
        (["-o", "wide"], lambda out: "MESSAGE" in out.splitlines()[0] and "ok" in out),
        (["-l", "team=a"], lambda out: out.splitlines()[1].split()[1] == "train"),
    ],
)
def test_get_jobs_prints_each_format(tmp_path: Path, args: list[str], check: Any) -> None:
    with serving(200, JOBS) as url:
        cfg = kubeconfig(tmp_path / "k", url)
        result = CliRunner().invoke(app, ["get", "jobs", "--kubeconfig", str(cfg), *args])
    assert result.exit_code == 0, result.output
    assert check(result.output)


def test_get_jobs_and_o_json_print_the_same_document(tmp_path: Path) -> None:
    with serving(200, JOBS) as url:
        cfg = kubeconfig(tmp_path / "k", url)
        a = CliRunner().invoke(app, ["get", "jobs", "--kubeconfig", str(cfg), "--json"]).output
        b = CliRunner().invoke(app, ["get", "jobs", "--kubeconfig", str(cfg), "-o", "json"]).output
    assert a == b


def test_a_bad_selector_is_a_usage_error_before_any_request(tmp_path: Path) -> None:
    cfg = kubeconfig(tmp_path / "k", "http://127.0.0.1:1")
    result = CliRunner().invoke(app, ["get", "clusters", "--kubeconfig", str(cfg), "-l", "a in (b"])
    assert result.exit_code == 2
    assert "without its ')'" in result.output


def test_a_row_whose_data_did_not_change_is_not_printed_again_when_its_age_moved_on() -> None:
    """kubectl prints the object that changed: AGE growing is not a change of the others."""
    api = FakeAPI(
        [_job("a", "Running", "5"), _job("b", "Pending", "6")],
        [[{"type": "MODIFIED", "object": _job("b", "Running", "11")}]],
    )
    listing = _listing(api)
    ticks = iter(range(1000))
    listing.columns = (*listing.columns, output.Column("AGE", lambda r: f"{next(ticks)}s"))
    lines: list[str] = []
    output.show(
        listing, "table", output.Selector(), watch=True, watch_timeout_s=1, echo=lines.append
    )
    watched = lines[1:]
    assert [line.split()[:2] for line in watched] == [["b", "Running"]]
    # the watched line keeps the first table's columns
    header = lines[0].splitlines()[0]
    assert watched[0].index("Running") == header.index("PHASE")
