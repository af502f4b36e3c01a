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


def test_the_hub_defaults_the_queue_rows_name_are_the_hubs() -> None:
    """A ``queues.*`` value left ``""`` renders no flag, so the hub's own default applies: the
    default each README row names is the ``gpufed hub`` default of the flag it names
    (HubConfig's), so the table cannot go stale when a hub default moves."""
    from gpufed.cli.hub import FLAG_OF
    from gpufed.hub.components.config import HubConfig

    field_of = {flag: f for f, flags in FLAG_OF.items() for flag in flags.split("/")}
    readme = (CHARTS / "gpufed-hub" / "README.md").read_text()
    rows = re.findall(
        r"^\| `(queues\.\w+)` \| `\"\"` \(the hub's default, ([^)]+)\) \| ([^|]+)", readme, re.M
    )
    assert len(rows) >= 10, rows
    for value, named, meaning in rows:
        flag = re.search(r"`(--[a-z-]+)`", meaning)
        assert flag is not None, value
        default = HubConfig.model_fields[field_of[flag.group(1)]].default
        text = named.split(":")[0].strip("` ")
        if isinstance(default, bool):
            assert text == str(default).lower(), value
        elif isinstance(default, (int, float)):
            assert float(text) == default, value
        else:
            assert text == default, value
