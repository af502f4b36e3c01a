"""Hypothesis property: no sequence of arrivals, finishes and restarts (ledger rebuilds) ever
makes a queue use more than its nominal plus borrowing limit, or an ancestor more than its limit.

The check recomputes usage from the jobs themselves (not from the admission code's view): for
every queue and every quota entry it lists, the GPUs its subtree holds under keys that resolve
to that entry must be at most ``nominal + borrowingLimit`` (``nominal`` at a root).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quota_builders import A100, H100, gpu_queue, quota

from gpufed.api.queue import GPUQueue
from gpufed.placement.quota import QueueTree, QuotaUsage, admit, build_tree

KEYS = (H100, A100, "NVIDIA-H200", "nvidia.com/mig-1g.10gb")
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def entries(draw: Any) -> list[Any]:
    keys = draw(st.lists(st.sampled_from((*KEYS, "*")), unique=True, max_size=3))
    return [
        quota(
            k,
            draw(st.integers(0, 16)),
            draw(st.one_of(st.none(), st.integers(0, 8))),
            draw(st.one_of(st.none(), st.integers(0, 16))),
        )
        for k in keys
    ]


@st.composite
def trees(draw: Any) -> list[GPUQueue]:
    n = draw(st.integers(1, 7))
    out = []
    for i in range(n):
        parent = draw(st.one_of(st.none(), st.integers(0, i - 1))) if i else None
        out.append(
            gpu_queue(
                f"q{i}",
                *draw(entries()),
                parent=None if parent is None else f"q{parent}",
                namespaces=(f"ns{i}",),
            )
        )
    return out


ops = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(0, 6), st.sampled_from(KEYS), st.integers(1, 8)),
        st.tuples(st.just("finish"), st.integers(0, 1000)),
        st.tuples(st.just("restart")),
    ),
    max_size=60,
)


def _violations(tree: QueueTree, jobs: dict[str, tuple[str, str, int]]) -> list[str]:
    out = []
    for node in tree.nodes.values():
        members = {node.name}
        stack = list(node.children)
        while stack:
            c = stack.pop()
            members.add(c)
            stack.extend(tree.nodes[c].children)
        for entry in node.quotas.values():
            used = sum(g for q, k, g in jobs.values() if q in members and node.entry(k) is entry)
            if node.parent is None:
                cap = entry.nominal
            elif entry.borrowing_limit is None:
                continue
            else:
                cap = entry.nominal + entry.borrowing_limit
            if used > cap:
                out.append(f"{node.name} {entry.gpu_product}: {used} > {cap}")
    return out


@SETTINGS
@given(queues=trees(), steps=ops)
def test_no_sequence_exceeds_a_quota(queues: list[GPUQueue], steps: list[Any]) -> None:
    """Admit-then-charge, release and rebuild never take any queue past its limit, and a
    rebuilt ledger equals the one it replaced."""
    tree = build_tree(queues)
    usage = QuotaUsage()
    jobs: dict[str, tuple[str, str, int]] = {}
    serial = 0
    for step in steps:
        if step[0] == "arrive":
            _, qi, key, gpus = step
            queue = f"q{qi}" if f"q{qi}" in tree.nodes else "default"
            if admit(tree, usage, queue, key, gpus).ok:
                serial += 1
                uid = f"j{serial}"
                usage.charge(uid, queue, key, gpus)
                usage.charge(uid, queue, key, gpus)  # a retried charge counts once
                jobs[uid] = (queue, key, gpus)
        elif step[0] == "finish" and jobs:
            uid = sorted(jobs)[step[1] % len(jobs)]
            usage.release(uid)
            del jobs[uid]
        elif step[0] == "restart":
            before = {q: usage.subtree(tree, q) for q in tree.nodes}
            usage = QuotaUsage()
            usage.rebuild((uid, q, {k: g}) for uid, (q, k, g) in sorted(jobs.items()))
            assert {q: usage.subtree(tree, q) for q in tree.nodes} == before
        assert _violations(tree, jobs) == []
