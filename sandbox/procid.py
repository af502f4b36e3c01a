"""Process identity: whether a recorded pid still names the process started under it.

A pid is reused once its process exits, so a pid file alone may name an unrelated process, which
must never be signalled. A process is therefore recorded as ``{"pid", "create_time", "boot_id",
"start_ticks"}`` and recognised by the boot id (``/proc/sys/kernel/random/boot_id``, new on every
boot) and its start time in clock ticks since boot (field 22 of ``/proc/<pid>/stat``, proc(5)).
Neither moves when the wall clock is stepped.

psutil's ``create_time()`` is not enough on its own: it is the boot time of ``/proc/stat``
(``btime``, a wall-clock figure) plus those ticks, and ``btime`` moves whenever the wall clock is
stepped: NTP, a laptop's resume, a VM restored, forked or migrated (seen on the CI machine:
``dmesg`` "crng reseeded due to virtual machine fork", ``btime`` moved by ~196 s, and every
component of every running sandbox looked gone to ``status`` and was left running by ``down``).
``create_time()`` within 0.5 s is the check only where ``/proc`` gives no ticks (not Linux) or the
record predates them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import psutil

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_CREATE_TIME_SLACK_S = 0.5


@functools.cache
def boot_id() -> str | None:
    """This boot's id (a UUID string), or None where the kernel does not give one. Read once:
    it cannot change while this process lives (the supervisor checks identities every 0.2 s
    while components start)."""
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), or None
    when the process is gone or there is no ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last
    # ")"; the fields after it start at field 3, so field 22 is index 19.
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def identity(pid: int) -> dict[str, object]:
    """The record of a live process: ``pid``, ``create_time`` (epoch seconds), ``boot_id`` and
    ``start_ticks`` (the last two None off Linux). Raises ``psutil.NoSuchProcess`` when the
    process is gone."""
    return {
        "pid": pid,
        "create_time": psutil.Process(pid).create_time(),
        "boot_id": boot_id(),
        "start_ticks": start_ticks(pid),
    }


def same_process(proc: psutil.Process, record: Mapping[str, object]) -> bool:
    """Whether ``proc`` (looked up by ``record["pid"]``) is the process ``record`` was made of.

    Same boot and same start ticks where both were recorded and can be read now; otherwise
    ``create_time()`` within 0.5 s of the recorded one. Raises ``psutil.Error`` when the process
    is gone, ``KeyError``/``TypeError``/``ValueError`` on a malformed record.
    """
    ticks, boot = record.get("start_ticks"), record.get("boot_id")
    now_ticks, now_boot = start_ticks(proc.pid), boot_id()
    if ticks is not None and boot is not None and now_ticks is not None and now_boot is not None:
        return boot == now_boot and int(str(ticks)) == now_ticks
    return abs(proc.create_time() - float(str(record["create_time"]))) <= _CREATE_TIME_SLACK_S
