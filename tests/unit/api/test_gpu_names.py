"""GPU names people use (api/gpus.py): GFD product strings and documented short names resolve
to catalogue products; an unknown name is refused with "did you mean"."""

from __future__ import annotations

import pytest

from gpufed.api.gpus import (
    KNOWN_GPUS,
    SHORT_NAMES,
    UnknownGPUError,
    resolve_gpu_name,
    resolve_gpu_products,
)


@pytest.mark.parametrize(
    ("name", "products"),
    [
        ("NVIDIA-H100-80GB-HBM3", ("NVIDIA-H100-80GB-HBM3",)),
        ("nvidia-h100-80gb-hbm3", ("NVIDIA-H100-80GB-HBM3",)),
        ("H100", ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe")),
        ("h200", ("NVIDIA-H200",)),
        ("GB200", ("NVIDIA-GB200",)),
        ("A100-80GB", ("NVIDIA-A100-SXM4-80GB",)),
        ("A100", ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-40GB")),
        ("A100-SXM4-40GB", ("NVIDIA-A100-SXM4-40GB",)),
        ("T4", ("Tesla-T4",)),
    ],
)
def test_a_short_name_or_product_resolves_to_catalogue_products(
    name: str, products: tuple[str, ...]
) -> None:
    assert resolve_gpu_name(name) == products


def test_every_short_name_stands_for_catalogue_products() -> None:
    for short, products in SHORT_NAMES.items():
        assert products, short
        assert all(p in KNOWN_GPUS for p in products), short


def test_a_gfd_product_outside_the_catalogue_is_taken_verbatim() -> None:
    assert resolve_gpu_name("NVIDIA-H800") == ("NVIDIA-H800",)
    assert resolve_gpu_name("Tesla-V100-SXM2-32GB") == ("Tesla-V100-SXM2-32GB",)


def test_an_unknown_name_is_refused_with_the_closest_names() -> None:
    with pytest.raises(UnknownGPUError) as err:
        resolve_gpu_name("H10O")
    assert err.value.suggestions[0] == "H100"
    assert "did you mean H100" in str(err.value)
    assert "NVIDIA-H100-80GB-HBM3" in str(err.value)  # the GFD form is shown as the fix


def test_a_list_resolves_each_product_once_and_names_the_bad_entry() -> None:
    assert resolve_gpu_products(["H100", "H100-SXM", "H200"]) == (
        "NVIDIA-H100-80GB-HBM3",
        "NVIDIA-H100-PCIe",
        "NVIDIA-H200",
    )
    assert resolve_gpu_products([]) == ()
    with pytest.raises(UnknownGPUError) as err:
        resolve_gpu_products(["H200", "a100-80gib"])
    assert err.value.index == 1
    assert "A100-80GB" in err.value.suggestions
