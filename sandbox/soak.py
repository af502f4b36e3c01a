"""``gpufed bench soak``: the chaos soak, end to end (issue 26; docs/benchmarks.md, "Chaos
soak").

1. A fresh sandbox with the soak fleet (:func:`gpufed.sandbox.soakload.soak_fleet`), the hub
   as two replicas with leader election (:class:`~gpufed.sandbox.hubpair.HubPair`) and one
   agent per member, short timers (:data:`SOAK_OPTIONS`);
2. the soak's GPUQueues and PriorityClasses on the hub;
3. the observer (:mod:`gpufed.sandbox.soakwatch`) polls the API servers into the history;
4. for ``minutes``: the seeded job stream is created while the seeded faults
   (:mod:`gpufed.sandbox.faults`) are injected;
5. the drain: faults undone, the run waits (at most ``drain_s``) until every job is terminal;
6. the verdict: :func:`gpufed.sandbox.soakcheck.check` over the history file alone.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpufed.api.labels import GROUP, VERSION
from gpufed.sandbox.controlplane import ControlPlaneOptions
from gpufed.sandbox.e2e_harness import fresh_sandbox
from gpufed.sandbox.faults import FAULT_KINDS, FaultRunner, fault_schedule
from gpufed.sandbox.hubpair import HubPair
from gpufed.sandbox.soakcheck import TERMINAL, check, load
from gpufed.sandbox.soakload import (
    NAMESPACES,
    PRIORITY_CLASSES,
    job_schedule,
    soak_fleet,
    soak_queues,
)
from gpufed.sandbox.soakwatch import Observer

Progress = Callable[[str], None]

#: Timers of the soak's control plane: faults of seconds to a minute, re-runs within the run.
SOAK_OPTIONS = ControlPlaneOptions(
    member_lease_s=5,
    member_lost_s=180,
    heartbeat_s=1,
    leader_lease_s=5,
    ready_timeout_s=180,
    hub_args=[
        "--rerun-backoff-base",
        "2",
        "--rerun-backoff-max",
        "30",
        "--suspect-node-cooldown",
        "90",
    ],
)


def _retry(fn: Callable[[], Any], what: str, timeout_s: float = 90.0) -> Any:
    """``fn()`` until it does not raise a connection error or 5xx (an API server or etcd being
    restarted by a fault); the last error after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except ApiException as exc:
            if exc.status == 409:
                return None  # already there (a retried create)
            if exc.status not in (None, 0, 429, 500, 502, 503, 504) or time.monotonic() > deadline:
                raise RuntimeError(f"{what}: {exc.status} {exc.reason}") from exc
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: {exc}") from exc
        except Exception as exc:  # urllib3 errors under a restarting API server
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: {exc}") from exc
        time.sleep(1.0)


def prepare_hub(api: k8s.ApiClient) -> None:
    """Namespaces, PriorityClasses and GPUQueues of the soak on the hub cluster."""
    core: Any = k8s.CoreV1Api(api)
    custom: Any = k8s.CustomObjectsApi(api)
    sched: Any = k8s.SchedulingV1Api(api)
    for ns in NAMESPACES:
        _retry(partial(core.create_namespace, {"metadata": {"name": ns}}), f"namespace {ns}")
    for name, value in PRIORITY_CLASSES.items():
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
            "preemptionPolicy": "PreemptLowerPriority",
        }
        _retry(partial(sched.create_priority_class, body), f"PriorityClass {name}")
    for q in soak_queues():
        _retry(
            partial(custom.create_cluster_custom_object, GROUP, VERSION, "gpuqueues", q),
            f"GPUQueue {q['metadata']['name']}",
        )


def _all_terminal(custom: Any) -> tuple[int, int]:
    """(terminal, total) GPUJobs of the soak's namespaces."""
    done = total = 0
    for ns in NAMESPACES:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, ns, "gpujobs")["items"]
        total += len(items)
        done += sum(1 for o in items if (o.get("status") or {}).get("phase") in TERMINAL)
    return done, total


