"""Structural limits on untrusted JSON-like input: how deep, how many values, how large.

The one place that measures the shape of a value a tenant or an agent hands the hub before any
recursive code (``copy.deepcopy``, ``json.dumps``, pydantic) or arithmetic touches it. Called by
pod-set derivation (:mod:`gpufed.hub.rules.podsets`) and manifest preparation
(:mod:`gpufed.sync.manifests`) on every GPUJob template; the limits of quantities live with
quantities (:mod:`gpufed.api.resources`), those of agent inventory with inventory
(:mod:`gpufed.api.inventory`).

The walk is iterative (an explicit stack), so no nesting depth can raise ``RecursionError``,
and it stops at the first limit crossed, so it costs at most ``max_values`` steps whatever the
input. Limits for GPUJob templates (docs/design.md §4, "Bounded input"):

- :data:`MAX_TEMPLATE_DEPTH` = 64 nested maps and lists, counted from ``spec.template``. A real
  JobSet's deepest path (``…replicatedJobs[i].template.spec.template.spec.affinity.nodeAffinity
  …matchExpressions[j].values[k]``) is about 20; Kubernetes' own CBOR decoder started at 64
  for the same reason (its JSON decoder allows 10,000, deeper than Python's ``json`` and
  ``copy`` can go);
- :data:`MAX_TEMPLATE_VALUES` = 10,000 maps, lists and scalars in all (a training JobSet with
  a few containers holds a few hundred);
- :data:`MAX_TEMPLATE_CHARS` = 1,572,864 characters of keys and strings (1.5 MiB, etcd's
  default request limit: no larger object can be stored by a hub API server anyway).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gpufed.api.errors import FieldError

MAX_TEMPLATE_DEPTH = 64
MAX_TEMPLATE_VALUES = 10_000
MAX_TEMPLATE_CHARS = 1536 * 1024
#: Jobs one agent may list as held in its Hello (``AgentHello.held_jobs``): more is refused.
MAX_HELD_JOBS = 20_000


class Shape(NamedTuple):
    """What :func:`measure` saw: ``depth`` (nested maps and lists), ``values`` (maps, lists and
    scalars), ``chars`` (characters of keys and strings)."""

    depth: int
    values: int
    chars: int


def measure(
    value: Any,
    *,
    field: str,
    max_depth: int = MAX_TEMPLATE_DEPTH,
    max_values: int = MAX_TEMPLATE_VALUES,
    max_chars: int = MAX_TEMPLATE_CHARS,
) -> Shape:
    """The :class:`Shape` of a JSON-like ``value`` (dicts, lists, scalars), checked against the
    limits on the way.

    Raises :class:`~gpufed.api.errors.FieldError` naming ``field`` (for depth: the path of the first value too
    deep, ``spec.template.spec.x[0].y`` …, shortened). Costs at most ``max_values`` steps,
    never recurses.
    """
    depth = 0
    values = 1
    chars = len(value) if isinstance(value, str) else 0
    stack: list[tuple[Any, int]] = [(value, 0)] if isinstance(value, (dict, list)) else []
    while stack:
        item, level = stack.pop()
        level += 1
        if level > max_depth:
            raise FieldError(
                _deep_path(value, max_depth, field),
                f"is nested more than {max_depth} maps and lists deep",
            )
        depth = max(depth, level)
        values += len(item)
        if values > max_values:
            # Checked before the children are looked at: a map of a million keys costs one
            # comparison.
            raise FieldError(
                field,
                f"holds more than {max_values} values (maps, lists and scalars); split the "
                "workload or keep large data out of the GPUJob (a ConfigMap or an image)",
            )
        children = item
        if isinstance(item, dict):
            for k in item:
                chars += len(k) if isinstance(k, str) else 1
            children = item.values()
        for v in children:
            if isinstance(v, str):
                chars += len(v)
            elif isinstance(v, (dict, list)):
                stack.append((v, level))
        if chars > max_chars:
            raise FieldError(
                field,
                f"holds more than {max_chars} characters of keys and strings; keep large data "
                "out of the GPUJob (a ConfigMap or an image)",
            )
    return Shape(depth, values, chars)


def _deep_path(value: Any, max_depth: int, field: str) -> str:
    """The path of the first container nested deeper than ``max_depth`` (only called once a
    walk found one; iterative too)."""
    stack: list[tuple[Any, int, str]] = [(value, 1, field)]
    while stack:
        item, level, path = stack.pop()
        if level > max_depth:
            return path if len(path) <= 200 else f"{path[:200]}…"
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for k, v in pairs:
            if isinstance(v, (dict, list)):
                sub = f"{path}.{k}" if isinstance(item, dict) else f"{path}[{k}]"
                stack.append((v, level + 1, sub if len(path) <= 200 else path))
    return field
