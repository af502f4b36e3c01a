"""Text rendering of a :class:`~gpufed.api.decision.Decision` for ``gpufed explain``.

Used by the CLI (and by the hub for event messages); reads only the decision, so it works on a
decision read back from ``GPUJob.status.placement``.
"""

from __future__ import annotations

from gpufed.api.decision import Decision, Outcome


def render_explanation(decision: Decision) -> str:
    """A multi-line, column-aligned explanation: outcome, nodes, scores, rejections."""
    lines: list[str] = []
    head = f"job {decision.job or decision.uid}: {decision.outcome.value}"
    if decision.outcome == Outcome.PLACED:
        head += f" on {decision.cluster}"
        if decision.gpu_product:
            head += f" ({decision.gpu_product})"
        if decision.score is not None:
            head += f", score {decision.score:.1f}"
    lines.append(head)
    lines.append(f"  {decision.message}")
    if decision.nvlink_domains:
        shown = ", ".join(decision.nvlink_domains[:8])
        more = len(decision.nvlink_domains) - 8
        lines.append(f"  NVLink domains: {shown}" + (f" (+{more} more)" if more > 0 else ""))
    if decision.compute_domain:
        name = decision.job.rpartition("/")[2]
        lines.append(
            f"  ComputeDomain: {name} in {decision.cluster} (multi-node NVLink; readiness: "
            "condition ComputeDomainReady)"
        )
    for ps in decision.pod_sets:
        per_pod = ", ".join(f"{r}={a}" for r, a in sorted(ps.requests.items()) if a)
        nodes = ", ".join(f"{n} x{k}" for n, k in sorted(ps.nodes.items()))
        lines.append(f"  pod set {ps.name} ({per_pod or 'no requests'} per pod): {nodes}")
    if decision.score_parts:
        parts = "  ".join(f"{k}={v:.1f}" for k, v in decision.score_parts.items())
        lines.append(f"  score parts: {parts}")
    if not decision.scores and decision.cluster_scores:
        ranked = sorted(decision.cluster_scores.items(), key=lambda kv: (-kv[1], kv[0]))
        lines.append("scores (0-100): " + ", ".join(f"{k} {v:.1f}" for k, v in ranked))
    if decision.scores:
        lines.append("scores (0-100):")
        width = max(len(s.cluster) for s in decision.scores)
        for s in decision.scores:
            parts = "  ".join(f"{k}={v:.1f}" for k, v in s.parts.items())
            lines.append(f"  {s.cluster:<{width}}  {s.score:6.1f}  {parts}")
    if decision.rejections:
        lines.append("members that cannot take it:")
        w_c = max(len(r.cluster) for r in decision.rejections)
        w_p = max(len(r.plugin) for r in decision.rejections)
        for r in decision.rejections:
            code = "never" if r.code == "UnschedulableAndUnresolvable" else "now"
            lines.append(f"  {r.cluster:<{w_c}}  {r.plugin:<{w_p}}  {code:<5}  {r.reason}")
    if not decision.explained:
        lines.append(
            "(other members were not evaluated once the winner was certain; the hub records "
            "them for fleets up to `gpufed hub --explain-members` members)"
        )
    return "\n".join(lines)
