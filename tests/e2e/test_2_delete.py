"""Delete on the hub: the member's Job and pods go, the GPUs come back in the hub's inventory,
and only then the GPUJob is gone (docs/design.md §7 item 3)."""

from __future__ import annotations

import pytest

from tests.e2e.harness import E2E, H100, batch_job, unique, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_delete_removes_member_objects_and_pods_and_frees_the_gpus(e2e: E2E) -> None:
    hub, member = e2e.hub, e2e.members["us-east-hgx"]
    total = hub.gpus_total("us-east-hgx", H100)
    assert hub.gpus_free("us-east-hgx", H100) == total  # the fleet is idle
    name = unique("delete-me")
    uid = hub.submit(name, batch_job(8, pods=2), placement={"gpuProducts": [H100]})["metadata"][
        "uid"
    ]
    st = hub.wait_phase(name, "Running")
    assert st["cluster"] == "us-east-hgx"
    wait_until(lambda: len(member.pods_of(uid, running=True)) == 2, "2 pods running")
    wait_until(
        lambda: hub.gpus_free("us-east-hgx", H100) == total - 16,
        "the hub's inventory shows 16 GPUs in use",
        30,
    )

    hub.delete(name)
    wait_until(lambda: hub.job(name) is None, "the GPUJob gone (finalizer removed)")
    # The hub removes its finalizer only after the agent deleted the member objects.
    assert member.jobs_of(uid) == []
    wait_until(lambda: member.pods_of(uid) == [], "the member's pods gone")
    wait_until(
        lambda: hub.gpus_free("us-east-hgx", H100) == total,
        "the GPUs back in the hub's inventory",
        30,
    )
