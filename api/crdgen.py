"""CustomResourceDefinitions generated from the pydantic models (the one schema source).

``scripts/gen_crds.py`` writes :func:`all_crds` to ``manifests/crds/``; a unit test fails when
the committed files drift from the models. The hub and ``gpufed hub install`` apply the same
objects.

Pydantic's JSON Schema is turned into a Kubernetes *structural* schema:

- ``$ref`` is inlined (CRDs reject references), keeping sibling keys such as CEL rules;
- ``Optional[X]`` (``anyOf: [X, null]``) becomes ``X``: absent means unset;
- ``title`` and ``null`` defaults are dropped, ``const`` becomes a one-value ``enum``;
- ``dict[str, Any]`` becomes ``x-kubernetes-preserve-unknown-fields`` (no schema for it);
- ``uniqueItems`` (refused by the API server) is dropped: use ``x-kubernetes-list-type: set``;
- reStructuredText double backticks in descriptions become single ones for ``kubectl explain``.

Every other keyword (``enum``, ``maxItems``, ``pattern``, ``minimum``, ``default``,
``x-kubernetes-*``) passes through unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from gpufed.api import gpujob, membercluster, queue
from gpufed.api.labels import GROUP, VERSION

_DROP = frozenset({"title", "uniqueItems", "discriminator", "examples"})

#: The descriptions Kubernetes gives ``apiVersion`` and ``kind`` (``metav1.TypeMeta``).
API_VERSION_DESCRIPTION = (
    "APIVersion defines the versioned schema of this representation of an object. Servers "
    "should convert recognized schemas to the latest internal value, and may reject "
    "unrecognized values. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"
)
KIND_DESCRIPTION = (
    "Kind is a string value representing the REST resource this object represents. Servers "
    "may infer this from the endpoint the client submits requests to. Cannot be updated. In "
    "CamelCase. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"
)


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of ``model`` (camelCase names, refs inlined).

    Raises ``ValueError`` when the model holds a construct a CRD cannot express (a union of
    two different non-null types).
    """
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema: dict[str, Any] = _convert(raw, defs, path=model.__name__)
    return schema


def _convert(node: Any, defs: dict[str, Any], *, path: str) -> Any:
    if isinstance(node, list):
        return [_convert(v, defs, path=f"{path}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        name = node.pop("$ref").rsplit("/", 1)[-1]
        node = {**copy.deepcopy(defs[name]), **node}
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {**node.pop("allOf")[0], **node}
        return _convert(node, defs, path=path)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o != {"type": "null"}]
        if len(options) != 1:
            raise ValueError(f"{path}: a union of several types cannot be a structural schema")
        node = {**options[0], **{k: v for k, v in node.items() if k != "default"}}
        if "$ref" in node or "allOf" in node or "anyOf" in node:
            return _convert(node, defs, path=path)
    if node.get("default", "") is None:
        del node["default"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("additionalProperties") is True:
        del node["additionalProperties"]
        node["x-kubernetes-preserve-unknown-fields"] = True
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "description" and isinstance(value, str):
            out[key] = _reflow(value.replace("``", "`"))
        elif key == "properties":
            out[key] = {k: _convert(v, defs, path=f"{path}.{k}") for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _convert(value, defs, path=f"{path}[]")
        elif key == "default" and isinstance(value, dict | list):
            out[key] = copy.deepcopy(value)
        else:
            out[key] = value
    return out


def _reflow(text: str) -> str:
    """Docstring paragraphs as single lines (``kubectl explain`` wraps them itself)."""
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


def _resource_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = structural_schema(model)
    props = schema["properties"]
    # The API server owns these three: plain types, no generated constraints; the
    # descriptions are Kubernetes' own (TypeMeta, ObjectMeta).
    props["apiVersion"] = {"type": "string", "description": API_VERSION_DESCRIPTION}
    props["kind"] = {"type": "string", "description": KIND_DESCRIPTION}
    props["metadata"] = {"type": "object"}
    schema["required"] = [r for r in schema.get("required", []) if r not in ("metadata",)]
    return schema


def crd(
    model: type[BaseModel],
    *,
    kind: str,
    plural: str,
    scope: str,
    short_names: list[str],
    printer_columns: list[dict[str, Any]],
) -> dict[str, Any]:
    """One ``apiextensions.k8s.io/v1`` CustomResourceDefinition for ``model``."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["gpufed"],
            },
            "scope": scope,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer_columns,
                    "schema": {"openAPIV3Schema": _resource_schema(model)},
                }
            ],
        },
    }


def all_crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD object, for every gpufed custom resource."""
    return {
        f"{GROUP}_{gpujob.PLURAL}.yaml": crd(
            gpujob.GPUJob,
            kind=gpujob.KIND,
            plural=gpujob.PLURAL,
            scope="Namespaced",
            short_names=["gj"],
            printer_columns=gpujob.PRINTER_COLUMNS,
        ),
        f"{GROUP}_{membercluster.PLURAL}.yaml": crd(
            membercluster.MemberCluster,
            kind=membercluster.KIND,
            plural=membercluster.PLURAL,
            scope="Cluster",
            short_names=["mc"],
            printer_columns=membercluster.PRINTER_COLUMNS,
        ),
        f"{GROUP}_{queue.PLURAL}.yaml": crd(
            queue.GPUQueue,
            kind=queue.KIND,
            plural=queue.PLURAL,
            scope="Cluster",
            short_names=["gq"],
            printer_columns=queue.PRINTER_COLUMNS,
        ),
    }
