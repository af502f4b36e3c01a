"""The chaos soak's checker: verdicts computed from a history of API-server observations alone.

It trusts nothing inside gpufed: it imports no gpufed code (an import-linter contract says so)
and reads only the JSON-lines history the soak's observer wrote from the hub's and members' API
servers (:mod:`gpufed.sandbox.soakwatch`). Record types (``"type"``; ``"t"``: epoch seconds of
the observation):

* ``submit``: ``ns``, ``name``, ``expect`` (``succeed`` or ``fail``): a job the soak created;
* ``job``: a GPUJob as seen: ``ns``, ``name``, ``uid``, ``phase`` (absent object: ``gone``);
* ``pod``: a member pod of a GPUJob: ``member``, ``ns``, ``name``, ``job_uid`` (label
  ``gpufed.io/job-uid``), ``copy`` (owner Job uid), ``phase``, ``node``, ``resources``
  (``{resource: count}`` of GPU resources, summed over containers), ``started``, ``finished``,
  ``deleting`` (epoch seconds or null), ``exit_codes``;
* ``nodes``: ``member``, ``products`` (``{node: nvidia.com/gpu.product}``);
* ``queues``: ``queues`` (GPUQueue specs: ``name``, ``parent``, ``namespaces``, ``quotas``);
* ``sample``: the end of one observation round: the pods recorded since the previous sample
  are everything that existed then (the quota instant);
* ``health``: ``members_ready`` (bool, every MemberCluster Ready) and ``leader`` (a hub Pod
  labelled leader, or null);
* ``fault``: a fault record (``kind``, ``target``, ``start``, ``end``, ``error``).

:func:`check` returns the verdicts (docs/benchmarks.md, "Chaos soak").
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

TERMINAL = ("Succeeded", "Failed", "Lost")
GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
#: Kubernetes timestamps have one-second resolution: copies overlapping by less are not
#: counted as running twice.
OVERLAP_TOLERANCE_S = 1.0


def load(path: Path) -> list[dict[str, Any]]:
    """The history file's records, in order."""
    with path.open() as fh:
        return [json.loads(line) for line in fh if line.strip()]


# --- jobs ------------------------------------------------------------------------------------


def _job_outcomes(records: list[dict[str, Any]]) -> dict[str, Any]:
    submitted = {
        (r["ns"], r["name"]): r.get("expect", "succeed") for r in records if r["type"] == "submit"
    }
    last: dict[tuple[str, str], dict[str, Any]] = {}
    uid_of: dict[tuple[str, str], str] = {}
    for r in records:
        if r["type"] == "job":
            key = (r["ns"], r["name"])
            if r.get("uid"):
                uid_of[key] = r["uid"]
            if r.get("phase") == "gone" and last.get(key, {}).get("phase") in TERMINAL:
                continue  # deleted after it ended: the outcome stands
            last[key] = r
    codes: dict[str, list[int]] = defaultdict(list)
    for r in records:
        if r["type"] == "pod":
            codes[r["job_uid"]].extend(c for c in r.get("exit_codes") or [] if c)
    rejected: list[str] = []
    out: dict[str, Any] = {
        "submitted": len(submitted),
        "succeeded": 0,
        "failed_application": 0,
        "failed_infrastructure": 0,
        "failed_rejected": 0,
        "lost_phase": 0,
        "lost": 0,
        "unexpected": 0,
    }
    lost: list[str] = []
    unexpected: list[str] = []
    for key, expect in sorted(submitted.items()):
        phase = last.get(key, {}).get("phase")
        label = "/".join(key)
        if phase == "Succeeded":
            out["succeeded"] += 1
            if expect == "fail":
                unexpected.append(f"{label}: expected to fail, Succeeded")
        elif phase == "Failed":
            if uid_of.get(key, "") not in codes:
                out["failed_rejected"] += 1
                rejected.append(
                    f"{label}: Failed without ever running ({last[key].get('message', '')})"
                )
            elif codes[uid_of[key]]:
                out["failed_application"] += 1
                if expect != "fail":
                    unexpected.append(f"{label}: failed by its own exit code, unexpected")
            else:
                out["failed_infrastructure"] += 1
        elif phase == "Lost":
            out["lost_phase"] += 1
            lost.append(f"{label}: phase Lost")
        else:
            lost.append(f"{label}: {'vanished' if phase == 'gone' else phase or 'never seen'}")
    out["lost"] = len(lost)
    out["unexpected"] = len(unexpected)
    out["lost_jobs"] = lost[:50]
    out["unexpected_jobs"] = unexpected[:50]
    out["rejected_jobs"] = rejected[:50]
    return out