def run_soak(
    minutes: float,
    seed: int,
    *,
    kinds: Sequence[str] = FAULT_KINDS,
    rate_per_min: float = 6.0,
    drain_s: float = 600.0,
    state_dir: Path | None = None,
    history: Path | None = None,
    keep: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the soak (module docstring) and return its JSON result: the seed, minutes and
    kinds, the checker's verdicts (:func:`gpufed.sandbox.soakcheck.check`), ``jobs_planned``,
    ``faults_planned``, ``drained`` (every job terminal before ``drain_s`` ran out),
    ``observer_rounds``, ``wall_s`` and ``history`` (the JSON-lines file, kept). Raises
    SandboxError when the sandbox does not come up."""
    say = progress or (lambda _m: None)
    duration_s = minutes * 60.0
    fleet = soak_fleet()
    jobs = job_schedule(seed, duration_s, rate_per_min)
    faults = fault_schedule(
        seed, duration_s, list(kinds), fleet, leader_lease_s=SOAK_OPTIONS.leader_lease_s
    )
    if history is None:
        history = Path(tempfile.mkstemp(prefix=f"gpufed-soak-{seed}-", suffix=".jsonl")[1])
    history.write_text("")
    say(f"soak: {len(jobs)} jobs, {len(faults)} faults over {minutes:g} min; history {history}")
    started = time.monotonic()
    with fresh_sandbox(state_dir, keep=keep, progress=say) as sandbox:
        info = sandbox.up(fleet, control_plane=SOAK_OPTIONS)
        pair = HubPair(sandbox)
        try:
            pair.start()
            say(f"soak: two hub replicas, {pair.leader()} leads")
            hub_api = info.api_client("hub")
            prepare_hub(hub_api)
            custom: Any = k8s.CustomObjectsApi(hub_api)
            observer = Observer(info, history, list(NAMESPACES))
            observer.write(
                {
                    "type": "plan",
                    "t": time.time(),
                    "seed": seed,
                    "minutes": minutes,
                    "faults": [f.__dict__ for f in faults],
                }
            )
            runner = FaultRunner(
                sandbox,
                fleet,
                pair,
                on_record=lambda r: observer.write(
                    {"type": "fault", "t": time.time(), **r.as_dict()}
                ),
            )
            observer.start()
            t0 = time.time()
            runner.start(faults, t0)
            for job in jobs:
                time.sleep(max(0.0, t0 + job.at_s - time.time()))
                observer.write(
                    {
                        "type": "submit",
                        "t": time.time(),
                        "ns": job.namespace,
                        "name": job.name,
                        "kind": job.kind,
                        "expect": job.expect,
                    }
                )
                _retry(
                    partial(
                        custom.create_namespaced_custom_object,
                        GROUP,
                        VERSION,
                        job.namespace,
                        "gpujobs",
                        job.manifest,
                    ),
                    f"GPUJob {job.name}",
                )
            time.sleep(max(0.0, t0 + duration_s - time.time()))
            say("soak: stream done; waiting for the faults to be undone")
            runner.join(300)
            say("soak: draining")
            deadline = time.monotonic() + drain_s
            drained = False
            while time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    done, total = _all_terminal(custom)
                    if total >= len(jobs) and done == total:
                        drained = True
                        break
                time.sleep(3)
            observer.stop()
        finally:
            pair.close()
    verdict = check(load(history))
    return {
        "seed": seed,
        "minutes": minutes,
        "faults_enabled": list(kinds),
        **{k: v for k, v in verdict.items() if not k.endswith(("_jobs", "_samples"))},
        "jobs_planned": len(jobs),
        "faults_planned": len(faults),
        "drained": drained,
        "observer_rounds": observer.rounds,
        "wall_s": round(time.monotonic() - started, 1),
        "history": str(history),
        "offenders": {k: v for k, v in verdict.items() if k.endswith(("_jobs", "_samples"))},
    }
