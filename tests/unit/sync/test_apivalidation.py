"""The metadata rules a member's API server enforces: names per kind, label keys and values,
annotation keys and their 256 KiB total; each with a refused and an accepted case."""

from __future__ import annotations

import pytest

from gpufed.sync.apivalidation import (
    MAX_ANNOTATIONS_BYTES,
    metadata_errors,
    name_error,
    qualified_name_error,
)


@pytest.mark.parametrize(
    ("kind", "name", "ok"),
    [
        ("ConfigMap", "a.b-c", True),
        ("ConfigMap", "x" * 253, True),
        ("ConfigMap", "x" * 254, False),
        ("ConfigMap", "Upper", False),
        ("Secret", "-lead", False),
        ("Service", "svc-1", True),
        ("Service", "1svc", False),  # DNS-1035: starts with a letter
        ("Service", "a.b", False),
        ("Service", "s" * 64, False),
        ("Job.batch", "j" * 63, True),
        ("Job.batch", "j" * 64, False),  # the job-name label of its pods
        ("JobSet.jobset.x-k8s.io", "js." + "x" * 100, True),
        ("PyTorchJob.kubeflow.org", "bad_name", False),
    ],
)
def test_names_follow_the_rule_of_their_kind(kind: str, name: str, ok: bool) -> None:
    assert (name_error(kind, name) is None) is ok


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("app", True),
        ("example.com/team", True),
        ("a/b/c", False),
        ("/x", False),
        ("Example.com/x", False),
        ("example.com/", False),
        ("n" * 63, True),
        ("n" * 64, False),
        ("-x", False),
        (("p" * 254) + "/x", False),
    ],
)
def test_label_and_annotation_keys_are_qualified_names(key: str, ok: bool) -> None:
    assert (qualified_name_error(key) is None) is ok


def test_label_values_past_63_characters_or_with_bad_characters_are_refused_by_field() -> None:
    meta = {"labels": {"ok": "v1.2_x", "long": "v" * 64, "bad": "a b", "empty": ""}}
    assert [f for f, _ in metadata_errors(meta, "m")] == ["m.labels[long]", "m.labels[bad]"]
    assert "63" in dict(metadata_errors(meta, "m"))["m.labels[long]"]


def test_annotations_over_256_kib_in_total_are_refused_and_just_under_pass() -> None:
    under = {"annotations": {"a": "x" * (MAX_ANNOTATIONS_BYTES - 1)}}
    over = {"annotations": {"a": "x" * MAX_ANNOTATIONS_BYTES}}
    assert list(metadata_errors(under, "m")) == []
    assert [f for f, _ in metadata_errors(over, "m")] == ["m.annotations"]


def test_non_string_values_and_non_map_labels_are_refused() -> None:
    assert [f for f, _ in metadata_errors({"labels": {"n": 5}}, "m")] == ["m.labels[n]"]
    assert [f for f, _ in metadata_errors({"labels": ["a"]}, "m")] == ["m.labels"]
