"""Coalescing status writes, `gpufed submit` wrapping, CLI JSON rows and sandbox certificates."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from gpufed.cli.jobs import cluster_rows, explain_text, job_rows, wrap
from gpufed.hub.adapters.writer import CoalescingWriter
from gpufed.hub.edge.certs import generate
from tests.unit.fake_time import FakeClock
from tests.unit.hub.builders import batch_job


class ApiStatusError(Exception):
    """An API error as the Kubernetes client raises it: the writer reads only ``status``."""

    def __init__(self, status: int, body: str = "") -> None:
        super().__init__(body or str(status))
        self.status = status
        self.body = body


async def test_a_burst_of_updates_to_one_key_becomes_the_latest_write() -> None:
    written: list[tuple[str, Any]] = []
    gate = asyncio.Event()

    async def write(key: str, value: Any) -> None:
        await gate.wait()
        written.append((key, value))

    w = CoalescingWriter("t", write, workers=2)
    w.start()
    w.submit("a", 1)
    await asyncio.sleep(0)
    for v in (2, 3, 4):
        w.submit("a", v)
    w.submit("b", 1)
    gate.set()
    await w.drained()
    await w.stop()
    assert [v for k, v in written if k == "a"] == [1, 4]
    assert [v for k, v in written if k == "b"] == [1]


async def test_a_value_equal_to_the_last_write_is_skipped_and_gone_keys_are_dropped() -> None:
    calls: list[Any] = []

    async def write(key: str, value: Any) -> None:
        calls.append(value)
        if value == "gone":
            raise ApiStatusError(404)

    w = CoalescingWriter("t", write)
    w.start()
    w.submit("a", "x")
    await w.drained()
    w.submit("a", "x")
    await w.drained()
    w.submit("a", "gone")
    await w.drained()
    await w.stop()
    assert calls == ["x", "gone"]
    assert w.last_written("a") is None


def test_submit_wraps_a_plain_job_reading_placement_annotations() -> None:
    job = batch_job(8)
    job["metadata"]["annotations"] = {
        "gpufed.io/gpu-products": "NVIDIA-H100-80GB-HBM3, NVIDIA-H200",
        "gpufed.io/nvlink": "Required",
        "gpufed.io/priority": "100",
    }
    out = wrap(job, "team-a")
    assert out["kind"] == "GPUJob"
    assert out["metadata"] == {
        "name": "train",
        "namespace": "team-a",
        "labels": {},
        "annotations": job["metadata"]["annotations"],
    }
    assert out["spec"]["placement"] == {
        "gpuProducts": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"],
        "topology": {"nvlink": "Required"},
        "priority": 100,
    }
    assert out["spec"]["template"]["spec"] == job["spec"]


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"kind": "Deployment", "apiVersion": "apps/v1"}, "not a GPUJob"),
        ({"metadata": {"annotations": {"gpufed.io/nvlink": "Always"}, "name": "x"}}, "nvlink"),
        ({"metadata": {"annotations": {"gpufed.io/priority": "high"}, "name": "x"}}, "priority"),
        ({"metadata": {}}, "metadata.name"),
    ],
)
def test_submit_refuses_what_it_cannot_wrap(patch: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        wrap({**batch_job(), **patch}, "team-a")


def test_a_gpujob_is_submitted_as_is_in_the_given_namespace() -> None:
    obj = {"apiVersion": "gpufed.io/v1alpha1", "kind": "GPUJob", "metadata": {"name": "g"}}
    assert wrap(obj, "team-b")["metadata"]["namespace"] == "team-b"


def test_get_rows_carry_the_documented_keys() -> None:
    job = {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "GPUJob",
        "metadata": {"name": "j", "namespace": "team-a"},
        "spec": {"template": batch_job()},
        "status": {"phase": "Running", "cluster": "m1", "gpus": 8},
    }
    (row,) = job_rows([job])
    assert {k: row[k] for k in ("name", "namespace", "phase", "cluster", "gpus")} == {
        "name": "j",
        "namespace": "team-a",
        "phase": "Running",
        "cluster": "m1",
        "gpus": 8,
    }
    member = {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "MemberCluster",
        "metadata": {"name": "m1"},
        "spec": {"joinTokenRef": {"name": "t"}},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "gpusTotal": {"NVIDIA-H100-80GB-HBM3": 16},
            "gpusFree": {"NVIDIA-H100-80GB-HBM3": 8},
            "largestFreeNVLinkBlock": 8,
        },
    }
    (crow,) = cluster_rows([member])
    assert {
        k: crow[k]
        for k in ("name", "ready", "gpus_total", "gpus_free", "largest_free_nvlink_block")
    } == {
        "name": "m1",
        "ready": True,
        "gpus_total": {"NVIDIA-H100-80GB-HBM3": 16},
        "gpus_free": {"NVIDIA-H100-80GB-HBM3": 8},
        "largest_free_nvlink_block": 8,
    }


def test_explain_of_a_pending_job_lists_each_member_and_why() -> None:
    job = {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "GPUJob",
        "metadata": {"name": "j", "namespace": "team-a", "uid": "u"},
        "spec": {"template": batch_job()},
        "status": {
            "phase": "Pending",
            "message": "waiting: no member has 8 free GPUs on one node",
            "placement": {
                "outcome": "Unschedulable",
                "message": "no member has 8 free GPUs on one node",
                "rejections": [
                    {
                        "cluster": "m1",
                        "plugin": "TopologyFit",
                        "code": "Unschedulable",
                        "reason": "largest free block is 4",
                    },
                    {
                        "cluster": "m2",
                        "plugin": "GPUProduct",
                        "code": "UnschedulableAndUnresolvable",
                        "reason": "no NVIDIA-H100-80GB-HBM3",
                    },
                ],
            },
        },
    }
    text = explain_text(job)
    assert "GPUJob team-a/j: Pending" in text
    assert "m1" in text
    assert "largest free block is 4" in text
    assert "m2" in text
    assert "GPUProduct" in text


def test_sandbox_certificates_verify_for_localhost(tmp_path: Path) -> None:
    files = generate(tmp_path, hosts=("hub.example", "10.1.2.3"))
    cert = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "hub.example" in san.get_values_for_type(x509.DNSName)
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    ctx = ssl.create_default_context(cafile=str(files.ca_cert))
    ctx.load_verify_locations(cafile=str(files.ca_cert))
    assert oct(files.server_key.stat().st_mode)[-3:] == "600"
    again = generate(tmp_path)
    assert again.server_cert.read_bytes() == files.server_cert.read_bytes(), "kept, not replaced"


async def test_updates_soon_after_a_write_wait_out_the_interval_and_coalesce() -> None:
    writes: list[tuple[str, Any]] = []
    other_written = asyncio.Event()

    async def write(key: str, value: Any) -> None:
        writes.append((key, value))
        if key == "other":
            other_written.set()

    clock = FakeClock()
    w = CoalescingWriter(
        "t", write, workers=1, min_interval_s=0.2, clock=clock.time, sleep=clock.sleep
    )
    w.start()
    try:
        w.submit("job", "Placed")
        await w.drained()
        w.submit("job", "Dispatched")  # within the interval: held back ...
        w.submit("job", "Running")  # ... and replaced by the latest value
        w.submit("other", "Placed")  # another key is not held up by it
        await asyncio.wait_for(other_written.wait(), 5)
        await asyncio.wait_for(clock.until_sleeping(), 5)  # "job" waits for the interval
        assert writes == [("job", "Placed"), ("other", "Placed")]
        clock.advance(0.1)  # half the interval: still held back
        for _ in range(5):
            await asyncio.sleep(0)
        assert writes == [("job", "Placed"), ("other", "Placed")]
        clock.advance(0.1)
        await asyncio.wait_for(w.drained(), 5)
        assert writes == [("job", "Placed"), ("other", "Placed"), ("job", "Running")]
        assert clock.requested == [0.2]
    finally:
        await w.stop()


async def test_a_change_after_a_quiet_spell_is_held_and_what_follows_soon_joins_it() -> None:
    writes: list[tuple[str, Any]] = []

    async def write(key: str, value: Any) -> None:
        writes.append((key, value))

    clock = FakeClock()
    w = CoalescingWriter(
        "t", write, workers=1, min_interval_s=0.2, hold_s=0.25, clock=clock.time, sleep=clock.sleep
    )
    w.start()
    try:
        w.submit("job", "Placed")
        await asyncio.wait_for(clock.until_sleeping(), 5)
        w.submit("job", "Dispatched")  # held with it: no second timer
        w.submit("job", "Running")
        for _ in range(5):
            await asyncio.sleep(0)
        assert writes == []
        assert clock.requested == [0.25]
        clock.advance(0.25)
        await asyncio.wait_for(w.drained(), 5)
        assert writes == [("job", "Running")]
        w.submit("job", "Succeeded", urgent=True)  # not held, not held back by the interval
        await asyncio.wait_for(w.drained(), 5)
        assert writes == [("job", "Running"), ("job", "Succeeded")]
        assert clock.requested == [0.25]
    finally:
        await w.stop()


async def test_an_urgent_value_goes_ahead_of_the_queue_and_past_the_interval() -> None:
    writes: list[tuple[str, Any]] = []
    writing = asyncio.Event()
    gate = asyncio.Event()

    async def write(key: str, value: Any) -> None:
        writing.set()
        await gate.wait()
        writes.append((key, value))

    clock = FakeClock()
    w = CoalescingWriter(
        "t", write, workers=1, min_interval_s=10.0, clock=clock.time, sleep=clock.sleep
    )
    w.start()
    try:
        for key in ("a", "b", "c"):
            w.submit(key, "Running")
        await asyncio.wait_for(writing.wait(), 5)  # the worker holds "a"
        w.submit("c", "Succeeded", urgent=True)  # queued as normal: moved ahead
        w.submit("d", "Failed", urgent=True)
        gate.set()
        await w.drained()
        assert writes == [("a", "Running"), ("c", "Succeeded"), ("d", "Failed"), ("b", "Running")]
        w.submit("a", "Succeeded", urgent=True)  # written 0 s ago: not held back
        await asyncio.wait_for(w.drained(), 5)
        assert writes[-1] == ("a", "Succeeded")
        assert clock.requested == []
    finally:
        await w.stop()


async def test_a_failed_write_pauses_a_second_then_writes_the_value_again() -> None:
    calls: list[Any] = []

    async def write(key: str, value: Any) -> None:
        calls.append(value)
        if len(calls) == 1:
            raise ConnectionError("hub API server unreachable")

    clock = FakeClock()
    w = CoalescingWriter("t", write, clock=clock.time, sleep=clock.sleep)
    w.start()
    try:
        w.submit("a", "Running")
        await asyncio.wait_for(clock.until_sleeping(), 5)
        assert clock.requested == [1.0]
        assert calls == ["Running"]
        clock.advance(1.0)
        await asyncio.wait_for(w.drained(), 5)
        assert calls == ["Running", "Running"]
        assert w.last_written("a") == "Running"
    finally:
        await w.stop()


async def test_a_value_the_api_server_refuses_is_not_retried_but_a_new_value_is_written() -> None:
    # A status the CRD schema refuses (422) was retried every second, forever.
    calls: list[Any] = []

    async def write(key: str, value: Any) -> None:
        calls.append(value)
        if value == "invalid":
            raise ApiStatusError(422, "422 Unprocessable Entity")

    clock = FakeClock()
    w = CoalescingWriter("t", write, clock=clock.time, sleep=clock.sleep)
    w.start()
    w.submit("a", "invalid")
    await asyncio.wait_for(w.drained(), 5)
    assert clock.requested == []  # no pause-and-retry
    w.submit("a", "invalid")
    await w.drained()
    w.submit("a", "fixed")
    await w.drained()
    await w.stop()
    assert calls == ["invalid", "fixed"]
    assert w.last_written("a") == "fixed"


async def test_the_default_job_status_writer_keeps_up_with_25_job_endings_a_second() -> None:
    # `gpufed bench scale` at 25 jobs/s: each job's end is one urgent status write, and a
    # loaded hub API server takes ~0.4 s a write (docs/benchmarks.md, "The hub at fleet
    # scale"). The writer keeps up only with 25 x 0.4 = 10 or more writes in flight; with 8 the
    # backlog grew for the whole run (status p50 76 s).
    from gpufed.hub.components.config import HubConfig

    needed = 10
    in_flight, most = 0, 0
    gate = asyncio.Event()

    async def write(key: str, value: Any) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await gate.wait()
        in_flight -= 1

    workers = HubConfig.model_fields["status_writers"].default
    w = CoalescingWriter("t", write, workers=workers)
    w.start()
    for i in range(2 * needed):
        w.submit(f"job-{i}", "Succeeded", urgent=True)
    for _ in range(5):
        await asyncio.sleep(0)
    gate.set()
    await w.drained()
    await w.stop()
    assert most >= needed
