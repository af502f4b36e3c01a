"""Sets of node names read without copying them: the union of disjoint frozensets.

A hold's nodes (:class:`gpufed.placement.queue.Hold`) can be the whole free nodes of every pool
of a member (:func:`gpufed.placement.holds.whole_free_nodes`): thousands of names per member,
kept per pool in the placement memo. Building their union as one frozenset for every member,
job size and scheduling pass cost the hub most of its CPU on a large idle fleet (issue 25:
``gpufed bench scale --members 100 --nodes-per-member 5000``, 37 % of the hub's samples).
:class:`NodeUnion` answers the same questions as that frozenset (membership, size, iteration,
equality, the set operators) from the pools' own sets.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Set
from itertools import chain
from typing import Any


class NodeUnion(Set[str]):
    """The union of pairwise disjoint frozensets of node names, as a read-only set.

    ``parts``: the frozensets, each disjoint from the others (the caller's promise: nodes of
    different pools, or of different free-GPU counts of one pool); none is copied. ``len`` is
    the sum of the parts' sizes, ``in`` asks each part (O(parts)), iteration chains them.
    Equal to, and hashed as, the frozenset of the same names. The set operators
    (``|``, ``&``, ``-``, ``^``) return plain frozensets.
    """

    __slots__ = ("_len", "_parts")

    def __init__(self, parts: Iterable[frozenset[str]]) -> None:
        self._parts = tuple(p for p in parts if p)
        self._len = sum(len(p) for p in self._parts)

    @classmethod
    def of(cls, parts: Iterable[frozenset[str]]) -> Set[str]:
        """The union of ``parts`` (pairwise disjoint): one part itself when only one is not
        empty, an empty frozenset when none, else a :class:`NodeUnion`."""
        kept = [p for p in parts if p]
        if not kept:
            return frozenset()
        if len(kept) == 1:
            return kept[0]
        return cls(kept)

    @property
    def parts(self) -> tuple[frozenset[str], ...]:
        """The non-empty frozensets the union reads (pairwise disjoint)."""
        return self._parts

    def __contains__(self, name: object) -> bool:
        return any(name in p for p in self._parts)

    def __iter__(self) -> Iterator[str]:
        return chain.from_iterable(self._parts)

    def __len__(self) -> int:
        return self._len

    def __hash__(self) -> int:
        return self._hash()

    def isdisjoint(self, other: Iterable[Any]) -> bool:
        if isinstance(other, NodeUnion):
            return all(p.isdisjoint(q) for p in self._parts for q in other._parts)
        if isinstance(other, (set, frozenset)):
            return all(p.isdisjoint(other) for p in self._parts)
        return super().isdisjoint(other)

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> frozenset[Any]:
        return frozenset(it)

    def __repr__(self) -> str:
        return f"NodeUnion({sorted(self)!r})"


def parts_of(names: Set[str]) -> tuple[frozenset[str], ...]:
    """The frozensets ``names`` is made of: a :class:`NodeUnion`'s parts, or ``names`` itself
    (copied into a frozenset only when it is not one)."""
    if isinstance(names, NodeUnion):
        return names.parts
    if not names:
        return ()
    return (names if isinstance(names, frozenset) else frozenset(names),)
