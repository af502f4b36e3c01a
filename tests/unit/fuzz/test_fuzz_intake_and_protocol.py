"""Fuzzing the hub's two untrusted edges with Hypothesis: GPUJob intake (placement_request and
prepare_manifests over arbitrary JSON-like templates) and every agent message
(AgentSession.receive over arbitrary AgentMessages). Each example must end in a result or a
documented error with a message (FieldError naming the field, StreamClosedError), never
another exception, and within the deadline (a hang detector, far above any real cost: the
stalls this caught took 30 s).

CI runs a few dozen examples per test; ``GPUFED_FUZZ_EXAMPLES=5000 pytest tests/unit/fuzz``
runs a longer campaign on demand.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufed.api.errors import FieldError
from gpufed.api.gpujob import GPUJob
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.hub.adapters.sessions import AgentSession, StreamClosedError
from gpufed.hub.rules.podsets import placement_request
from gpufed.sync.manifests import prepare_manifests

EXAMPLES = int(os.environ.get("GPUFED_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

quantities = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.from_regex(
        r"[+-]?[0-9]{0,30}(\.[0-9]{0,12})?(Ki|Mi|Gi|Ei|[numkKMGTPE]|[eE][+-]?[0-9]{1,12})?",
        fullmatch=True,
    ),
    st.text(max_size=40),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20), quantities)
json_like = st.recursive(
    scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=12), kids, max_size=4)
    ),
    max_leaves=30,
)


@st.composite
def templates(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly Job/JobSet/PyTorchJob/List shapes with fuzzed parts, sometimes anything."""
    container = {
        "name": "c",
        "image": "i",
        "resources": {
            draw(st.sampled_from(["limits", "requests"])): draw(
                st.dictionaries(
                    st.sampled_from(["nvidia.com/gpu", "cpu", "memory", "example.com/x"]),
                    quantities,
                    max_size=3,
                )
            )
        },
    }
    pod = {"metadata": draw(json_like), "spec": {"containers": [container], "x": draw(json_like)}}
    count = draw(st.one_of(st.none(), st.integers(min_value=-5, max_value=2**64), json_like))
    kind = draw(st.sampled_from(["Job", "JobSet", "PyTorchJob", "List", "ConfigMap", "Other"]))
    if kind == "Job":
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "spec": {"parallelism": count, "template": pod},
        }
    if kind == "JobSet":
        rj = {
            "name": draw(st.text(max_size=8)),
            "replicas": count,
            "template": {"spec": {"template": pod}},
        }
        return {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "spec": {"replicatedJobs": [rj]},
        }
    if kind == "PyTorchJob":
        return {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": count, "template": pod}}},
        }
    if kind == "List":
        return {"apiVersion": "v1", "kind": "List", "items": draw(st.lists(json_like, max_size=3))}
    out = draw(st.dictionaries(st.text(max_size=10), json_like, max_size=5))
    out.update({"apiVersion": draw(json_like), "kind": kind})
    return out


@FUZZ
@given(templates())
def test_intake_of_any_template_ends_in_a_request_or_a_named_error(
    template: dict[str, Any],
) -> None:
    job = GPUJob.model_validate(
        {
            "apiVersion": "gpufed.io/v1alpha1",
            "kind": "GPUJob",
            "metadata": {"name": "fuzz", "namespace": "team-a", "uid": "u-1"},
            "spec": {"template": template},
        }
    )
    refused: FieldError | None = None
    try:
        placement_request(job, submitted_at=0.0)
        prepare_manifests(
            job.spec.template, job_uid="u-1", job_name="fuzz", namespace="team-a", origin="hub"
        )
    except FieldError as exc:
        refused = exc
    if refused is not None:
        assert refused.field
        assert refused.message
        assert len(str(refused)) <= 1400, "a message that fits a status condition"


def pb_strings() -> st.SearchStrategy[str]:
    return st.one_of(st.text(max_size=12), st.sampled_from(["nvidia.com/gpu", "cpu", "a", ""]))


amounts = st.dictionaries(
    pb_strings(), st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=3
)
nodes = st.builds(
    pb.Node,
    name=pb_strings(),
    labels=st.dictionaries(pb_strings(), pb_strings(), max_size=3),
    gpu_product=pb_strings(),
    mig_strategy=st.sampled_from(["", "none", "single", "mixed", "wild"]),
    nvlink_domain=pb_strings(),
    taints=st.lists(
        st.builds(
            pb.Taint,
            key=pb_strings(),
            value=pb_strings(),
            effect=st.sampled_from(["NoSchedule", "", "x"]),
        ),
        max_size=2,
    ),
    allocatable=amounts,
    requested=amounts,
    degraded=pb_strings(),
)
u64 = st.integers(min_value=0, max_value=2**64 - 1)
u32 = st.integers(min_value=0, max_value=2**32 - 1)
i32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
messages = st.one_of(
    st.builds(lambda m: pb.AgentMessage(hello=m), st.builds(pb.Hello, cluster=pb_strings())),
    st.builds(
        lambda m: pb.AgentMessage(inventory_snapshot=m),
        st.builds(
            pb.InventorySnapshot,
            seq=u64,
            part=u32,
            final=st.booleans(),
            nodes=st.lists(nodes, max_size=3),
            served_kinds=st.lists(pb_strings(), max_size=2),
        ),
    ),
    st.builds(
        lambda m: pb.AgentMessage(inventory_delta=m),
        st.builds(
            pb.InventoryDelta,
            seq=u64,
            upserts=st.lists(nodes, max_size=3),
            removed=st.lists(pb_strings(), max_size=3),
        ),
    ),
    st.builds(lambda m: pb.AgentMessage(heartbeat=m), st.builds(pb.Heartbeat, inventory_seq=u64)),
    st.builds(
        lambda m: pb.AgentMessage(work_ack=m),
        st.builds(
            pb.WorkAck,
            job_uid=pb_strings(),
            revision=u64,
            result=st.integers(min_value=0, max_value=5),
            message=pb_strings(),
        ),
    ),
    st.builds(
        lambda m: pb.AgentMessage(workload_status=m),
        st.builds(
            pb.WorkloadStatus,
            job_uid=pb_strings(),
            revision=u64,
            kind=pb_strings(),
            phase=pb_strings(),
            active=i32,
            succeeded=i32,
            failed=i32,
            ready=i32,
            start_time=pb_strings(),
            nodes=st.lists(pb_strings(), max_size=2),
        ),
    ),
    st.builds(lambda m: pb.AgentMessage(resync_request=m), st.builds(pb.ResyncRequest)),
    st.just(pb.AgentMessage()),
)


@FUZZ
@given(st.lists(messages, min_size=1, max_size=6))
def test_any_agent_message_decodes_or_closes_the_stream_with_a_reason(
    msgs: list[pb.AgentMessage],
) -> None:
    session = AgentSession(cluster="m1")
    closed: StreamClosedError | None = None
    for msg in msgs:
        try:
            session.receive(msg)
        except StreamClosedError as exc:
            closed = exc
            break
    if closed is not None:
        assert closed.code in ("INVALID_ARGUMENT", "PERMISSION_DENIED")
        assert closed.reason