# --- copies running twice -----------------------------------------------------------------------


def _intervals(
    records: list[dict[str, Any]], end_of_history: float
) -> dict[str, dict[Any, list[float]]]:
    """Per job uid, per copy ``(member, copy uid)``: ``[first start, last end]`` of its pods'
    running time. A pod runs from ``started`` to ``finished``, else its deletion mark, else
    the last time it was seen running (it vanished), else the end of the history; and never
    past its node's deletion (the node-delete fault's start, else the first observation of the
    node missing from its member: a deleted node is a dead machine, whatever the Pod object
    still says)."""
    pods: dict[tuple[str, str], dict[str, Any]] = {}
    seen_running: dict[tuple[str, str], float] = {}
    this_round: set[tuple[str, str]] = set()
    last_round: set[tuple[str, str]] = set()
    for r in records:
        if r["type"] == "sample":
            last_round, this_round = this_round, set()
            continue
        if r["type"] != "pod":
            continue
        key = (r["member"], f"{r['ns']}/{r['name']}/{r.get('pod_uid', '')}")
        pods[key] = r
        this_round.add(key)
        if r.get("phase") == "Running":
            seen_running[key] = r["t"]
    present_at_end = last_round | this_round
    node_lists = [
        (r["t"], r["member"], set(r["products"])) for r in records if r["type"] == "nodes"
    ]

    # the injector's node deletions (fault records, target "member/node"): the moment the
    # machine died, known exactly even when the observer's rounds are far apart (under load
    # a round took 18 s, and a re-run elsewhere looked like running twice)
    deletions: list[tuple[float, str, str]] = []
    for r in records:
        target = str(r.get("target", ""))
        kind = r.get("kind") if r["type"] == "fault" and not r.get("error") else None
        if kind == "node-delete" and "/" in target:
            member, node = target.split("/", 1)
            deletions.append((float(r["start"]), member, node))

    def node_gone(member: str, node: str, after: float) -> float | None:
        """When ``node`` of ``member`` was deleted after ``after`` (its machine died with
        it): the node-delete fault's start, else the first observation of it missing."""
        seen = next(
            (float(t) for t, m, names in node_lists
             if m == member and t > after and node and node not in names),
            None,
        )  # fmt: skip
        times = [t for t, m, n in deletions if m == member and n == node and t > after]
        if seen is not None:
            times.append(seen)
        return min(times, default=None)

    out: dict[str, dict[Any, list[float]]] = defaultdict(dict)
    for key, r in pods.items():
        start = r.get("started")
        if start is None:
            continue
        end = r.get("finished") or r.get("deleting")
        if end is None:
            end = end_of_history if key in present_at_end else seen_running.get(key, start)
        gone = node_gone(r["member"], r.get("node") or "", start)
        if gone is not None:
            end = min(end, gone)
        copy = (r["member"], r.get("copy") or r["name"])
        span = out[r["job_uid"]].setdefault(copy, [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
    return out


def _double_running(records: list[dict[str, Any]], end_of_history: float) -> list[dict[str, Any]]:
    found = []
    for job, copies in sorted(_intervals(records, end_of_history).items()):
        spans = sorted(copies.items(), key=lambda kv: kv[1][0])
        for i, (ca, (sa, ea)) in enumerate(spans):
            for cb, (sb, eb) in spans[i + 1 :]:
                overlap = min(ea, eb) - max(sa, sb)
                if overlap > OVERLAP_TOLERANCE_S:
                    found.append(
                        {
                            "job_uid": job,
                            "copies": [list(ca), list(cb)],
                            "overlap_s": round(overlap, 1),
                            "from": max(sa, sb),
                        }
                    )
    return found


# --- quotas --------------------------------------------------------------------------------------


def _entry(queue: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    quotas = queue.get("quotas") or []
    for q in quotas:
        if q["gpuProduct"] == key:
            return dict(q)
    if not key.startswith(MIG_PREFIX):
        for q in quotas:
            if q["gpuProduct"] == "*":
                return dict(q)
    return None


class QuotaModel:
    """gpufed's cap model (docs/placement.md, "Quota arithmetic"), written again from the doc:
    per queue ``n`` and concrete key ``P`` (a GPU product or MIG resource), ``used(n)``,
    ``cap(n)`` (root: nominal; otherwise nominal + borrowingLimit, unlimited without one) and
    the lending reserve ``X(n)``; the invariant is ``used + X <= cap``."""

    def __init__(self, queues: list[dict[str, Any]]) -> None:
        self.q = {q["name"]: q for q in queues}
        self.children: dict[str, list[str]] = defaultdict(list)
        for q in queues:
            if q.get("parent") in self.q:
                self.children[q["parent"]].append(q["name"])
        self.ns_queue = {ns: q["name"] for q in queues for ns in q.get("namespaces") or []}

    def _subtree(self, n: str, seen: set[str] | None = None) -> list[str]:
        seen = seen if seen is not None else set()
        if n in seen:
            return []
        seen.add(n)
        return [n, *(d for c in self.children[n] for d in self._subtree(c, seen))]

    def nominal(self, n: str, key: str) -> float | None:
        e = _entry(self.q[n], key)
        if e is not None:
            return float(e["nominal"])
        kids = self.children[n]
        if not kids:
            return 0.0 if self.q[n].get("quotas") else None
        vals = [self.nominal(c, key) for c in kids]
        return None if any(v is None for v in vals) else float(sum(v or 0 for v in vals))

    def used(self, n: str, key: str, own: Mapping[tuple[str, str], int]) -> float:
        e = _entry(self.q[n], key)
        if e is not None:
            keys = {k for (_, k) in own if _entry(self.q[n], k) == e}
            return float(sum(own.get((m, k), 0) for m in self._subtree(n) for k in keys))
        return own.get((n, key), 0) + sum(self.used(c, key, own) for c in self.children[n])

    def cap(self, n: str, key: str) -> float | None:
        nominal = self.nominal(n, key)
        if nominal is None:
            return None
        if self.q[n].get("parent") not in self.q:
            return nominal
        e = _entry(self.q[n], key)
        if e is None or e.get("borrowingLimit") is None:
            return None
        return nominal + float(e["borrowingLimit"])

    def reserve(self, n: str, key: str, own: Mapping[tuple[str, str], int]) -> float:
        total = 0.0
        for c in self.children[n]:
            x = self.reserve(c, key, own)
            e = _entry(self.q[c], key)
            if e is not None and e.get("lendingLimit") is not None:
                x = max(
                    x, (self.nominal(c, key) or 0) - e["lendingLimit"] - self.used(c, key, own), 0
                )
            total += x
        return total

    def violations(self, own: Mapping[tuple[str, str], int]) -> list[dict[str, Any]]:
        """Every (queue, key) whose ``used + X`` exceeds its cap, given ``own``: GPUs running
        per (queue that lists the pod's namespace, key)."""
        out = []
        judged: set[tuple[str, str]] = set()
        for key in sorted({k for (_, k) in own}):
            for n in sorted(self.q):
                e = _entry(self.q[n], key)
                pool = (n, e["gpuProduct"] if e is not None else key)
                if pool in judged:
                    continue  # a `*` entry pools several keys: judged once
                judged.add(pool)
                used = self.used(n, key, own)
                cap = self.cap(n, key)
                if cap is None or used <= 0:
                    continue
                x = self.reserve(n, key, own)
                if used + x > cap:
                    out.append({"queue": n, "key": pool[1], "used": used, "reserve": x, "cap": cap})
        return out


def _quota_overruns(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    model = QuotaModel([])
    products: dict[tuple[str, str], str] = {}
    round_pods: dict[tuple[str, str], dict[str, Any]] = {}
    found = []
    for r in records:
        kind = r["type"]
        if kind == "queues":
            model = QuotaModel(r["queues"])
        elif kind == "nodes":
            products.update({(r["member"], n): p for n, p in r["products"].items()})
        elif kind == "pod":
            round_pods[(r["member"], f"{r['ns']}/{r['name']}")] = r
        elif kind == "sample":
            own: dict[tuple[str, str], int] = defaultdict(int)
            for (member, _), p in round_pods.items():
                queue = model.ns_queue.get(p["ns"])
                if queue is None or not _holds(p):
                    continue
                for res, count in (p.get("resources") or {}).items():
                    key = products.get((member, p.get("node") or "")) if res == GPU else res
                    if key:
                        own[(queue, key)] += int(count)
            for v in model.violations(own):
                found.append({"t": r["t"], **v})
            round_pods = {}
    return found


def _holds(pod: Mapping[str, Any]) -> bool:
    """A pod holds its GPUs while bound to a node and not ended; a pod being deleted (its copy
    stopped by gpufed, or evicted) no longer counts against its queue."""
    return (
        bool(pod.get("node"))
        and pod.get("phase") in ("Pending", "Running")
        and not pod.get("deleting")
        and not pod.get("finished")
    )


# --- recovery ------------------------------------------------------------------------------------


def _recovery(
    records: list[dict[str, Any]],
) -> tuple[dict[str, float | None], list[dict[str, Any]]]:
    faults = [r for r in records if r["type"] == "fault"]
    health = [
        (r["t"], bool(r.get("members_ready")) and bool(r.get("leader")))
        for r in records
        if r["type"] == "health"
    ]
    per_kind: dict[str, float | None] = {}
    listed = []
    for f in sorted(faults, key=lambda f: f["start"]):
        # recovery counts from when the system was free of faults again: a fault undone while
        # another still holds, or one that the next fault followed before the system was seen
        # healthy (back to back: seed 2 stopped one API server 0.3 ms after it was started
        # again), is measured from the end of the ones that followed
        end = f["end"]
        while True:
            healthy_at = next((t for t, ok in health if t >= end and ok), None)
            later = [
                g["end"]
                for g in faults
                if g["end"] > end
                and (g["start"] <= end or healthy_at is None or g["start"] < healthy_at)
            ]
            if not later:
                break
            end = max(later)
        rec_s = None if healthy_at is None else round(healthy_at - end, 1)
        listed.append(
            {k: f.get(k) for k in ("kind", "target", "start", "end", "detail", "error")}
            | {"recovery_s": rec_s, "overlapped_until": end if end != f["end"] else None}
        )
        prev = per_kind.get(f["kind"], 0.0)
        per_kind[f["kind"]] = None if rec_s is None or prev is None else max(prev, rec_s)
    return per_kind, listed


def check(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The verdicts over a history (module docstring): ``submitted``, ``succeeded``,
    ``failed_application``, ``failed_infrastructure``, ``lost`` (not terminal at the end,
    vanished, or phase Lost), ``double_running`` (jobs with two member copies running at once
    for more than a second), ``quota_overruns`` (sampled instants x queue x key over the cap),
    ``max_recovery_s`` by fault kind (fault undone, or the faults overlapping it undone ->
    every member Ready and a leader; null: never), ``faults``, and lists of the offending jobs/instants (at most 50 each)."""
    recs = list(records)
    end = max((r["t"] for r in recs), default=0.0)
    out = _job_outcomes(recs)
    doubles = _double_running(recs, end)
    overruns = _quota_overruns(recs)
    per_kind, faults = _recovery(recs)
    out.update(
        double_running=len({d["job_uid"] for d in doubles}),
        quota_overruns=len(overruns),
        max_recovery_s=per_kind,
        faults=faults,
        double_running_jobs=doubles[:50],
        quota_overrun_samples=overruns[:50],
    )
    return out
