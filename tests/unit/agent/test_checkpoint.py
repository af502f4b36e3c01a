"""The job's reported checkpoint (annotation gpufed.io/last-checkpoint): the one parsing rule
(gpufed.sync.status), the agent's reporter forwarding the latest valid value of the member Job
or its pods, and bad values left out with a log line, never an exception."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gpufed.agent.status import StatusReporter
from gpufed.agent.status_watch import ObjectEvents as _ObjectEvents
from gpufed.agent.status_watch import PodEvents as _PodEvents
from gpufed.api.labels import LAST_CHECKPOINT_ANNOTATION
from gpufed.api.work import WorkloadStatus
from gpufed.sync.apply import ObjectRef
from gpufed.sync.status import last_checkpoint, parse_checkpoint

JOB = ObjectRef("batch/v1", "Job", "team-a", "train")
NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def annotated(name: str, checkpoint: str | None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "team-a",
        "labels": {"gpufed.io/job-uid": "u1"},
    }
    if checkpoint is not None:
        meta["annotations"] = {LAST_CHECKPOINT_ANNOTATION: checkpoint, "other": "x"}
    return {"metadata": meta, **extra}


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("2025-12-31T23:00:00Z", "2025-12-31T23:00:00Z"),
        ("2025-12-31T23:00:00.123456789Z", "2025-12-31T23:00:00Z"),
        ("2026-01-01T01:00:00+02:00", "2025-12-31T23:00:00Z"),
        ("2026-01-01T00:00:30Z", "2026-01-01T00:00:30Z"),  # within the clock skew
    ],
)
def test_rfc3339_values_are_accepted_in_canonical_utc(value: str, want: str) -> None:
    assert parse_checkpoint(value, now=NOW) == (want, "")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("yesterday", "not an RFC 3339 time"),
        ("2025-12-31T23:00:00", "with a time zone"),  # no zone: ambiguous
        ("2025-12-31", "with a time zone"),
        ("2026-01-01T01:00:00Z", "3600 s in the future"),
        ("9" * 10_000, "longer than 64 characters"),
    ],
)
def test_bad_values_are_refused_with_the_reason_never_raised(value: str, why: str) -> None:
    when, reason = parse_checkpoint(value, now=NOW)
    assert when == ""
    assert why in reason


def test_the_latest_valid_value_of_the_object_and_its_pods_wins() -> None:
    report = last_checkpoint(
        annotated("train", "2025-12-31T22:00:00Z"),
        [
            annotated("p0", "2025-12-31T23:30:00Z"),
            annotated("p1", "2027-01-01T00:00:00Z"),  # in the future: refused
            annotated("p2", None),
        ],
        now=NOW,
    )
    assert report.time == "2025-12-31T23:30:00Z"
    assert [(where, why) for where, _v, why in report.refused] == [
        ("pod p1", f"{365 * 86400:.0f} s in the future")
    ]


def reporter() -> tuple[StatusReporter, list[WorkloadStatus], _ObjectEvents, _PodEvents]:
    sent: list[WorkloadStatus] = []

    def send(s: WorkloadStatus) -> bool:
        sent.append(s)
        return True

    r = StatusReporter(None, send=send, wall=lambda: NOW)  # type: ignore[arg-type]
    r._informers["Job.batch"] = None  # type: ignore[assignment]  # the kind is watched
    return r, sent, _ObjectEvents(r, "Job.batch"), _PodEvents(r)


def test_the_agent_forwards_a_pod_checkpoint_and_sends_again_when_it_moves() -> None:
    r, sent, jobs, pods = reporter()
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(annotated("train", None, status={"active": 1}))
    pods.upsert(annotated("p0", "2025-12-31T23:00:00Z", status={"phase": "Running"}))
    r.flush()
    pods.upsert(annotated("p0", "2025-12-31T23:30:00Z", status={"phase": "Running"}))
    r.flush()
    assert [s.last_checkpoint_time for s in sent] == [
        "2025-12-31T23:00:00Z",
        "2025-12-31T23:30:00Z",
    ]


def test_a_bad_annotation_is_left_out_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    r, sent, jobs, pods = reporter()
    r.track("u1", revision=1, main=JOB)
    caplog.set_level(logging.WARNING)
    jobs.upsert(annotated("train", "not-a-time", status={"active": 1}))
    pods.upsert(annotated("p0", None, status={"phase": "Running"}))
    r.flush()
    pods.upsert(annotated("p0", None, status={"phase": "Running", "startTime": "x"}))
    r.flush()
    assert (sent[0].phase, sent[0].last_checkpoint_time) == ("Running", "")
    refused = [rec for rec in caplog.records if "status.checkpoint_refused" in rec.getMessage()]
    assert len(refused) == 1
