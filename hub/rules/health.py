"""Member health from the hub's own receive times (docs/design.md §7 item 5), as pure functions.

Called by the leader's health tick (:mod:`gpufed.hub.components.members`) once a second with the monotonic
clock; unit tests call it with made-up times. Member clocks are never read.

- A member is ``Ready`` while the hub heard from its agent within ``lease_s``;
- ``NotReady`` after that (placement skips it; no new work goes there);
- ``Lost`` after ``lost_s`` of silence: its jobs follow ``spec.placement.reschedule``.

Every timer counts from ``max(last message, hub_start)``: ``hub_start`` is when this replica
became leader, so a hub that was down itself never mistakes its own outage for every member's
(docs/design.md §7 item 5). A member already declared lost stays lost (the mark is kept in etcd)
until its agent connects again.
"""

from __future__ import annotations

from typing import Literal

MemberHealth = Literal["Ready", "NotReady", "Lost"]


def health_at(
    *,
    now: float,
    last_heard: float | None,
    hub_start: float,
    lease_s: float,
    lost_s: float,
    marked_lost: bool = False,
) -> MemberHealth:
    """Health of one member at ``now`` (monotonic seconds, the same clock for every argument).

    ``last_heard``: when the hub last received any message from the member's agent (None:
    never since this replica started). ``marked_lost``: declared lost earlier (kept until the
    agent reconnects, which resets ``last_heard`` past the mark).
    """
    if marked_lost and last_heard is None:
        return "Lost"
    since = max(last_heard if last_heard is not None else hub_start, hub_start)
    silent = now - since
    if silent > lost_s:
        return "Lost"
    if silent > lease_s:
        return "NotReady"
    return "Ready"


def silence(*, now: float, last_heard: float | None, hub_start: float) -> float:
    """Seconds of silence as the timers count them (from ``max(last_heard, hub_start)``)."""
    since = max(last_heard if last_heard is not None else hub_start, hub_start)
    return max(0.0, now - since)
