"""The GPU catalogue: the GPU products gpufed knows and what NVIDIA GPU Feature Discovery (GFD)
reports for each (memory, family, compute capability, MIG profiles and their sizes).

It also resolves the names people write (``H100``, ``A100-80GB``) into GFD product strings
(:func:`resolve_gpu_products`), for ``spec.placement.gpuProducts`` (the hub's intake,
``hub/rules/podsets.py``). The fleet spec (:mod:`gpufed.api.fleet`) reads it to fill in what a pool leaves out and to
check MIG layouts; :func:`gpufed.api.fleet.node_specs` turns it into node labels. A product
outside :data:`KNOWN_GPUS` still works when the pool gives its memory; its family is then
derived from the name (:func:`family_from_product`).

Facts (products, memory in MiB, families, MIG profiles and their sizes) come from
``shared/notes/gpu-topology.md`` §§1-3 (GFD ``internal/lm/resource.go``, NVIDIA mig-parted).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpufed.api.errors import PermanentError

__all__ = [
    "GFD_PREFIXES",
    "GPU_FAMILIES",
    "KNOWN_GPUS",
    "SHORT_NAMES",
    "GPUModel",
    "MigProfileShape",
    "UnknownGPUError",
    "compute_capability_of_family",
    "family_from_product",
    "gfd_product_name",
    "mig_profile_memory_mib",
    "resolve_gpu_name",
    "resolve_gpu_products",
    "short_name",
]


@dataclass(frozen=True)
class MigProfileShape:
    """How much of one GPU a MIG profile takes.

    ``compute_slices`` of the GPU's compute slices (7 on A100/H100/H200/B200/GB200),
    ``memory_slices`` of its memory slices (8), and ``max_per_gpu`` instances when the whole GPU
    uses only this profile (NVIDIA mig-parted ``all-<profile>`` configs).
    """

    compute_slices: int
    memory_slices: int
    max_per_gpu: int


# The seven profile shapes of a 7-compute-slice, 8-memory-slice GPU, in the column order of
# gpu-topology.md §2: 1g, 1g+me, 1g with double memory, 2g, 3g, 4g, 7g.
_SEVEN_SLICE_SHAPES = (
    MigProfileShape(1, 1, 7),
    MigProfileShape(1, 1, 1),
    MigProfileShape(1, 2, 4),
    MigProfileShape(2, 2, 3),
    MigProfileShape(3, 4, 2),
    MigProfileShape(4, 4, 1),
    MigProfileShape(7, 8, 1),
)


def _seven_slice_profiles(*names: str) -> dict[str, MigProfileShape]:
    return dict(zip(names, _SEVEN_SLICE_SHAPES, strict=True))


_A100_40_MIG = _seven_slice_profiles(
    "1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"
)
_80GB_MIG = _seven_slice_profiles(
    "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"
)
_H200_MIG = _seven_slice_profiles(
    "1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"
)
_GB200_MIG = _seven_slice_profiles(
    "1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"
)
_B200_MIG = _seven_slice_profiles(
    "1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"
)


@dataclass(frozen=True)
class GPUModel:
    """What GFD reports for one GPU product, and the host it usually sits in.

    ``memory_mib``: NVML total memory (label ``nvidia.com/gpu.memory``); ``family`` and
    ``compute_capability``: labels ``nvidia.com/gpu.family``, ``gpu.compute.major/minor``;
    ``cpu_arch``: ``kubernetes.io/arch`` of its nodes (Grace-based trays are arm64);
    ``mig_profiles``: profile name -> shape, empty when the product has no MIG.
    """

    product: str
    memory_mib: int
    family: str
    compute_capability: tuple[int, int]
    cpu_arch: str = "amd64"
    mig_profiles: Mapping[str, MigProfileShape] = field(default_factory=dict)
    compute_slices: int = 7
    memory_slices: int = 8


#: GFD product label value -> facts (gpu-topology.md §3; MIG rows from §2).
KNOWN_GPUS: Mapping[str, GPUModel] = {
    m.product: m
    for m in (
        GPUModel("NVIDIA-H100-80GB-HBM3", 81559, "hopper", (9, 0), mig_profiles=_80GB_MIG),
        GPUModel("NVIDIA-H100-PCIe", 81559, "hopper", (9, 0), mig_profiles=_80GB_MIG),
        GPUModel("NVIDIA-H200", 143771, "hopper", (9, 0), mig_profiles=_H200_MIG),
        GPUModel("NVIDIA-GB200", 189471, "blackwell", (10, 0), "arm64", _GB200_MIG),
        GPUModel("NVIDIA-B200", 183359, "blackwell", (10, 0), mig_profiles=_B200_MIG),
        GPUModel("NVIDIA-A100-SXM4-80GB", 81920, "ampere", (8, 0), mig_profiles=_80GB_MIG),
        GPUModel("NVIDIA-A100-SXM4-40GB", 40960, "ampere", (8, 0), mig_profiles=_A100_40_MIG),
        GPUModel("NVIDIA-L40S", 46068, "ada-lovelace", (8, 9)),
        GPUModel("Tesla-T4", 15360, "turing", (7, 5)),
    )
}

#: GFD getArchFamily() values, for products outside the table.
GPU_FAMILIES = ("volta", "turing", "ampere", "ada-lovelace", "hopper", "blackwell")
# Best-effort family from a product name outside the table (first match wins).
_FAMILY_HINTS = (
    (re.compile(r"G?B\d{3}"), "blackwell"),
    (re.compile(r"G?H\d{3}"), "hopper"),
    (re.compile(r"L\d{1,2}S?\b|L\d{1,2}$|RTX-\d000-Ada"), "ada-lovelace"),
    (re.compile(r"A\d{1,3}"), "ampere"),
    (re.compile(r"T4"), "turing"),
    (re.compile(r"V100"), "volta"),
)
# The compute capability of each family's data-centre parts, for products outside the table.
_FAMILY_COMPUTE = {
    "volta": (7, 0),
    "turing": (7, 5),
    "ampere": (8, 0),
    "ada-lovelace": (8, 9),
    "hopper": (9, 0),
    "blackwell": (10, 0),
}


_GFD_DROPPED = re.compile(r"[^A-Za-z0-9\-_. ]")


def gfd_product_name(name: str) -> str:
    """The ``nvidia.com/gpu.product`` label GFD writes for an NVML device name, as the DRA
    driver publishes it in the ``productName`` attribute (``NVIDIA H100 80GB HBM3`` ->
    ``NVIDIA-H100-80GB-HBM3``): characters outside ``[A-Za-z0-9-_. ]`` dropped, spaces turned
    into ``-`` (GFD ``internal/lm/resource.go`` ``sanitise``). Idempotent on label values."""
    return _GFD_DROPPED.sub("", name).replace(" ", "-")


def family_from_product(product: str) -> str | None:
    """GFD family guessed from a product name outside :data:`KNOWN_GPUS`
    (``NVIDIA-H800`` -> ``hopper``); None when nothing matches."""
    for pattern, family in _FAMILY_HINTS:
        if pattern.search(product):
            return family
    return None


def compute_capability_of_family(family: str) -> tuple[int, int]:
    """(major, minor) of a family (``hopper`` -> (9, 0)); (0, 0) for an unknown family."""
    return _FAMILY_COMPUTE.get(family, (0, 0))


def mig_profile_memory_mib(profile: str) -> int:
    """Memory of one MIG device in MiB as GFD publishes it under the single strategy, from the
    profile name (``1g.10gb`` -> 10240; gpu-topology.md §2: 5120 for 1g.5gb); 0 when the name
    carries no size."""
    m = re.search(r"\.(\d+)gb", profile)
    return int(m.group(1)) * 1024 if m else 0


# --- names people use ---------------------------------------------------------------------------

#: Documented short names -> the catalogue products they stand for (docs/placement.md, "GPU
#: names"). A name that covers several variants stands for all of them (``H100`` is the SXM and
#: the PCIe part): placement then chooses among them by score, like any list of products.
#: Besides these, every catalogue product is also known without its vendor prefix
#: (``H100-80GB-HBM3``, ``A100-SXM4-80GB``, ``T4``).
SHORT_NAMES: Mapping[str, tuple[str, ...]] = {
    "H100": ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"),
    "H100-80GB": ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"),
    "H100-SXM": ("NVIDIA-H100-80GB-HBM3",),
    "H100-PCIE": ("NVIDIA-H100-PCIe",),
    "H200": ("NVIDIA-H200",),
    "GB200": ("NVIDIA-GB200",),
    "B200": ("NVIDIA-B200",),
    "A100": ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-40GB"),
    "A100-80GB": ("NVIDIA-A100-SXM4-80GB",),
    "A100-40GB": ("NVIDIA-A100-SXM4-40GB",),
    "L40S": ("NVIDIA-L40S",),
    "T4": ("Tesla-T4",),
}

#: GFD product strings start with the vendor's marketing prefix (GFD ``getProductName``:
#: NVML's name with spaces as dashes). A name of that form outside the catalogue is taken
#: verbatim: the catalogue cannot list every product a member may run.
GFD_PREFIXES = ("NVIDIA-", "Tesla-", "Quadro-")


class UnknownGPUError(PermanentError, ValueError):
    """A GPU name that is neither a GFD product string nor a known short name.

    ``name``: what was given; ``suggestions``: the closest known names (difflib), best first.
    """

    def __init__(self, name: str, suggestions: tuple[str, ...]) -> None:
        hint = f"did you mean {', '.join(suggestions)}?" if suggestions else "no close match;"
        super().__init__(
            f"unknown GPU {name!r}: {hint} use a GPU Feature Discovery product "
            "(nvidia.com/gpu.product, e.g. NVIDIA-H100-80GB-HBM3) or a short name ("
            + ", ".join(SHORT_NAMES)
            + "; `gpufed get gpus` lists the fleet's)"
        )
        self.name = name
        self.suggestions = suggestions
        #: position in the list given to :func:`resolve_gpu_products` (0 for a single name)
        self.index = 0


def _aliases() -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for product in KNOWN_GPUS:
        out[product.upper()] = (product,)
        for prefix in GFD_PREFIXES:
            if product.startswith(prefix):
                out[product.removeprefix(prefix).upper()] = (product,)
    out.update({short.upper(): products for short, products in SHORT_NAMES.items()})
    return out


_ALIASES = _aliases()
# What "did you mean" offers: the short names and the full products, as people write them.
_SPELLINGS = {name.upper(): name for name in (*SHORT_NAMES, *KNOWN_GPUS)}


def resolve_gpu_name(name: str) -> tuple[str, ...]:
    """The GFD products one GPU name stands for, in catalogue order.

    Case is ignored. A catalogue product (``NVIDIA-H200``) or its name without the vendor
    prefix (``H200``) gives that product; a short name of :data:`SHORT_NAMES` gives every
    product it covers (``H100`` -> both H100 variants); any other name of GFD form (prefix
    ``NVIDIA-``, ``Tesla-``, ``Quadro-``) is taken verbatim. Raises :class:`UnknownGPUError`
    with up to three suggestions otherwise.
    """
    key = name.strip().upper()
    found = _ALIASES.get(key)
    if found is not None:
        return found
    if name.startswith(GFD_PREFIXES):
        return (name,)
    close = difflib.get_close_matches(key, list(_SPELLINGS), n=3, cutoff=0.6)
    raise UnknownGPUError(name, tuple(_SPELLINGS[c] for c in close))


def resolve_gpu_products(names: Sequence[str]) -> tuple[str, ...]:
    """Every GFD product a list of GPU names stands for (:func:`resolve_gpu_name`), each once,
    in the order given. Raises :class:`UnknownGPUError` for the first unknown name, with
    ``index`` set to its position (for the field path ``gpuProducts[i]``)."""
    out: dict[str, None] = {}
    for i, name in enumerate(names):
        try:
            products = resolve_gpu_name(name)
        except UnknownGPUError as exc:
            exc.index = i
            raise
        out.update(dict.fromkeys(products))
    return tuple(out)


def short_name(product: str) -> str | None:
    """The shortest documented short name that stands for ``product`` alone
    (``NVIDIA-H100-80GB-HBM3`` -> ``H100-SXM``, ``NVIDIA-H200`` -> ``H200``), else None."""
    names = [n for n, products in SHORT_NAMES.items() if products == (product,)]
    return min(names, key=lambda n: (len(n), n)) if names else None
