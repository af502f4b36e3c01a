"""Kubernetes quantity semantics and effective pod requests (gpufed.api.resources)."""

from __future__ import annotations

import pytest

from gpufed.api.resources import (
    QuantityError,
    canonical_quantity,
    container_requests,
    format_quantity,
    pod_requests,
    to_canonical,
)


@pytest.mark.parametrize(
    ("resource", "value", "expected"),
    [
        ("nvidia.com/gpu", "8", 8),
        ("nvidia.com/gpu", 8, 8),
        ("cpu", "3920m", 3920),
        ("cpu", "2", 2000),
        ("cpu", 0.5, 500),
        ("memory", "937500k", 937_500_000),
        ("memory", "1Ki", 1024),
        ("memory", "1Gi", 2**30),
        ("memory", "1e3", 1000),
    ],
)
def test_quantities_parse_to_canonical_units(
    resource: str, value: str | int, expected: int
) -> None:
    assert to_canonical(resource, value) == expected


def test_fractional_gpu_is_rejected_with_the_field_named() -> None:
    with pytest.raises(QuantityError, match=r"limits\.nvidia\.com/gpu.*fractional"):
        to_canonical("nvidia.com/gpu", "0.5", field="limits.nvidia.com/gpu")


def test_garbage_quantity_names_the_field() -> None:
    with pytest.raises(QuantityError, match=r"containers\[0\]\.resources\.limits\.cpu"):
        pod_requests({"containers": [{"resources": {"limits": {"cpu": "lots"}}}]})


def test_resources_that_are_not_an_object_name_the_field() -> None:
    """`resources: 8` failed the job with "'int' object has no attribute 'get'"."""
    with pytest.raises(QuantityError, match=r"containers\[0\]\.resources: must be an object"):
        pod_requests({"containers": [{"resources": 8}]})


def test_limits_only_container_requests_its_limits() -> None:
    c = {"resources": {"limits": {"nvidia.com/gpu": 4, "cpu": "8"}}}
    assert container_requests(c) == {"nvidia.com/gpu": 4, "cpu": 8000}


def test_extended_request_must_equal_limit() -> None:
    c = {"resources": {"limits": {"nvidia.com/gpu": 4}, "requests": {"nvidia.com/gpu": 2}}}
    with pytest.raises(QuantityError, match="differs from limit"):
        container_requests(c)


def test_init_containers_count_as_their_max_not_their_sum_and_overhead_is_added() -> None:
    spec = {
        "containers": [
            {"resources": {"limits": {"nvidia.com/gpu": 2, "cpu": "1"}}},
            {"resources": {"requests": {"cpu": "500m"}}},
        ],
        "initContainers": [
            {"resources": {"requests": {"cpu": "4"}}},
            {"resources": {"requests": {"cpu": "3"}}},
        ],
        "overhead": {"cpu": "250m"},
    }
    # app containers sum to 1.5 CPU, init peak is 4 CPU (not 7): max(1.5, 4) + 0.25
    assert pod_requests(spec) == {"nvidia.com/gpu": 2, "cpu": 4250}


def test_sidecars_add_to_app_containers() -> None:
    spec = {
        "initContainers": [
            {"restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
            {"resources": {"requests": {"cpu": "2"}}},
        ],
        "containers": [{"resources": {"requests": {"cpu": "1"}}}],
    }
    # sidecar (1) keeps running: app 1 + sidecar 1 = 2; init peak = 2 + sidecar 1 = 3
    assert pod_requests(spec) == {"cpu": 3000}


def test_format_quantity_round_trips_common_values() -> None:
    assert format_quantity("cpu", 3920) == "3920m"
    assert format_quantity("cpu", 4000) == "4"
    assert format_quantity("memory", 2**31) == "2Gi"
    assert format_quantity("memory", 937_500_000) == "937500000"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1024Gi", "1Ti"),
        ("937500k", "937500k"),
        ("1000", "1k"),
        ("0.0001Ki", "103m"),  # not a whole number of bytes: decimal milli-units, rounded up
    ],
)
def test_canonical_quantity_keeps_the_suffix_family_as_the_api_server_does(
    value: str, expected: str
) -> None:
    assert canonical_quantity(value) == expected


@pytest.mark.parametrize("value", ["1e3", "-1", "+1", ".5", "1K", "1n", "1 Gi", ""])
def test_canonical_quantity_accepts_only_the_plain_form(value: str) -> None:
    with pytest.raises(QuantityError, match=r"memory: .* is not a plain Kubernetes quantity"):
        canonical_quantity(value, field="memory")
