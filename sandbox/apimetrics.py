"""Request counts of the sandbox's API servers, read from their own ``/metrics``: what the e2e
harness (:mod:`gpufed.sandbox.e2e_harness`) subtracts before and after a run to give each
system's API requests per job.

``apiserver_request_total`` is a counter with one series per label set (verb, resource,
group, code, ...); :func:`counter_samples` reads every series of one counter in the Prometheus
text format, :func:`counter_total` sums them; :func:`request_counts` reads it from several API servers at
once through the sandbox's admin clients (the admin token may read ``/metrics``), by request
kind (``"PATCH gpujobs/status"``) and answer code, so a run can say which requests a job costs
and how many were refused with a conflict.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

#: The API server's counter of requests it served, one series per label set.
REQUESTS_METRIC = "apiserver_request_total"


def counter_samples(text: str, name: str = REQUESTS_METRIC) -> list[tuple[dict[str, str], float]]:
    """Every sample of counter ``name`` in Prometheus text exposition ``text``: ``[(labels,
    value)]`` in the order given (labels ``{}`` for a sample without any). Comment lines and
    other metrics (including ``<name>_created`` or names that only start with ``name``) are
    ignored; a sample's optional timestamp after the value is too.

    Raises ValueError naming the line when a sample of ``name`` has no numeric value or a
    broken label set."""
    out: list[tuple[dict[str, str], float]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith(name) or line.startswith("#"):
            continue
        rest = line[len(name) :]
        labels: dict[str, str] = {}
        if rest.startswith("{"):
            # Label values may hold spaces and braces inside quotes: skip to the closing brace
            # outside quotes.
            end = _labels_end(rest)
            if end < 0:
                raise ValueError(f"{name}: unterminated label set in metrics line {raw!r}")
            labels = _parse_labels(rest[1:end], name, raw)
            rest = rest[end + 1 :]
        elif not rest[:1].isspace():
            continue  # another metric whose name starts with ``name``
        fields = rest.split()
        if not fields:
            raise ValueError(f"{name}: no value in metrics line {raw!r}")
        try:
            out.append((labels, float(fields[0])))
        except ValueError:
            raise ValueError(f"{name}: value {fields[0]!r} is not a number in {raw!r}") from None
    return out


def counter_total(text: str, name: str = REQUESTS_METRIC) -> float:
    """Sum of every sample of counter ``name`` in ``text`` (0.0 when absent; as
    :func:`counter_samples`, whose errors it raises)."""
    return sum(v for _, v in counter_samples(text, name))


def request_kind(labels: Mapping[str, str]) -> str:
    """``"VERB resource[/subresource]"`` of one ``apiserver_request_total`` series
    (``"PATCH gpujobs/status"``, ``"POST events"``; ``"-"`` for a missing label)."""
    resource = labels.get("resource") or "-"
    if sub := labels.get("subresource"):
        resource = f"{resource}/{sub}"
    return f"{labels.get('verb') or '-'} {resource}"


#: ``(request kind, answer code)`` -> requests served (:func:`request_counts`).
Counts = dict[tuple[str, str], float]


def request_counts_of(text: str) -> Counts:
    """``apiserver_request_total`` of one API server's ``/metrics`` text summed by ``(request
    kind, code)`` (:func:`request_kind`; ``code`` ``"-"`` when absent)."""
    out: Counts = {}
    for labels, value in counter_samples(text):
        key = (request_kind(labels), labels.get("code") or "-")
        out[key] = out.get(key, 0.0) + value
    return out


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


def _parse_labels(body: str, name: str, raw: str) -> dict[str, str]:
    """``key="value",...`` (the text between the braces) as a dict; ``\\``, ``\\"`` and
    ``\\n`` unescaped in values. Raises ValueError naming the line when it is not that form."""
    labels: dict[str, str] = {}
    i, n = 0, len(body)
    while i < n:
        eq = body.find("=", i)
        if eq < 0 or eq + 1 >= n or body[eq + 1] != '"':
            if body[i:].strip(" ,") == "":
                break
            raise ValueError(f"{name}: broken label set in metrics line {raw!r}")
        key = body[i:eq].strip(" ,")
        j, value = eq + 2, []
        while j < n and body[j] != '"':
            if body[j] == "\\" and j + 1 < n:
                j += 1
                value.append("\n" if body[j] == "n" else body[j])
            else:
                value.append(body[j])
            j += 1
        if j >= n:
            raise ValueError(f"{name}: unterminated label value in metrics line {raw!r}")
        labels[key] = "".join(value)
        i = j + 1
    return labels


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


async def request_counts(apis: Mapping[str, Any]) -> dict[str, Counts]:
    """``{cluster: {(request kind, code): requests}}`` for every ``{cluster: ApiClient}``
    (:func:`request_counts_of`), read concurrently."""
    names = list(apis)
    texts = await asyncio.gather(*(metrics_text(apis[n]) for n in names))
    return {n: request_counts_of(t) for n, t in zip(names, texts, strict=True)}


def counts_deltas(before: Mapping[str, Counts], after: Mapping[str, Counts]) -> dict[str, Counts]:
    """Requests served per cluster and ``(kind, code)`` between two :func:`request_counts`; a
    cluster whose total went down (a restarted API server) counts from zero, as in
    :func:`request_deltas`. Kinds with no request in between are left out."""
    out: dict[str, Counts] = {}
    for name, end in after.items():
        start = before.get(name, {})
        restarted = sum(end.values()) < sum(start.values())
        deltas = {k: v - (0.0 if restarted else start.get(k, 0.0)) for k, v in end.items()}
        out[name] = {k: v for k, v in deltas.items() if v > 0}
    return out


def request_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Requests served per cluster between two ``{cluster: total}`` (a counter that went down,
    i.e. a restarted API server, counts from zero)."""
    out: dict[str, float] = {}
    for name, end in after.items():
        start = before.get(name, 0.0)
        out[name] = end - start if end >= start else end
    return out
