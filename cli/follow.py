"""``gpufed submit --wait``: follow submitted GPUJobs until each ends, and the exit code.

:func:`follow` is the loop over a fetch function (tests drive it with fake time);
:func:`wait_for_jobs` reads the jobs from the hub cluster (one list per namespace every
:data:`POLL_S` seconds, whatever the number of jobs). Progress: on a terminal, a rich live
table (job, phase, cluster, GPUs, message, seconds); otherwise one line per phase change.

Outcome: exit code 0 when every job Succeeded; 1 when any Failed or was Lost (each named with
its message and ``gpufed explain``), when a job was deleted while waiting, or at ``--timeout``
(naming those still running; they keep running). Ctrl-C stops waiting (exit 130), the jobs
go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import typer

from gpufed.api.gpujob import TERMINAL_PHASES
from gpufed.api.labels import GROUP, VERSION

__all__ = ["POLL_S", "follow", "wait_for_jobs"]

#: Seconds between two reads of the jobs.
POLL_S: Final = 1.0

Key = tuple[str, str]  # (namespace, name)


def _row(obj: Mapping[str, Any] | None) -> dict[str, str]:
    if obj is None:
        return {"phase": "Deleted", "cluster": "-", "gpus": "-", "message": "the GPUJob is gone"}
    s = obj.get("status") or {}
    return {
        "phase": str(s.get("phase") or "Pending"),
        "cluster": str(s.get("cluster") or "-"),
        "gpus": "-" if s.get("gpus") is None else str(s.get("gpus")),
        "message": str(s.get("message") or ""),
    }


def follow(
    fetch: Callable[[], Mapping[Key, Mapping[str, Any] | None]],
    keys: Sequence[Key],
    *,
    timeout_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    show: Callable[[dict[Key, dict[str, str]], float], None] | None = None,
    echo: Callable[[str], None] = typer.echo,
) -> int:
    """Poll ``fetch`` (key -> GPUJob object, None when gone) until every job of ``keys`` ended;
    returns the exit code (module doc). ``show(rows, elapsed_s)`` draws progress after each read;
    without it a line is printed per phase change."""
    start = clock()
    last: dict[Key, str] = {}
    rows: dict[Key, dict[str, str]] = {}
    while True:
        objs = fetch()
        for key in keys:
            rows[key] = _row(objs.get(key))
            if show is None and last.get(key) != rows[key]["phase"]:
                r = rows[key]
                where = f" on {r['cluster']}" if r["cluster"] != "-" else ""
                msg = f": {r['message']}" if r["message"] and r["phase"] != "Succeeded" else ""
                echo(f"{key[0]}/{key[1]}: {r['phase']}{where}{msg}")
            last[key] = rows[key]["phase"]
        elapsed = clock() - start
        if show is not None:
            show(rows, elapsed)
        done = [k for k in keys if rows[k]["phase"] in TERMINAL_PHASES | {"Deleted"}]
        if len(done) == len(keys):
            return _outcome(rows, keys, elapsed, echo)
        if timeout_s and elapsed >= timeout_s:
            running = ", ".join(f"{ns}/{n}" for ns, n in keys if (ns, n) not in done)
            echo(
                f"error: still running after {timeout_s:.0f} s: {running} (they keep running; "
                "`gpufed get jobs -w` follows them)"
            )
            return 1
        sleep(POLL_S)


def _outcome(
    rows: Mapping[Key, Mapping[str, str]],
    keys: Sequence[Key],
    elapsed: float,
    echo: Callable[[str], None],
) -> int:
    bad = [k for k in keys if rows[k]["phase"] != "Succeeded"]
    if not bad:
        what = "job" if len(keys) == 1 else f"all {len(keys)} jobs"
        echo(f"{what} succeeded in {elapsed:.0f} s")
        return 0
    for ns, name in bad:
        r = rows[(ns, name)]
        echo(
            f"error: {ns}/{name} {r['phase']}: {r['message'] or 'no message'} "
            f"(why: `gpufed explain {ns}/{name}`)"
        )
    echo(f"{len(bad)} of {len(keys)} jobs did not succeed")
    return 1


def _live_view() -> tuple[Callable[[dict[Key, dict[str, str]], float], None], Any]:
    """A rich live table and the ``Live`` that draws it (a context manager)."""
    from rich.live import Live
    from rich.table import Table

    live = Live(Table(), refresh_per_second=4, transient=False)

    def show(rows: dict[Key, dict[str, str]], elapsed: float) -> None:
        table = Table(title=f"gpufed submit --wait ({elapsed:.0f} s)", title_justify="left")
        for col in ("JOB", "PHASE", "CLUSTER", "GPUS", "MESSAGE"):
            table.add_column(col)
        colour = {"Succeeded": "green", "Failed": "red", "Lost": "red", "Running": "cyan"}
        for (ns, name), r in rows.items():
            phase = r["phase"]
            table.add_row(
                f"{ns}/{name}",
                f"[{colour[phase]}]{phase}[/]" if phase in colour else phase,
                r["cluster"],
                r["gpus"],
                r["message"][:80],
            )
        live.update(table)

    return show, live


def wait_for_jobs(kube: Any, keys: Sequence[Key], *, timeout_s: float = 0.0) -> int:
    """Follow ``keys`` on the hub through ``kube`` (:class:`gpufed.cli.jobs._Kube`); the exit
    code (module doc)."""
    import sys

    namespaces = sorted({ns for ns, _ in keys})
    wanted = set(keys)

    def fetch() -> dict[Key, Mapping[str, Any] | None]:
        out: dict[Key, Mapping[str, Any] | None] = {}
        for ns in namespaces:
            resp = kube.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "gpujobs")
            for obj in resp.get("items") or []:
                key = (ns, str((obj.get("metadata") or {}).get("name")))
                if key in wanted:
                    out[key] = obj
        return out

    try:
        if sys.stdout.isatty():
            show, live = _live_view()
            with live:
                return follow(fetch, keys, timeout_s=timeout_s, show=show)
        return follow(fetch, keys, timeout_s=timeout_s)
    except KeyboardInterrupt:
        typer.echo("stopped waiting; the jobs keep running (`gpufed get jobs -w`)", err=True)
        return 130
