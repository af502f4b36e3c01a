"""The monitoring bundle (manifests/monitoring/) names only metrics gpufed exports: every series
a rule or dashboard query reads is on a fresh hub's or agent's registry, every alert has a
firing case in rules_test.yaml, and every dashboard is well-formed Grafana JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from gpufed.agent.metrics import AgentMetrics
from gpufed.hub.components.metrics import HubMetrics

MONITORING = Path(__file__).resolve().parents[2] / "manifests" / "monitoring"
#: A metric name inside a PromQL expression (label names and functions are not followed by
#: these prefixes).
_METRIC = re.compile(r"\b((?:gpufed|process|python)_[a-zA-Z0-9_]+)")


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(MONITORING.glob("dashboards/*.json"))}


def dashboard_queries() -> list[str]:
    return [t["expr"] for d in dashboards().values() for p in d["panels"] for t in p["targets"]]


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((MONITORING / "rules.yaml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def exported() -> set[str]:
    """Every sample name a fresh hub and agent can export (histogram and counter suffixes
    included)."""
    names: set[str] = set()
    for metrics in (HubMetrics(), AgentMetrics()):
        for family in metrics.registry.collect():
            names.add(family.name)
            kind = family.type
            if kind == "counter":
                names.add(f"{family.name}_total")
            if kind == "histogram":
                names.update(f"{family.name}_{s}" for s in ("bucket", "sum", "count"))
    return names


def test_every_series_the_bundle_reads_is_exported() -> None:
    known = exported()
    exprs = [r["expr"] for r in rules()] + dashboard_queries()
    used = {m for e in exprs for m in _METRIC.findall(e)}
    assert used, "the bundle reads no metric at all"
    assert sorted(used - known) == [], "queries for metrics gpufed does not export"


def test_every_alert_has_a_firing_case_in_rules_test() -> None:
    tests = yaml.safe_load((MONITORING / "rules_test.yaml").read_text())["tests"]
    firing = {
        case["alertname"]
        for t in tests
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    alerts = {r["alert"] for r in rules()}
    assert sorted(alerts - firing) == []
    assert all(r["labels"]["severity"] in {"info", "warning", "critical"} for r in rules())


def test_dashboards_are_grafana_json_with_unique_ids_and_a_datasource_variable() -> None:
    found = dashboards()
    assert set(found) == {"gpufed-fleet.json", "gpufed-scheduling.json"}
    uids = [d["uid"] for d in found.values()]
    assert len(set(uids)) == len(uids)
    for name, d in found.items():
        ids = [p["id"] for p in d["panels"]]
        assert len(set(ids)) == len(ids), name
        assert [v["name"] for v in d["templating"]["list"]] == ["datasource"], name
        for p in d["panels"]:
            assert p["targets"], f"{name}: panel {p['title']!r} has no query"
            assert all(t["expr"].strip() for t in p["targets"]), name
