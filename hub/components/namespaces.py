"""The hub cluster's Namespaces as intake needs them: each namespace's Pod Security level.

Fed by :mod:`gpufed.hub.components.intake` from a list+watch of Namespaces (the same loop as GPUJobs and
MemberClusters), and by a single read when a GPUJob arrives in a namespace the watch has not
shown yet (the two watches are not ordered). The level is the value of the namespace's
``pod-security.kubernetes.io/enforce`` label (:func:`gpufed.sync.podsecurity.parse_level`):
``HubConfig.default_pod_security`` when absent, ``restricted`` when the value is not a level.

Bounded: one short string per namespace (the level, not the object). One instance per leader
term.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpufed.api.labels import POD_SECURITY_ENFORCE_LABEL
from gpufed.sync.podsecurity import Level, parse_level


class NamespaceLevels:
    """Namespace name -> Pod Security enforce level (see the module docstring)."""

    def __init__(self, default: Level) -> None:
        self.default = default
        self._levels: dict[str, Level] = {}

    def __len__(self) -> int:
        return len(self._levels)

    def level(self, name: str) -> Level | None:
        """The level of namespace ``name``; None while the hub has not seen it."""
        return self._levels.get(name)

    def seen(self, name: str, labels: Mapping[str, Any] | None) -> Level:
        """Namespace ``name`` exists with ``labels`` (None: it does not exist; its jobs are
        going too, and the default level stands in). Returns its level."""
        value = (labels or {}).get(POD_SECURITY_ENFORCE_LABEL)
        level = parse_level(None if value is None else str(value), self.default)
        if labels is not None:
            self._levels[name] = level
        return level

    def on_event(self, type_: str, obj: Mapping[str, Any]) -> str:
        """A Namespace watch event; returns the namespace's name."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if type_ == "DELETED":
            self._levels.pop(name, None)
        else:
            self.seen(name, meta.get("labels") or {})
        return name

    def listed(self, names: Iterable[str]) -> None:
        """After a (re)list: forget namespaces that are gone."""
        present = set(names)
        for name in [n for n in self._levels if n not in present]:
            del self._levels[name]
