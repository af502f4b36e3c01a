"""Kubernetes resource arithmetic: quantities, resource lists and a pod's effective request.

Used by the agent (requested per node, from bound pods), by the hub (pod sets derived from a
GPUJob template) and by the fleet spec (node capacities as strings, :func:`canonical_quantity`).
Placement only ever sees the integers produced here.

Canonical units follow kube-scheduler's ``framework.Resource``: ``cpu`` in millicores, every
other resource as a whole number of its base unit (``memory`` and ``ephemeral-storage`` in
bytes, ``pods`` and extended resources such as ``nvidia.com/gpu`` as counts), rounded up.
A :data:`ResourceList` maps resource names to those integers.

Quantity strings are parsed by the Kubernetes Python client's parser
(``kubernetes.utils.quantity.parse_quantity``), so ``"8"``, ``8``, ``"3920m"``, ``"937500k"``
and ``"1Ki"`` mean what they mean to the API server. This module is the one place that parses
and formats quantities: :func:`parse_quantity` reads them, :func:`to_canonical` and
:func:`canonical_quantity` normalise them (to an integer, or to the string the API server
prints back), :func:`format_quantity` renders integers.

**Bounds, checked before any parsing or arithmetic** (a quantity is tenant input: a GPUJob
template is stored by the hub API server without any quantity validation). Python's
``Decimal`` and ``math.ceil`` turn ``"1e999999"`` into a million-digit integer (about 30 s of
one CPU core), so :func:`parse_quantity` first refuses:

- strings longer than :data:`MAX_QUANTITY_CHARS` (64; the longest exact form of any value
  Kubernetes can hold, 19 integer digits, 9 fractional digits (nano) and a suffix, is 31);
- strings outside the Kubernetes quantity grammar (``resource.Quantity``: a sign, digits with an
  optional fraction, then a binary suffix ``Ki..Ei``, a decimal suffix ``n u m k M G T P E`` or a
  decimal exponent ``e<int>``; so ``"1K"`` is refused as the API server refuses it);
- a decimal exponent outside ``±``:data:`MAX_QUANTITY_EXPONENT` (64);
- values above :data:`MAX_QUANTITY` = 2^63 - 1 base units, the largest amount Kubernetes holds
  (``resource.Quantity`` caps binary-suffixed values there and its int64 accessors overflow
  past it), checked on the digits and the exponent before the value is built.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils.quantity import parse_quantity as _k8s_parse_quantity

from gpufed.api.errors import PermanentError

#: resource name -> canonical integer amount (see module docstring for units).
ResourceList = dict[str, int]

CPU = "cpu"
MEMORY = "memory"

_NATIVE_PREFIXES = ("hugepages-",)
# Suffix i multiplies by 1024**i (binary) or by 1000**(i - 1) (decimal, from milli).
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = ("m", "", "k", "M", "G", "T", "P", "E")
# The plain form: digits, an optional fraction and an optional suffix. No sign, no exponent and
# no "n"/"u": what a fleet file may give for a node's cpu or memory.
_PLAIN_QUANTITY = re.compile(r"[0-9]+(?:\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_NATIVE = frozenset({"cpu", "memory", "ephemeral-storage", "storage", "pods"})

#: Longest quantity string accepted (characters); see the module docstring.
MAX_QUANTITY_CHARS = 64
#: Largest decimal exponent (``e`` suffix, either sign) accepted.
MAX_QUANTITY_EXPONENT = 64
#: Largest quantity accepted, in base units (2^63 - 1, Kubernetes' int64).
MAX_QUANTITY = 2**63 - 1
# The Kubernetes grammar (k8s.io/apimachinery resource.Quantity): sign, number, suffix.
_K8S_QUANTITY = re.compile(
    r"([+-]?)([0-9]*)(?:\.([0-9]*))?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
# Decimal power of each suffix; binary suffixes by the power of ten just above 1024**i.
_SUFFIX_POWER10 = {
    "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
    "Ki": 4, "Mi": 7, "Gi": 10, "Ti": 13, "Pi": 16, "Ei": 19,
}  # fmt: skip


class QuantityError(PermanentError, ValueError):
    """A quantity that Kubernetes would not accept for that resource.

    The message names the resource and the offending value, and says what would be accepted.
    """


def is_extended_resource(resource: str) -> bool:
    """True for resources outside the ``kubernetes.io`` namespace, e.g. ``nvidia.com/gpu``.

    Kubernetes requires extended resources to be whole numbers (no ``"0.5"`` GPU) and requests
    to equal limits when both are given.
    """
    if resource in _NATIVE or resource.startswith(_NATIVE_PREFIXES):
        return False
    if "/" not in resource:
        return False
    domain = resource.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def parse_quantity(value: str | int | float | Decimal, *, field: str = "quantity") -> Decimal:
    """Parse a Kubernetes quantity (``"100m"``, ``"1Gi"``, ``"937500k"``, ``8``) to a Decimal.

    Raises :class:`QuantityError` naming ``field`` when the value is not a quantity.
    """
    if isinstance(value, bool):
        raise QuantityError(f"{field}: {value!r} is not a quantity (use a number such as 8 or '8')")
    if isinstance(value, str):
        _check_quantity_string(value, field)
    elif isinstance(value, int) and value > MAX_QUANTITY:
        raise QuantityError(f"{field}: {_show(value)} is larger than Kubernetes can hold")
    elif (
        isinstance(value, (float, Decimal))
        and math.isfinite(value)
        and abs(Decimal(value)) > MAX_QUANTITY
    ):
        raise QuantityError(f"{field}: {value!r} is larger than Kubernetes can hold")
    try:
        parsed: Decimal = _k8s_parse_quantity(value)  # type: ignore[no-untyped-call]
    except (ValueError, InvalidOperation, TypeError) as exc:
        raise QuantityError(
            f"{field}: {_show(value)} is not a Kubernetes quantity "
            "(examples: 8, '500m', '1Gi', '937500k')"
        ) from exc
    if not parsed.is_finite():
        raise QuantityError(f"{field}: {_show(value)} is not a finite quantity")
    if parsed < 0:
        raise QuantityError(f"{field}: {_show(value)} is negative; quantities must be >= 0")
    if parsed > MAX_QUANTITY:
        raise QuantityError(
            f"{field}: {_show(value)} is larger than Kubernetes can hold ({MAX_QUANTITY})"
        )
    return parsed


def _check_quantity_string(value: str, field: str) -> None:
    """The bounds of the module docstring, on the string alone (no number is built)."""
    if len(value) > MAX_QUANTITY_CHARS:
        raise QuantityError(
            f"{field}: {_show(value)} is {len(value)} characters long; a Kubernetes quantity "
            f"needs at most {MAX_QUANTITY_CHARS} (examples: 8, '500m', '1Gi')"
        )
    m = _K8S_QUANTITY.fullmatch(value)
    if m is None or not (m.group(2) or m.group(3)):
        raise QuantityError(
            f"{field}: {value!r} is not a Kubernetes quantity "
            "(examples: 8, '500m', '1Gi', '937500k', '1e3')"
        )
    sign, whole, _, suffix = m.groups()
    power = _SUFFIX_POWER10.get(suffix or "", 0)
    if suffix and suffix not in _SUFFIX_POWER10:  # a decimal exponent, e<int>
        exponent = int(suffix[1:])  # at most 62 digits: the string is short
        if abs(exponent) > MAX_QUANTITY_EXPONENT:
            raise QuantityError(
                f"{field}: {value!r} has the exponent {exponent}; quantities allow exponents "
                f"from -{MAX_QUANTITY_EXPONENT} to {MAX_QUANTITY_EXPONENT} (write '8', '500m')"
            )
        power = exponent
    digits = len(whole.lstrip("0"))
    if sign != "-" and digits and digits + power > 20:
        # At least 10^(digits + power - 1) > 2^63 - 1 (about 9.2e18).
        raise QuantityError(
            f"{field}: {value!r} is larger than Kubernetes can hold ({MAX_QUANTITY})"
        )


def _show(value: object) -> str:
    """``repr`` cut to 80 characters (never the whole of a huge input in a message)."""
    if isinstance(value, int) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:40]}…({len(text)} characters)"


def to_canonical(resource: str, value: str | int | float | Decimal, *, field: str = "") -> int:
    """Convert one quantity of ``resource`` to its canonical integer (see module docstring).

    ``cpu`` becomes millicores (``"3920m"`` -> 3920, ``"2"`` -> 2000); other resources become
    whole units rounded up (``"1Ki"`` -> 1024). Extended resources must be whole numbers:
    ``"0.5"`` for ``nvidia.com/gpu`` raises :class:`QuantityError`.
    """
    where = field or resource
    amount = parse_quantity(value, field=where)
    if resource == CPU:
        return math.ceil(amount * 1000)
    if is_extended_resource(resource) and amount != amount.to_integral_value():
        raise QuantityError(
            f"{where}: {value!r} is fractional; extended resources such as {resource} must be "
            "whole numbers (request 1 GPU, or a MIG profile resource for a slice)"
        )
    return math.ceil(amount)


def canonical_quantity(value: str, *, field: str = "quantity") -> str:
    """A plain quantity string in the form the API server prints it back (``1024Gi`` -> ``1Ti``,
    ``2000m`` -> ``2``, ``1.5Gi`` -> ``1536Mi``, ``1000M`` -> ``1G``): the largest suffix of the
    input's family (binary ``Ki..Ei`` or decimal ``m..E``) that keeps the number whole. Binary
    input that is not a whole number of bytes, and all decimal input, is rounded up to whole
    milli-units first (``0.5`` -> ``500m``).

    Raises :class:`QuantityError` naming ``field`` when ``value`` is not in the plain form
    (digits, optional fraction, optional suffix: no sign, exponent, ``n`` or ``u``).
    """
    m = _PLAIN_QUANTITY.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise QuantityError(
            f"{field}: {value!r} is not a plain Kubernetes quantity (digits with an optional "
            "fraction and suffix, e.g. '128', '500m', '2Ti')"
        )
    amount = parse_quantity(value, field=field)
    if m.group(1) in _BINARY_SUFFIXES[1:] and amount == amount.to_integral_value():
        return _with_binary_suffix(int(amount))
    return _with_decimal_suffix(math.ceil(amount * 1000))


def _with_binary_suffix(amount: int) -> str:
    """``amount`` (base units) with the largest binary suffix that keeps it whole."""
    e = 0
    while e < len(_BINARY_SUFFIXES) - 1 and amount and amount % 1024 == 0:
        amount, e = amount // 1024, e + 1
    return f"{amount}{_BINARY_SUFFIXES[e]}"


def _with_decimal_suffix(milli: int) -> str:
    """``milli`` (thousandths of the base unit) with the largest decimal suffix that keeps it
    whole."""
    e = 0
    while e < len(_DECIMAL_SUFFIXES) - 1 and milli and milli % 1000 == 0:
        milli, e = milli // 1000, e + 1
    return f"{milli}{_DECIMAL_SUFFIXES[e]}"


def resource_list(raw: Mapping[str, Any] | None, *, field: str = "resources") -> ResourceList:
    """Convert a Kubernetes ``ResourceList`` (name -> quantity) to canonical integers.

    Zero amounts are kept (they matter for "requests equal limits" checks); ``None`` is ``{}``.
    """
    if not raw:
        return {}
    if not isinstance(raw, Mapping):
        raise QuantityError(f"{field}: expected a map of resource name to quantity, got {raw!r}")
    return {name: to_canonical(name, q, field=f"{field}.{name}") for name, q in raw.items()}


def add(a: Mapping[str, int], b: Mapping[str, int]) -> ResourceList:
    """Element-wise sum of two resource lists."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def scale(a: Mapping[str, int], n: int) -> ResourceList:
    """``a`` multiplied by ``n`` (e.g. per-pod requests times pod count)."""
    return {k: v * n for k, v in a.items()}


