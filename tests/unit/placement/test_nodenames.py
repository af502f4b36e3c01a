"""``NodeUnion`` (gpufed.placement.nodenames) behaves as the frozenset of the same names.

Reference: the frozenset built by copying every part (what ``whole_free_nodes`` built before),
compared through each operation a hold's nodes meet in placement (membership, size,
iteration, equality and hash, ``isdisjoint``, the set operators with frozensets, sets and other
unions, a ``Hold.merged``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufed.placement.nodenames import NodeUnion, parts_of
from gpufed.placement.queue import Hold

NAMES = [f"n{i}" for i in range(12)]


@st.composite
def disjoint_parts(draw: Any) -> list[frozenset[str]]:
    """Up to four pairwise disjoint frozensets (some empty) over ``NAMES``."""
    owner = draw(st.lists(st.integers(-1, 3), min_size=len(NAMES), max_size=len(NAMES)))
    return [frozenset(n for n, o in zip(NAMES, owner, strict=True) if o == k) for k in range(4)]


names_sets = st.frozensets(st.sampled_from(NAMES))


@given(disjoint_parts(), disjoint_parts(), names_sets)
def test_a_union_answers_as_the_frozenset_of_its_names(
    parts: list[frozenset[str]], other_parts: list[frozenset[str]], other: frozenset[str]
) -> None:
    ref = frozenset().union(*parts)
    u = NodeUnion(parts)
    v = NodeUnion(other_parts)
    ref_v = frozenset().union(*other_parts)
    assert len(u) == len(ref)
    assert sorted(u) == sorted(ref)
    assert bool(u) == bool(ref)
    for n in [*NAMES, "x", 3]:
        assert (n in u) == (n in ref)
    assert u == ref
    assert ref == u
    assert hash(u) == hash(ref)
    assert (u == other) == (ref == other)
    assert (u == v) == (ref == ref_v)
    for o in (other, set(other), v, list(other)):
        want = ref_v if o is v else frozenset(o)
        assert u.isdisjoint(o) == ref.isdisjoint(want)
    for o, want in ((other, other), (set(other), other), (v, ref_v)):
        assert u | o == ref | want
        assert o | u == want | ref
        assert u & o == ref & want
        assert o & u == want & ref
        assert u - o == ref - want
        assert o - u == want - ref
        assert u ^ o == ref ^ want
        assert isinstance(u | o, frozenset)
        assert isinstance(u & o, frozenset)
    assert u <= ref
    assert u >= ref
    assert not (u < ref)
    assert frozenset(parts_of(u)) <= frozenset(parts)
    assert frozenset().union(*parts_of(u)) == ref


@given(disjoint_parts(), names_sets)
def test_holds_merge_a_union_as_its_frozenset(
    parts: list[frozenset[str]], other: frozenset[str]
) -> None:
    u = NodeUnion.of(parts)
    ref = frozenset().union(*parts)
    a, b = Hold("m", u, "spare"), Hold("m", other, "held", 5.0)
    want = Hold("m", ref, "spare").merged(Hold("m", other, "held", 5.0))
    assert a.merged(b) == want
    assert b.merged(a).nodes == Hold("m", other, "held", 5.0).merged(Hold("m", ref, "spare")).nodes


def test_of_copies_nothing() -> None:
    a, b = frozenset({"a"}), frozenset({"b", "c"})
    assert NodeUnion.of([frozenset(), a]) is a
    assert NodeUnion.of([frozenset(), frozenset()]) == frozenset()
    u = NodeUnion.of([a, frozenset(), b])
    assert isinstance(u, NodeUnion)
    assert u.parts[0] is a
    assert u.parts[1] is b
    assert parts_of(u) == (a, b)
    assert parts_of(a) == (a,)
    assert parts_of(frozenset()) == ()


def test_a_union_is_read_only() -> None:
    u = NodeUnion([frozenset({"a"}), frozenset({"b"})])
    with pytest.raises(AttributeError):
        u.add("c")  # type: ignore[attr-defined]
    v: Any = u
    v |= {"c"}  # rebinds v to a new frozenset; u keeps its names
    assert u == {"a", "b"}
    assert v == {"a", "b", "c"}
