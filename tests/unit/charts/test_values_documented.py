"""Every value of each Helm chart (charts/*/values.yaml) is documented in that chart's
README.md values table, and the README documents no value the chart does not have."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

CHARTS = Path(__file__).resolve().parents[3] / "charts"
#: Values that are Kubernetes objects or free-form maps: documented as one row, not per key.
FREE_FORM = frozenset(
    {
        "resources",
        "podAnnotations",
        "podLabels",
        "podSecurityContext",
        "securityContext",
        "nodeSelector",
        "affinity",
        "livenessProbe",
        "readinessProbe",
        "labels",
        "annotations",
    }
)


def value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in FREE_FORM:
            out += value_paths(value, f"{path}.")
        else:
            out.append(path)
    return out


@pytest.mark.parametrize("chart", ["gpufed-hub", "gpufed-agent"])
def test_every_value_has_a_row_in_the_readme(chart: str) -> None:
    values = yaml.safe_load((CHARTS / chart / "values.yaml").read_text())
    readme = (CHARTS / chart / "README.md").read_text()
    rows = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", readme, re.M))
    paths = set(value_paths(values))
    assert sorted(paths - rows) == [], f"values without a row in charts/{chart}/README.md"
    assert sorted(rows - paths) == [], f"rows in charts/{chart}/README.md for no value"
