"""Request counts of the sandbox's API servers, read from their own ``/metrics``: what the e2e
harness (:mod:`gpufed.sandbox.e2e_harness`) subtracts before and after a run to give each
system's API requests per job.

``apiserver_request_total`` is a counter with one series per label set (verb, resource,
group, code, ...); :func:`counter_total` sums every series of one counter in the Prometheus
text format; :func:`request_totals` reads it from several API servers at once through the
sandbox's admin clients (the admin token may read ``/metrics``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

#: The API server's counter of requests it served, one series per label set.
REQUESTS_METRIC = "apiserver_request_total"


def counter_total(text: str, name: str = REQUESTS_METRIC) -> float:
    """Sum of every sample of counter ``name`` in Prometheus text exposition ``text`` (0.0 when
    absent). Comment lines and other metrics (including ``<name>_created`` or names that only
    start with ``name``) are ignored; a sample's optional timestamp after the value is too.

    Raises ValueError naming the line when a sample of ``name`` has no numeric value."""
    total = 0.0
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith(name) or line.startswith("#"):
            continue
        rest = line[len(name) :]
        if rest.startswith("{"):
            # Label values may hold spaces and braces inside quotes: skip to the closing brace
            # outside quotes.
            end = _labels_end(rest)
            if end < 0:
                raise ValueError(f"{name}: unterminated label set in metrics line {raw!r}")
            rest = rest[end + 1 :]
        elif not rest[:1].isspace():
            continue  # another metric whose name starts with ``name``
        fields = rest.split()
        if not fields:
            raise ValueError(f"{name}: no value in metrics line {raw!r}")
        try:
            total += float(fields[0])
        except ValueError:
            raise ValueError(f"{name}: value {fields[0]!r} is not a number in {raw!r}") from None
    return total


def _labels_end(s: str) -> int:
    """Index of the ``}`` closing the label set that ``s`` starts with (-1 when none)."""
    quoted = escaped = False
    for i, ch in enumerate(s):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = quoted
        elif ch == '"':
            quoted = not quoted
        elif ch == "}" and not quoted:
            return i
    return -1


async def metrics_text(api: Any, *, timeout_s: float = 30.0) -> str:
    """``GET /metrics`` of the API server behind ``api`` (a ``kubernetes_asyncio`` ApiClient
    with a token that may read it), as text. Raises the client's ApiException on a refusal."""
    text = await api.call_api(
        "/metrics",
        "GET",
        auth_settings=["BearerToken"],
        header_params={"Accept": "text/plain"},
        response_types_map={200: "str"},
        _return_http_data_only=True,
        _request_timeout=timeout_s,
    )
    return str(text)


async def request_totals(apis: Mapping[str, Any]) -> dict[str, float]:
    """``{cluster: apiserver_request_total summed over label sets}`` for every ``{cluster:
    ApiClient}``, read concurrently."""
    names = list(apis)
    texts = await asyncio.gather(*(metrics_text(apis[n]) for n in names))
    return {n: counter_total(t) for n, t in zip(names, texts, strict=True)}


def request_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Requests served per cluster between two :func:`request_totals` (a counter that went down,
    i.e. a restarted API server, counts from zero)."""
    out: dict[str, float] = {}
    for name, end in after.items():
        start = before.get(name, 0.0)
        out[name] = end - start if end >= start else end
    return out