def maximum(a: Mapping[str, int], b: Mapping[str, int]) -> ResourceList:
    """Element-wise maximum of two resource lists."""
    out = dict(a)
    for k, v in b.items():
        if v > out.get(k, 0):
            out[k] = v
    return out


def format_quantity(resource: str, amount: int) -> str:
    """Render a canonical amount as a Kubernetes quantity string (``3920`` cpu -> ``"3920m"``).

    cpu prints whole cores when it can; byte resources use the largest exact binary suffix.
    """
    if resource == CPU:
        return str(amount // 1000) if amount % 1000 == 0 else f"{amount}m"
    if resource in (MEMORY, "ephemeral-storage", "storage") or resource.startswith("hugepages-"):
        return _with_binary_suffix(amount)
    return str(amount)


def container_requests(container: Mapping[str, Any], *, field: str = "container") -> ResourceList:
    """Effective requests of one container: ``requests``, with ``limits`` filling the gaps.

    Kubernetes defaults a missing request to its limit, so a container with only limits
    requests its limits. For extended resources, requests must equal limits when both are set.
    """
    res = container.get("resources") or {}
    if not isinstance(res, Mapping):
        raise QuantityError(
            f"{field}.resources: must be an object with requests and/or limits, "
            f"not {type(res).__name__}"
        )
    requests = resource_list(res.get("requests"), field=f"{field}.resources.requests")
    limits = resource_list(res.get("limits"), field=f"{field}.resources.limits")
    out = dict(limits)
    for name, amount in requests.items():
        if is_extended_resource(name) and name in limits and limits[name] != amount:
            raise QuantityError(
                f"{field}.resources: {name} request {amount} differs from limit {limits[name]}; "
                "extended resources cannot be overcommitted (set them equal, or set only limits)"
            )
        out[name] = amount
    return out


def pod_requests(pod_spec: Mapping[str, Any], *, field: str = "spec") -> ResourceList:
    """Effective resource request of a pod, as kube-scheduler computes it.

    ``max(sum(app containers) + sum(sidecars), max over init containers of (init + sidecars
    started before it)) + overhead``: init containers count as their maximum, not their sum;
    restartable init containers (``restartPolicy: Always``, sidecars) keep running and add up;
    ``spec.overhead`` (from the RuntimeClass) is added. Source: k8s.io/component-helpers
    ``resource.PodRequests``.

    Raises :class:`QuantityError` naming the container field on a bad quantity.
    """
    total: ResourceList = {}
    for i, c in enumerate(_containers(pod_spec, "containers", field)):
        total = add(total, container_requests(c, field=f"{field}.containers[{i}]"))

    sidecars: ResourceList = {}
    init_peak: ResourceList = {}
    for i, c in enumerate(_containers(pod_spec, "initContainers", field)):
        req = container_requests(c, field=f"{field}.initContainers[{i}]")
        if c.get("restartPolicy") == "Always":
            sidecars = add(sidecars, req)
            init_peak = maximum(init_peak, sidecars)
        else:
            init_peak = maximum(init_peak, add(req, sidecars))
    total = maximum(add(total, sidecars), init_peak)
    overhead = resource_list(pod_spec.get("overhead"), field=f"{field}.overhead")
    return add(total, overhead)


def _containers(pod_spec: Mapping[str, Any], key: str, field: str) -> list[Mapping[str, Any]]:
    """The containers under ``key``; raises :class:`QuantityError` naming ``{field}.{key}`` (or
    ``{field}.{key}[i]``) when they are not a list of objects."""
    items = pod_spec.get(key) or []
    if not isinstance(items, list):
        raise QuantityError(
            f"{field}.{key}: expected a list of containers, got {type(items).__name__}"
        )
    for i, c in enumerate(items):
        if not isinstance(c, Mapping):
            raise QuantityError(
                f"{field}.{key}[{i}]: must be an object (a container with name, image, "
                f"resources), not {'null' if c is None else type(c).__name__}"
            )
    return items
