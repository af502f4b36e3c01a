"""The committed CRDs are exactly what the pydantic models generate, and are structural."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from gpufed.api.crdgen import all_crds, structural_schema

ROOT = Path(__file__).resolve().parents[3]


def _gen_crds() -> Any:
    spec = importlib.util.spec_from_file_location("gen_crds", ROOT / "scripts" / "gen_crds.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_crds"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("where", ["manifests/crds", "charts/gpufed-hub/crds"])
def test_committed_crds_match_the_models(where: str) -> None:
    """Both committed copies (kubectl/kustomize and the Helm chart's crds/) are generated."""
    rendered = _gen_crds().render()
    committed = {p.name for p in (ROOT / where).glob("*.yaml")}
    assert committed == set(rendered), f"CRD files added or removed in {where}: run make crds"
    stale = [name for name, text in rendered.items() if (ROOT / where / name).read_text() != text]
    assert not stale, f"stale CRDs {stale} in {where}: run make crds and commit"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for k, v in node.get("properties", {}).items():
            out.extend(_walk(v, f"{path}.{k}"))
        if isinstance(node.get("items"), dict):
            out.extend(_walk(node["items"], f"{path}[]"))
        if isinstance(node.get("additionalProperties"), dict):
            out.extend(_walk(node["additionalProperties"], f"{path}{{}}"))
    return out


@pytest.mark.parametrize("name", sorted(all_crds()))
def test_schemas_are_structural(name: str) -> None:
    """Every node has a type (or preserves unknown fields); no $ref, anyOf or uniqueItems."""
    schema = all_crds()[name]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "uniqueItems", "title", "$defs"):
            assert banned not in node, f"{path} has {banned}"


def test_optional_fields_become_plain_types_and_drop_null_defaults() -> None:
    class Inner(BaseModel):
        x: int = 1

    class Outer(BaseModel):
        a: str | None = None
        b: Inner | None = None

    schema = structural_schema(Outer)
    assert schema["properties"]["a"] == {"type": "string"}
    assert schema["properties"]["b"]["properties"]["x"] == {"default": 1, "type": "integer"}


def test_unions_of_two_types_are_refused_with_the_field_named() -> None:
    class Bad(BaseModel):
        a: int | str

    with pytest.raises(ValueError, match=r"Bad\.a"):
        structural_schema(Bad)


def test_gpujob_has_printer_columns_and_cel_rules() -> None:
    version = all_crds()["gpufed.io_gpujobs.yaml"]["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]][:4] == [
        "Phase",
        "GPUs",
        "Cluster",
        "Age",
    ]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert any(r["rule"] == "self == oldSelf" for r in spec["x-kubernetes-validations"])
    assert spec["properties"]["template"]["x-kubernetes-embedded-resource"] is True
