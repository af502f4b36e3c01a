"""Device selectors of DRA claims (CEL): the subset gpufed evaluates, checked once when a job is
sized and evaluated per pool of DRA GPUs during placement.

A ResourceClaimTemplate request's ``selectors[].cel.expression`` picks devices by what the
driver publishes. gpufed evaluates it, with the well-kept ``cel-python`` library, against the
device groups a member reports (:class:`gpufed.api.inventory.DeviceGroup`), so a job goes only
to members whose GPUs its selectors accept. What it evaluates (:func:`check_selector` refuses
the rest, naming what is supported, rather than guessing):

- the variable ``device`` only, as ``device.driver``,
  ``device.attributes['gpu.nvidia.com'].<name>`` for the plain attributes gpufed carries
  (:data:`SUPPORTED_ATTRIBUTES`) and ``device.capacity['gpu.nvidia.com'].memory``;
- ``==``, ``!=``, ``in``, ``&&``, ``||``, ``!``, comparisons, literals and lists;
- the string functions ``startsWith``, ``endsWith``, ``contains``, and
  ``<capacity>.compareTo(quantity('80Gi'))`` (-1, 0 or 1 as Kubernetes' quantity library).

Refused: version attributes (``driverVersion`` … need ``semver()``), per-device identities
(``uuid``, ``pciBusID``: gpufed does not carry them), other drivers' domains, macros (``has``,
``all``, ``exists`` …) and every other function. A device on which an expression fails (an
attribute it lacks) does not match, as in Kubernetes.

Pure: called by the hub's job sizing (:mod:`gpufed.hub.rules.podsets`, "DRA claims") and by the placement
filter ``DeviceSelectors`` (:mod:`gpufed.placement.plugins`).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from lark import Token, Tree

from gpufed.api.dra import KEPT_CAPACITY
from gpufed.api.inventory import DeviceGroup, NodeInventory
from gpufed.api.labels import DRA_GPU_DRIVER
from gpufed.api.resources import QuantityError, parse_quantity

#: Plain (non-version) attributes a selector may read.
SUPPORTED_ATTRIBUTES = frozenset({"type", "productName", "brand", "architecture"})
_VERSION_ATTRIBUTES = frozenset({"driverVersion", "cudaDriverVersion", "cudaComputeCapability"})
_METHODS = frozenset({"startsWith", "endsWith", "contains", "compareTo"})
_FUNCTIONS = frozenset({"quantity"})
#: Longest expression checked (Kubernetes allows 10 KiB; gpufed's subset needs far less).
MAX_EXPRESSION = 4096

SUPPORTED = (
    "supported: device.driver, device.attributes['gpu.nvidia.com'].{"
    + ", ".join(sorted(SUPPORTED_ATTRIBUTES))
    + "}, device.capacity['gpu.nvidia.com'].memory, ==, !=, in, &&, ||, !, comparisons, "
    "startsWith, endsWith, contains, compareTo(quantity(...))"
)


class _Quantity(celtypes.IntType):
    """A capacity or ``quantity()`` value: an integer amount (bytes for memory)."""


def _quantity(text: Any) -> _Quantity:
    try:
        amount = parse_quantity(str(text), field="quantity()")
    except QuantityError as exc:
        raise ValueError(str(exc)) from exc
    return _Quantity(int(amount))


def _compare_to(a: Any, b: Any) -> celtypes.IntType:
    if not isinstance(a, celtypes.IntType) or not isinstance(b, celtypes.IntType):
        raise TypeError("compareTo compares quantities")
    return celtypes.IntType((a > b) - (a < b))


_ENV = celpy.Environment()


@lru_cache(maxsize=512)
def _compiled(expression: str) -> tuple[Any, str | None]:
    """(program, None) or (None, why it is refused)."""
    if len(expression) > MAX_EXPRESSION:
        return None, f"is longer than {MAX_EXPRESSION} characters"
    try:
        tree = _ENV.compile(expression)
    except Exception as exc:  # the library's parse errors carry the position
        first = (str(exc).splitlines() or ["syntax error"])[0]
        return None, f"is not valid CEL: {first}"
    why = _refusal(tree)
    if why is not None:
        return None, why
    program = _ENV.program(tree, functions={"quantity": _quantity, "compareTo": _compare_to})
    return program, None


def check_selector(expression: str) -> str | None:
    """None when gpufed can evaluate ``expression``, else why not (ending with what is
    supported), for an error naming the selector's field."""
    _, why = _compiled(expression)
    return None if why is None else f"{why} ({SUPPORTED})"


def _idents(tree: Tree[Any]) -> str:
    """The first identifier token directly under ``tree`` ("" when none)."""
    return next((str(c) for c in tree.children if isinstance(c, Token) and c.type == "IDENT"), "")


def _string_key(expr: Tree[Any]) -> str | None:
    """The string literal an index expression is made of, else None."""
    tokens = list(expr.scan_values(lambda _: True))
    if len(tokens) != 1 or getattr(tokens[0], "type", "") != "STRING_LIT":
        return None
    try:
        value = ast.literal_eval(str(tokens[0]))
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


