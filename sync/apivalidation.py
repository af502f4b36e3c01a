"""What a member's API server would certainly refuse in an object's metadata: the Kubernetes
validation rules for object names, label keys and values, annotation keys and total size.

Called by the hub's intake (:mod:`gpufed.hub.rules.admission`) over the prepared manifests of a
GPUJob, so a job whose objects a member would refuse fails at once, naming the field and the
rule, instead of being placed and then refused. Pure functions; no I/O. The rules are those of
Kubernetes' apimachinery validation (``IsDNS1123Subdomain``, ``IsDNS1123Label``,
``IsDNS1035Label``, ``IsQualifiedName``, ``IsValidLabelValue``, the 256 KiB annotation limit).

Only what is certain is checked: names as the kind requires them (a Service name is a DNS-1035
label; a batch/v1 Job name is a DNS-1123 subdomain of at most 63 characters, since it becomes
the ``batch.kubernetes.io/job-name`` label of its pods; every other kind a DNS-1123
subdomain), and the labels and annotations of every object and pod template. Names the member
derives (pod names, a JobSet's child Jobs) are not guessed at.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

#: Longest label value, and longest name part of a label or annotation key.
MAX_LABEL_VALUE: Final = 63
#: Longest DNS-1123 subdomain (object names, key prefixes).
MAX_SUBDOMAIN: Final = 253
#: Total size of an object's annotations, keys and values (bytes).
MAX_ANNOTATIONS_BYTES: Final = 256 * 1024

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL_RE = re.compile(f"^{_DNS1123_LABEL}$")
_DNS1123_SUBDOMAIN_RE = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_DNS1035_LABEL_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _rule_error(value: str, limit: int, pattern: re.Pattern[str], rule: str) -> str | None:
    if len(value) > limit:
        return f"must be no more than {limit} characters (has {len(value)})"
    return None if pattern.match(value) else f"must be {rule}"


def dns1123_subdomain_error(value: str) -> str | None:
    """Why ``value`` is not a DNS-1123 subdomain (None when it is)."""
    return _rule_error(
        value,
        MAX_SUBDOMAIN,
        _DNS1123_SUBDOMAIN_RE,
        "a DNS-1123 subdomain: lower case alphanumerics, '-' and '.', starting and ending with "
        "an alphanumeric (for example my-name or abc-123.example)",
    )


def dns1123_label_error(value: str) -> str | None:
    """Why ``value`` is not a DNS-1123 label (None when it is)."""
    return _rule_error(
        value,
        MAX_LABEL_VALUE,
        _DNS1123_LABEL_RE,
        "a DNS-1123 label: lower case alphanumerics and '-', starting and ending with an "
        "alphanumeric (for example my-name)",
    )


def dns1035_label_error(value: str) -> str | None:
    """Why ``value`` is not a DNS-1035 label (None when it is)."""
    return _rule_error(
        value,
        MAX_LABEL_VALUE,
        _DNS1035_LABEL_RE,
        "a DNS-1035 label: lower case alphanumerics and '-', starting with a letter and "
        "ending with an alphanumeric (for example my-name)",
    )


def qualified_name_error(key: str) -> str | None:
    """Why ``key`` is not a valid label or annotation key (``[prefix/]name``; None when it is)."""
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return "the prefix before '/' must not be empty"
    if prefix:
        why = dns1123_subdomain_error(prefix)
        if why is not None:
            return f"prefix {prefix!r} {why}"
    if not name:
        return "the name part must not be empty"
    if len(name) > MAX_LABEL_VALUE:
        return f"the name part must be no more than {MAX_LABEL_VALUE} characters (has {len(name)})"
    if not _QUALIFIED_NAME_RE.match(name):
        return (
            "the name part must be alphanumerics, '-', '_' or '.', starting and ending with an "
            "alphanumeric (for example MyName, my.name, 123-abc)"
        )
    return None


def label_value_error(value: str) -> str | None:
    """Why ``value`` is not a valid label value (None when it is)."""
    return _rule_error(
        value,
        MAX_LABEL_VALUE,
        _LABEL_VALUE_RE,
        "empty or alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric",
    )


def name_error(kind: str, name: str) -> str | None:
    """Why ``name`` is not a valid ``metadata.name`` for ``kind`` (``Kind.group``; None when it
    is): see the module docstring for the rule of each kind."""
    if kind == "Service":
        return dns1035_label_error(name)
    why = dns1123_subdomain_error(name)
    if why is None and kind == "Job.batch" and len(name) > MAX_LABEL_VALUE:
        why = (
            f"must be no more than {MAX_LABEL_VALUE} characters for a Job (has {len(name)}): "
            "it becomes the batch.kubernetes.io/job-name label of its pods"
        )
    return why


def metadata_errors(meta: Mapping[str, Any], path: str) -> Iterator[tuple[str, str]]:
    """(field path, why) for every label and annotation of ``meta`` (an object's or a pod
    template's ``metadata`` at ``path``) that the API server would refuse."""
    labels = meta.get("labels")
    if labels is not None and not isinstance(labels, Mapping):
        yield f"{path}.labels", "must be a map of strings"
        labels = {}
    for key, value in (labels or {}).items():
        field = f"{path}.labels[{key}]"
        why = qualified_name_error(str(key))
        if why is not None:
            yield field, f"key {key!r}: {why}"
        elif not isinstance(value, str):
            yield field, "must be a string"
        else:
            why = label_value_error(value)
            if why is not None:
                yield field, f"value: {why}"
    annotations = meta.get("annotations")
    if annotations is not None and not isinstance(annotations, Mapping):
        yield f"{path}.annotations", "must be a map of strings"
        annotations = {}
    total = 0
    for key, value in (annotations or {}).items():
        why = qualified_name_error(str(key))
        if why is not None:
            yield f"{path}.annotations[{key}]", f"key {key!r}: {why}"
        if not isinstance(value, str):
            yield f"{path}.annotations[{key}]", "must be a string"
            continue
        total += len(str(key)) + len(value.encode())
    if total > MAX_ANNOTATIONS_BYTES:
        yield (
            f"{path}.annotations",
            f"total size {total} bytes is more than the {MAX_ANNOTATIONS_BYTES} bytes "
            "(256 KiB) Kubernetes allows",
        )
