"""Where the hub's event loop is held: a stack-sampling watchdog for a benchmark's hub process.

A debugging aid, not product code. Usage (the hub inherits the environment)::

    PYTHONPATH=scripts/stall_trace GPUFED_STALL_TRACE_DIR=/tmp/stalls \\
        .venv/bin/gpufed bench scale --members 100 --nodes-per-member 5000 --json

In the process whose arguments include ``--etcd-prefix=/gpufed/scale`` (the hub ``gpufed bench
scale`` starts), a loop callback beats every 20 ms and a thread takes the loop thread's stack
every 20 ms while the last beat is older than 200 ms. Each stall is written to
``$GPUFED_STALL_TRACE_DIR/hub-<pid>.txt`` (default /tmp) as ``STALL <seconds> at <time>`` and
its three most sampled stacks, innermost frame first. The thread needs the GIL to take a
stack: a stall inside one C call (a garbage collection, a large ``json.loads``) shows as one
sample of the frame that made the call.
"""

import os
import sys

if any(a.startswith("--etcd-prefix=/gpufed/scale") for a in sys.argv):
    import asyncio
    import collections
    import threading
    import time
    import traceback

    _beat = [time.monotonic()]
    _main = threading.main_thread().ident
    _run_forever = asyncio.BaseEventLoop.run_forever

    def _run(self: asyncio.BaseEventLoop) -> None:
        def tick() -> None:
            _beat[0] = time.monotonic()
            self.call_later(0.02, tick)

        self.call_soon(tick)
        return _run_forever(self)

    asyncio.BaseEventLoop.run_forever = _run  # type: ignore[method-assign]

    def _watch() -> None:
        path = os.path.join(
            os.environ.get("GPUFED_STALL_TRACE_DIR", "/tmp"), f"hub-{os.getpid()}.txt"
        )
        cur: collections.Counter[str] | None = None
        start = 0.0
        with open(path, "a") as out:
            while True:
                time.sleep(0.02)
                if time.monotonic() - _beat[0] > 0.2:
                    frame = sys._current_frames().get(_main)
                    if frame is None:
                        continue
                    stack = traceback.extract_stack(frame)[-12:]
                    key = " < ".join(
                        f"{os.path.basename(f.filename)}:{f.name}:{f.lineno}"
                        for f in reversed(stack)
                    )
                    if cur is None:
                        cur, start = collections.Counter(), _beat[0]
                    cur[key] += 1
                elif cur is not None:
                    out.write(
                        f"STALL {time.monotonic() - start:.3f}s at {time.strftime('%H:%M:%S')}\n"
                    )
                    for k, n in cur.most_common(3):
                        out.write(f"  {n:4d} {k}\n")
                    out.flush()
                    cur = None

    threading.Thread(target=_watch, name="stall-trace", daemon=True).start()
