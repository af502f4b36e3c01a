"""The console's fair-share history: one sample per queue per minute (the latest value of the
minute kept), a day of samples, a bounded number of queues."""

from __future__ import annotations

from typing import Any

from gpufed.console import server
from gpufed.console.server import ShareHistory


def q(name: str, share: str | None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {} if share is None else {"fairShare": share}}


def test_one_sample_a_minute_keeping_the_latest_value() -> None:
    now = [0.0]
    h = ShareHistory(clock=lambda: now[0])
    h.note([q("a", "1"), q("b", None), q("c", "not-a-number")])
    now[0] = 30.0
    h.note([q("a", "2")])
    now[0] = 61.0
    h.note([q("a", "3")])
    assert h.of("a") == [(0.0, 2.0), (61.0, 3.0)]
    assert h.of("b") == []
    assert h.of("c") == []


def test_a_day_of_samples_and_a_bounded_number_of_queues(monkeypatch: Any) -> None:
    monkeypatch.setattr(server, "SHARE_QUEUES", 2)
    now = [0.0]
    h = ShareHistory(clock=lambda: now[0])
    for i in range(server.SHARE_SAMPLES + 10):
        now[0] = i * server.SHARE_EVERY_S
        h.note([q("a", str(i)), q("b", "0"), q("c", "0")])
    line = h.of("a")
    assert len(line) == server.SHARE_SAMPLES
    assert line[-1][1] == server.SHARE_SAMPLES + 9
    assert line[0][1] == 10  # the oldest went first
    assert h.of("c") == []


def test_the_hubs_day_comes_first_then_what_the_console_saw_since() -> None:
    # the hub keeps a day of samples in the GPUQueue status: a console started a minute ago
    # still plots the day (issue 30)
    now = [1_767_225_600.0 + 1800]  # 2026-01-01T00:30:00Z
    h = ShareHistory(clock=lambda: now[0])
    hub = [
        {"time": "2026-01-01T00:00:00Z", "value": "1"},
        {"time": "not a time", "value": "9"},
        {"time": "2026-01-01T00:15:00.000000Z", "value": "2"},
    ]
    h.note([{"metadata": {"name": "a"}, "status": {"fairShare": "3", "fairShareHistory": hub}}])
    assert h.of("a") == [(1_767_225_600.0, 1.0), (1_767_226_500.0, 2.0), (now[0], 3.0)]
