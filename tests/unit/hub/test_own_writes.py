"""OwnWrites: a write's resourceVersion precondition skips exactly the hub's own writes of the
parts it may skip, never anyone else's.

The reference is a brute-force walk over the whole history of one object (every write, ours and
others', in commit order, with the resourceVersion before and after): from the view a write was
computed at, step forward while the next change is ours and of a part the write may skip.
"""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufed.hub.adapters.ownwrites import OwnWrites

PARTS = ("status", "finalizers")

#: one step: (who, part, age) — a write by ``who`` ("us"/"them") of ``part`` conditioned on
#: a view ``age`` versions old (0: the newest); who ``"check"``: where may a write of ``part``
#: computed at that view be conditioned?
steps = st.lists(
    st.tuples(
        st.sampled_from(("us", "them", "check")),
        st.sampled_from(PARTS),
        st.integers(0, 6),
    ),
    max_size=60,
)


def allowed(part: str) -> tuple[str, ...]:
    """The parts a write of ``part`` skips over (as KubeAPI uses it)."""
    return ("status", "finalizers") if part == "status" else ("status",)


def reference(history: list[tuple[int, int, str, str]], rv: int, over: tuple[str, ...]) -> int:
    """Walk the commit history (before, after, who, part) from ``rv``."""
    for before, after, who, part in history:
        if before == rv and who == "us" and part in over:
            rv = after
    return rv


@settings(max_examples=300, deadline=None)
@given(steps)
def test_a_precondition_skips_only_our_own_writes_of_the_parts_it_may(
    plan: list[tuple[str, str, int]],
) -> None:
    own = OwnWrites()
    rv = 1
    versions = [rv]
    history: list[tuple[int, int, str, str]] = []
    for who, part, age in plan:
        view = versions[max(0, len(versions) - 1 - age)]
        if who != "check":
            if who == "us":
                cond = int(own.rebase("job", str(view), allowed(part)))
                if cond != rv:
                    continue  # the API server answers 409: nothing is recorded
                own.record("job", part, str(cond), str(rv + 1))
            history.append((rv, rv + 1, who, part))
            rv += 1
            versions.append(rv)
        else:
            got = int(own.rebase("job", str(view), allowed(part)))
            assert got == reference(history, view, allowed(part))


def test_links_are_bounded_per_object_and_in_objects() -> None:
    own = OwnWrites(max_links=2, max_objects=2)
    for i in range(1, 5):
        own.record("a", "status", str(i), str(i + 1))
    assert own.rebase("a", "3", ("status",)) == "5"
    assert own.rebase("a", "1", ("status",)) == "1"  # the oldest links are gone
    own.record("b", "status", "1", "2")
    own.record("c", "status", "1", "2")  # "a" was written least recently: forgotten
    assert own.rebase("a", "3", ("status",)) == "3"
    assert own.rebase("b", "1", ("status",)) == "2"
    own.forget("b")
    assert own.rebase("b", "1", ("status",)) == "1"
    own.record("c", "status", "", "7")  # no precondition: nothing proven
    own.record("c", "status", "7", "7")
    assert own.rebase("c", "7", ("status",)) == "7"


async def test_writes_of_one_object_are_serial_and_its_lock_is_dropped_after() -> None:
    own = OwnWrites()
    order: list[str] = []

    async def write(key: str, tag: str) -> None:
        async with own.serial(key):
            order.append(f"{tag}+")
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            order.append(f"{tag}-")

    await asyncio.gather(write("a", "1"), write("a", "2"), write("b", "3"))
    assert order.index("1-") < order.index("2+")  # one write of "a" at a time
    assert order.index("3+") < order.index("1-")  # another object does not wait
    assert own._locks == {}
