"""DRA vocabulary gpufed shares between the agent and the hub: which device attributes of NVIDIA's
GPU driver it carries, and how a ResourceSlice device's attributes and capacity are read.

The agent (:mod:`gpufed.agent.dra`) reduces the devices of ResourceSlices (``resource.k8s.io/v1``)
of driver ``gpu.nvidia.com`` to :class:`~gpufed.api.inventory.DeviceGroup` with
:func:`device_facts`; the hub's job sizing checks that a claim's CEL selectors read only what
:data:`KEPT_ATTRIBUTES` and :data:`KEPT_CAPACITY` name. Sources: ``k8s.io/api`` ``resource/v1``
(``DeviceAttribute``: exactly one of ``int``, ``bool``, ``string``, ``version``; capacity
``{value: <quantity>}``) and the driver's ``cmd/gpu-kubelet-plugin`` (attribute names), see
``shared/notes/dra-computedomains.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpufed.api.labels import DRA_GPU_DRIVER
from gpufed.api.resources import QuantityError, parse_quantity

#: Device attributes of a whole GPU gpufed keeps (the ones a GPU's kind is told by; per-device
#: identities such as ``uuid``, ``resource.kubernetes.io/pciBusID``, ``pcieRoot`` and
#: ``numaNode`` are dropped, so a node's GPUs form one group).
KEPT_ATTRIBUTES: Final = frozenset(
    {
        "type",
        "productName",
        "brand",
        "architecture",
        "cudaComputeCapability",
        "driverVersion",
        "cudaDriverVersion",
    }
)
#: Device capacities gpufed keeps (``memory``: bytes).
KEPT_CAPACITY: Final = frozenset({"memory"})
#: JSON type of each plain attribute kind (bool is not an int here).
_TYPES: Final[dict[str, type]] = {"string": str, "bool": bool, "int": int}
#: The ``type`` attribute of a whole GPU (MIG devices say ``mig``).
WHOLE_GPU_TYPE: Final = "gpu"


def short_attribute_name(name: str, driver: str = DRA_GPU_DRIVER) -> str:
    """An attribute or capacity name without the driver's own domain: a name written with
    the driver's domain (``gpu.nvidia.com/productName``) is the same as the bare one
    (``productName``), as the API defines; names of other domains keep theirs."""
    return name.removeprefix(f"{driver}/")


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """What gpufed keeps of one ResourceSlice device: its name, whether it is a whole GPU,
    the kept attributes (plain values, and versions apart) and capacities (integers)."""

    name: str
    whole_gpu: bool
    attributes: tuple[tuple[str, bool | int | str], ...]
    versions: tuple[tuple[str, str], ...]
    capacity: tuple[tuple[str, int], ...]


def device_facts(raw: Mapping[str, Any], *, field: str) -> DeviceFacts:
    """Reduce one ``spec.devices[]`` entry of a ``gpu.nvidia.com`` ResourceSlice.

    ``field`` names the entry in errors (``ResourceSlice n1-gpu: spec.devices[3]``). Raises
    ``ValueError`` naming the field for a device without a name, an attribute that is not
    exactly one of int/bool/string/version, or a capacity that is not a whole quantity.
    """
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{field}.name: a device needs a name")
    attributes: dict[str, bool | int | str] = {}
    versions: dict[str, str] = {}
    for key, value in (raw.get("attributes") or {}).items():
        short = short_attribute_name(str(key))
        if short not in KEPT_ATTRIBUTES:
            continue
        if not isinstance(value, Mapping) or len(value) != 1:
            raise ValueError(
                f"{field}.attributes[{key}]: must hold exactly one of int, bool, string, version"
            )
        ((kind, v),) = value.items()
        if kind == "version" and isinstance(v, str):
            versions[short] = v
        elif _TYPES.get(kind) is type(v) and isinstance(v, bool | int | str):
            attributes[short] = v
        else:
            raise ValueError(f"{field}.attributes[{key}]: {kind}: {v!r} is not a valid {kind}")
    capacity: dict[str, int] = {}
    for key, value in (raw.get("capacity") or {}).items():
        short = short_attribute_name(str(key))
        if short not in KEPT_CAPACITY:
            continue
        quantity = value.get("value") if isinstance(value, Mapping) else None
        try:
            amount = parse_quantity(str(quantity), field=f"{field}.capacity[{key}].value")
        except QuantityError as exc:
            raise ValueError(str(exc)) from exc
        if amount != int(amount) or amount < 0:
            raise ValueError(f"{field}.capacity[{key}].value: {quantity!r} is not a whole amount")
        capacity[short] = int(amount)
    return DeviceFacts(
        name=name,
        whole_gpu=attributes.get("type") == WHOLE_GPU_TYPE,
        attributes=tuple(sorted(attributes.items())),
        versions=tuple(sorted(versions.items())),
        capacity=tuple(sorted(capacity.items())),
    )
