"""A decoded node's labels without a dict of its own: its shape's labels plus its own values.

Nodes of one pool share every label but a few (``kubernetes.io/hostname``, the topology labels):
a full per-node copy was ~580 bytes a node, the largest single cost of a node the hub holds
(issue 25: hub RSS at 100 members x 5,000 nodes). :class:`NodeLabels` is a read-only
``Mapping[str, str]`` over the shape's dict and a :class:`LabelLayout` (the own keys, shared by
every node of the shape with the same own keys) with a tuple of the node's own values: ~100
bytes a node.

It reads exactly as the dict ``{**base, **dict(zip(keys, values))}`` (same keys, values and
iteration order; a key given twice keeps its first place and its last value, as
``dict.update`` does); it compares equal to that dict, and ``copy()``, ``copy.copy``,
``copy.deepcopy`` and pickling give a plain dict of the same items. Changing it raises
``TypeError`` (``__setitem__`` and ``__delitem__`` refuse): inventory is never mutated in
place, only replaced.
The base dict must not change after the first :class:`LabelLayout` over it is made.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

_MISSING: Any = object()


class LabelLayout:
    """The own label keys of a group of nodes over one base (a shape's labels).

    ``base``: the shared labels; ``keys``: the own keys, each once, in the order they first
    appear; ``pick``: for each of ``keys``, the index in a node's raw values (the last one
    given for that key), or None when the raw values are already one per key in order;
    ``extra``: ``keys`` not in ``base`` (iterated after ``base``'s keys); ``size``: the number
    of labels. Immutable by convention; make one per distinct (base, raw keys) and share it."""

    __slots__ = ("base", "extra", "keys", "pick", "pos", "size")

    def __init__(self, base: dict[str, str], raw_keys: tuple[str, ...]) -> None:
        last: dict[str, int] = {}
        for i, k in enumerate(raw_keys):
            last[k] = i
        self.base = base
        self.keys: tuple[str, ...] = tuple(last)
        self.pick: tuple[int, ...] | None = (
            None if len(last) == len(raw_keys) else tuple(last.values())
        )
        self.pos: dict[str, int] = {k: i for i, k in enumerate(self.keys)}
        self.extra: tuple[str, ...] = tuple(k for k in self.keys if k not in base)
        self.size = len(base) + len(self.extra)

    def labels(self, raw_values: tuple[str, ...]) -> NodeLabels:
        """One node's labels from its raw own values (one per raw key, in order)."""
        pick = self.pick
        values = raw_values if pick is None else tuple(raw_values[i] for i in pick)
        return NodeLabels(self, values)


class NodeLabels(Mapping[str, str]):
    """A node's labels: ``layout.base`` overlaid with ``layout.keys`` -> ``values`` (read-only;
    see the module's docstring)."""

    __slots__ = ("_layout", "_values")

    def __init__(self, layout: LabelLayout, values: tuple[str, ...]) -> None:
        self._layout = layout
        self._values = values

    @property
    def layout(self) -> LabelLayout:
        """The shared layout (base labels and own keys); for encoders that write a shape once."""
        return self._layout

    @property
    def own_values(self) -> tuple[str, ...]:
        """The node's own values, one per ``layout.keys``."""
        return self._values

    def __getitem__(self, key: str) -> str:
        i = self._layout.pos.get(key)
        if i is not None:
            return self._values[i]
        return self._layout.base[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""
        i = self._layout.pos.get(key)
        if i is not None:
            return self._values[i]
        return self._layout.base.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._layout.pos or key in self._layout.base

    def __iter__(self) -> Iterator[str]:
        yield from self._layout.base
        yield from self._layout.extra

    def __len__(self) -> int:
        return self._layout.size

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NodeLabels) and other._layout is self._layout:
            return other._values == self._values
        if not isinstance(other, Mapping) or len(other) != self._layout.size:
            return False if isinstance(other, Mapping) else NotImplemented
        get = other.get
        return all(get(k, _MISSING) == v for k, v in self.items())

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]  # as dict's

    def copy(self) -> dict[str, str]:
        """A plain dict of the same labels (the way to change them)."""
        return dict(self.items())

    def __copy__(self) -> dict[str, str]:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, object]) -> dict[str, str]:
        return self.copy()

    def __reduce__(self) -> tuple[type, tuple[dict[str, str]]]:
        return (dict, (self.copy(),))

    def __or__(self, other: Mapping[str, str]) -> dict[str, str]:
        return {**self, **other}

    def __ror__(self, other: Mapping[str, str]) -> dict[str, str]:
        return {**other, **self}

    def __setitem__(self, key: str, value: str) -> NoReturn:
        raise TypeError("a decoded node's labels are read-only: copy() them to change them")

    def __delitem__(self, key: str) -> NoReturn:
        raise TypeError("a decoded node's labels are read-only: copy() them to change them")

    def __repr__(self) -> str:
        return repr(dict(self.items()))