def _device_access(node: Tree[Any]) -> tuple[str, str, str] | None:
    """``device.<map>['<domain>'].<name>`` -> (map, domain, name); ``device.driver`` ->
    ("driver", "", ""); else None."""
    if node.data != "member_dot":
        return None
    inner, name = node.children[0], _idents(node)
    if _is_device(inner):
        return ("driver", "", "") if name == "driver" else None
    if not isinstance(inner, Tree) or inner.data != "member" or not inner.children:
        return None
    index = inner.children[0]
    if not isinstance(index, Tree) or index.data != "member_index":
        return None
    base, key_expr = index.children[0], index.children[1]
    if not isinstance(base, Tree) or base.data != "member" or not base.children:
        return None
    dot = base.children[0]
    if not isinstance(dot, Tree) or dot.data != "member_dot" or not _is_device(dot.children[0]):
        return None
    which = _idents(dot)
    key = _string_key(key_expr) if isinstance(key_expr, Tree) else None
    if which not in ("attributes", "capacity") or key is None:
        return None
    return which, key, name


def _is_device(node: Any) -> bool:
    """The bare variable ``device`` (a ``member`` -> ``primary`` -> ``ident`` chain)."""
    while isinstance(node, Tree) and node.data in ("member", "primary") and len(node.children) == 1:
        node = node.children[0]
    return (
        isinstance(node, Tree)
        and node.data == "ident"
        and [str(c) for c in node.children] == ["device"]
    )


def _refusal(tree: Tree[Any]) -> str | None:
    """Why ``tree`` is outside the subset, or None."""
    for node in tree.iter_subtrees():  # functions and macros first: the clearer reason
        if node.data in ("member_dot_arg", "ident_arg"):
            name = _idents(node)
            if name not in (_METHODS if node.data == "member_dot_arg" else _FUNCTIONS):
                return f"calls {name}(), which gpufed does not evaluate"
    uses = 0
    accesses = 0
    for node in tree.iter_subtrees():
        if node.data == "ident":
            name = str(node.children[0])
            if name != "device":
                return f"reads {name!r}; the only variable is device"
            uses += 1
        elif node.data in ("dot_ident", "dot_ident_arg"):
            return "uses a qualified name, which gpufed does not evaluate"
        elif node.data == "member_dot":
            access = _device_access(node)
            if access is None:
                continue
            accesses += 1
            which, domain, name = access
            if which == "driver":
                continue
            if domain != DRA_GPU_DRIVER:
                return (
                    f"reads device.{which}[{domain!r}]: gpufed carries only the "
                    f"{DRA_GPU_DRIVER} domain"
                )
            if which == "capacity" and name not in KEPT_CAPACITY:
                return f"reads capacity {name!r}, which gpufed does not carry"
            if which == "attributes" and name in _VERSION_ATTRIBUTES:
                return f"reads the version attribute {name!r} (semver), which gpufed does not evaluate yet"
            if which == "attributes" and name not in SUPPORTED_ATTRIBUTES:
                return f"reads attribute {name!r}, which gpufed does not carry"
    if uses != accesses:
        return "uses device other than as device.driver, device.attributes['<domain>'].<name> or device.capacity['<domain>'].<name>"
    return None


@lru_cache(maxsize=4096)
def _matches_json(expression: str, group_json: str) -> bool:
    program, why = _compiled(expression)
    if program is None:
        raise ValueError(f"selector {expression!r} {why}")
    group = json.loads(group_json)
    device = {
        "driver": DRA_GPU_DRIVER,
        "attributes": {DRA_GPU_DRIVER: group["attributes"]},
        "capacity": {DRA_GPU_DRIVER: group["capacity"]},
    }
    # Capacities are quantities: compareTo() compares them (json_to_cel would make plain ints).
    capacity = celtypes.MapType(
        {celtypes.StringType(k): _Quantity(int(v)) for k, v in group["capacity"].items()}
    )
    device["capacity"] = {}
    cel_device: Any = json_to_cel(device)
    cel_device[celtypes.StringType("capacity")] = celtypes.MapType(
        {celtypes.StringType(DRA_GPU_DRIVER): capacity}
    )
    activation = {"device": cel_device}
    try:
        result = program.evaluate(activation)
    except Exception:  # a runtime error (a missing attribute): the device does not match
        return False
    return isinstance(result, celtypes.BoolType) and bool(result)


def group_json(group: DeviceGroup | Mapping[str, Any]) -> str:
    """The canonical JSON of a device group's kind (attributes, versions, capacity; not its
    counts): the identity placement pools DRA nodes by."""
    if isinstance(group, DeviceGroup):
        group = {
            "attributes": group.attributes,
            "versions": group.versions,
            "capacity": group.capacity,
        }
    return json.dumps(
        {k: group.get(k, {}) for k in ("attributes", "versions", "capacity")},
        sort_keys=True,
        separators=(",", ":"),
    )


def dra_kinds(node: NodeInventory) -> tuple[str, ...]:
    """The kinds of DRA GPU on a node (:func:`group_json` of each group), empty for a node
    whose GPUs are the extended resource: part of placement's pool key."""
    return tuple(group_json(g) for g in node.dra_gpus)


def matches(expressions: Iterable[str], group: str) -> bool:
    """Whether a device of ``group`` (its :func:`group_json`) satisfies every expression.
    Raises ``ValueError`` for an expression :func:`check_selector` refuses."""
    return all(_matches_json(e, group) for e in expressions)
