"""`kubectl explain` is complete: every field of every generated CRD schema (apiVersion and
kind included; metadata is the API server's ObjectMeta) has a description, generated from the
pydantic models in api/ (attribute docstrings, Field descriptions, class docstrings)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.api.crdgen import all_crds


def fields(schema: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """(dotted path, schema) of every field below ``schema``: properties, list items'
    properties and map values' properties."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name, sub in schema.get("properties", {}).items():
        out.append((f"{path}.{name}", sub))
        out += fields(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        out += fields(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += fields(schema["additionalProperties"], f"{path}{{}}")
    return out


CRDS = all_crds()


@pytest.mark.parametrize("name", sorted(CRDS))
def test_every_field_of_the_crd_has_a_description(name: str) -> None:
    crd = CRDS[name]
    kind = crd["spec"]["names"]["kind"]
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert root.get("description"), f"{kind} has no description"
    every = [(p, s) for p, s in fields(root, kind) if p != f"{kind}.metadata"]
    assert len(every) > 20
    missing = [p for p, s in every if not str(s.get("description", "")).strip()]
    assert not missing, f"{len(missing)} fields without a description: {', '.join(missing)}"
