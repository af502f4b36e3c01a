"""HubState.jobs (gpufed.hub.components.term.JobTable) marks every job that enters or leaves it
and every later change of a followed attribute, for each follower, whichever path makes it."""

from __future__ import annotations

import pytest

from gpufed.api.gpujob import GPUJob, GPUJobStatus
from gpufed.hub.components.term import FOLLOWED, HubState, JobState
from tests.unit.hub.builders import gpujob_obj


def job(uid: str) -> JobState:
    return JobState(
        uid=uid,
        obj=GPUJob.model_validate(gpujob_obj("j", uid)),
        status=GPUJobStatus(),
        seen_mono=0.0,
    )


def test_entering_leaving_and_each_followed_change_mark_the_job_for_every_follower() -> None:
    state = HubState()
    other = state.follow()
    j = job("u1")
    j.status = GPUJobStatus(phase="Running")  # not in the table yet: nobody to tell
    assert state.touched == other == set()
    state.jobs["u1"] = j
    assert state.touched == other == {"u1"}
    for name in sorted(FOLLOWED):
        state.touched.clear()
        other.clear()
        setattr(j, name, getattr(j, name))
        assert state.touched == other == {"u1"}, name
    state.touched.clear()
    j.last_warning = "Unschedulable"  # not followed
    j.seen_mono = 5.0
    assert state.touched == set()
    assert state.jobs.pop("u1") is j
    assert state.touched == {"u1"}
    state.jobs["u2"] = job("u2")
    state.touched.clear()
    del state.jobs["u2"]
    assert state.touched == {"u2"}
    assert state.jobs.pop("u3", None) is None


def test_bulk_changes_that_would_bypass_the_marks_are_refused() -> None:
    state = HubState()
    for change in (
        lambda: state.jobs.update({"u1": job("u1")}),
        lambda: state.jobs.setdefault("u1", job("u1")),
        state.jobs.clear,
        state.jobs.popitem,
    ):
        with pytest.raises(TypeError):
            change()
    assert state.touched == set()
