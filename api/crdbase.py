"""The base every gpufed CRD model shares: camelCase wire names, ``metadata``, timestamps, conditions.

:class:`CRDModel` (the base class), :class:`ObjectMeta` (the parts of ``metadata`` gpufed reads),
:data:`DateTime` (RFC 3339 strings) and :class:`StatusCondition` (a ``metav1.Condition``, with
the KEP-1623 patterns the hub's writer enforces). Split out of :mod:`gpufed.api.gpujob`, which
still re-exports every name, so that GPUJob (:mod:`gpufed.api.gpujob`, its status in
:mod:`gpufed.api.jobstatus`), MemberCluster and GPUQueue build on one base.

Who uses it: the CRD models in ``api/``; the hub's condition writer (``hub/rules/status.py``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

#: RFC 3339 timestamps, as Kubernetes writes them (``2026-01-02T03:04:05Z``; the hub also
#: writes fractional seconds where latency matters).
DateTime = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


class CRDModel(BaseModel):
    """Base of every CRD model: camelCase names on the wire, unknown fields ignored.

    Unknown fields are ignored (not refused) because the API server prunes them already and a
    newer CRD may carry fields an older hub does not know. Every field of a CRD model carries a
    description (its attribute docstring, or ``Field(description=...)``, or for an object the
    class docstring); ``tests/unit/hub/test_crd_descriptions.py`` fails naming any that lacks
    one.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        # A field's docstring (the string right under it) is its description in the CRD
        # schema, which is what `kubectl explain` prints.
        use_attribute_docstrings=True,
    )

    def to_k8s(self) -> dict[str, Any]:
        """The object as the API server expects it (camelCase, ``None`` fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# --- metadata (read side only; the CRD schema leaves metadata to the API server) ----------------


class ObjectMeta(CRDModel):
    """The parts of ``metadata`` gpufed reads (the API server owns validation of metadata)."""

    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    finalizers: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


# --- conditions ---------------------------------------------------------------------------------


#: ``metav1.Condition`` validation (KEP-1623): a condition type is an optional DNS-subdomain
#: prefix and a CamelCase name; a reason is CamelCase (letters, digits, ``_``, ``,``, ``:``).
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


_CONDITION_REQUIRED = ("type", "status", "reason", "message", "lastTransitionTime")


def _required_condition_fields(schema: dict[str, Any]) -> None:
    """The schema requires what KEP-1623 requires (the model has lenient defaults)."""
    schema["required"] = list(_CONDITION_REQUIRED)
    for name in _CONDITION_REQUIRED:
        schema["properties"][name].pop("default", None)


class StatusCondition(CRDModel):
    """One entry of ``status.conditions``: a Kubernetes ``metav1.Condition`` (KEP-1623).

    ``type``, ``status``, ``reason``, ``message`` (may be empty) and ``lastTransitionTime`` are
    required by the schema, as in ``metav1.Condition``;
    the hub's writer (``hub/rules/status.py`` ``set_condition``) always fills them, and turns a
    member's free-text or empty reason into a CamelCase one. The model itself reads
    leniently (defaults, no patterns) so that a status written by an older hub still loads.
    """

    model_config = ConfigDict(json_schema_extra=_required_condition_fields)

    type: str = Field(
        min_length=1,
        max_length=316,
        description="Type of the condition, CamelCase, optionally prefixed by a DNS "
        "subdomain and `/` (the types of each resource are listed under its "
        "`status.conditions`).",
        json_schema_extra={"pattern": CONDITION_TYPE_PATTERN},
    )
    status: Literal["True", "False", "Unknown"] = Field(
        description="Whether the condition holds: `True`, `False` or `Unknown`."
    )
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="The `metadata.generation` of the object this condition was computed from.",
    )
    reason: str = Field(
        default="",
        max_length=1024,
        description="Why the condition last changed: one CamelCase word, for machines "
        "(e.g. `Unschedulable`, `Succeeded`, `BackoffLimitExceeded`).",
        json_schema_extra={"minLength": 1, "pattern": CONDITION_REASON_PATTERN},
    )
    message: str = Field(
        default="",
        max_length=32768,
        description="Details for people; may be empty.",
    )
    last_transition_time: DateTime | None = Field(
        default=None,
        description="When `status` last changed (RFC 3339).",
    )
