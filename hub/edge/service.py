"""The agent gRPC service (``AgentService.Connect``): a thin shim over the leader.

Served by the hub process (:mod:`gpufed.hub.edge.app`) on ``--listen``, with TLS unless
``--insecure``. Per stream:

1. **Leader only.** A standby replica answers ``UNAVAILABLE`` ("standby"): agents retry with
   backoff and reach the leader (behind the hub Service, which selects the Pod the leader
   labelled ``gpufed.io/hub-role=leader``: :mod:`gpufed.hub.edge.podrole`).
2. **Authentication.** ``authorization: Bearer <token>`` in the call metadata must be the join
   token of a MemberCluster (Secret referenced by ``spec.joinTokenRef``): the token is
   exchanged for the cluster identity, in memory (:mod:`gpufed.hub.components.tokens`, no Kubernetes
   request); otherwise ``UNAUTHENTICATED``. The check is repeated, without waiting, right
   before the stream opens; a token rotated later closes the stream (``PERMISSION_DENIED``).
3. **Hello first**, within ``hello_timeout_s``, naming exactly that cluster (else
   ``PERMISSION_DENIED``) with a protocol version of at least the oldest this hub serves (else
   ``FAILED_PRECONDITION``); the stream speaks the lower of the agent's and the hub's
   (docs/hub.md, "Version skew").
4. Messages are handled in order: each marks the member heard (:meth:`Controller.heard`),
   is decoded by its session (:meth:`AgentSession.receive`: protobuf becomes
   :mod:`gpufed.api` models here, at the edge) and routed by :meth:`Controller.handle`. A
   malformed, out-of-order or foreign message closes only this stream, with the reason in the
   status details; an oversized one is refused by gRPC itself (``RESOURCE_EXHAUSTED``).
   Nothing stored is touched by a bad message.

Errors become a stream's gRPC status in one place, :func:`close_code`, from gpufed's exception
tree (:mod:`gpufed.api.errors`, docs/design.md §11): a
:class:`~gpufed.hub.adapters.sessions.StreamClosedError` carries its code, a
:class:`~gpufed.api.protocol.codec.ProtocolError` (a message that does not decode) is
``INVALID_ARGUMENT``, anything else ``UNAVAILABLE`` (a hub error, or the term ending: the agent
reconnects). The handshake's own refusals (``UNAUTHENTICATED``, ``FAILED_PRECONDITION``,
``PERMISSION_DENIED`` for a foreign Hello) are decided here, not raised.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import grpc
import structlog

from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol import agent_pb2_grpc as pb_grpc
from gpufed.api.protocol.codec import ProtocolError, hello_from_pb
from gpufed.hub.adapters.sessions import (
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    AgentSession,
    CloseCode,
    StreamClosedError,
)
from gpufed.hub.components.core import Controller
from gpufed.hub.components.tokens import Credentials

log = structlog.get_logger("gpufed.hub.edge.service")

_CODES: dict[CloseCode, grpc.StatusCode] = {
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "PERMISSION_DENIED": grpc.StatusCode.PERMISSION_DENIED,
    "UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "ABORTED": grpc.StatusCode.ABORTED,
}


def close_code(exc: BaseException) -> CloseCode:
    """The code that closes an agent stream on ``exc`` (the module docstring): the one
    translation of errors into the stream's gRPC status."""
    if isinstance(exc, StreamClosedError):
        return exc.code
    if isinstance(exc, ProtocolError):
        return "INVALID_ARGUMENT"
    return "UNAVAILABLE"


def grpc_status(code: CloseCode) -> grpc.StatusCode:
    """The gRPC status code of a close code."""
    return _CODES.get(code, grpc.StatusCode.ABORTED)


def credentials_of(
    context: grpc.aio.ServicerContext[pb.AgentMessage, pb.HubMessage],
) -> Credentials:
    """What the agent presented on this call (the join token; client certificates, a later
    issue, would come from ``context.auth_context()`` here)."""
    return Credentials(bearer=bearer_token(context.invocation_metadata()))


def bearer_token(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str | None:
    """The token of an ``authorization: Bearer <token>`` metadata entry, or None."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


class AgentService(pb_grpc.AgentServiceServicer):
    """``AgentService`` bound to whichever controller currently leads (None: standby)."""

    def __init__(
        self, controller: Callable[[], Controller | None], *, hello_timeout_s: float = 10.0
    ) -> None:
        self._controller = controller
        self._hello_timeout_s = hello_timeout_s

    async def Connect(  # noqa: N802 - the gRPC method name
        self,
        request_iterator: AsyncIterator[pb.AgentMessage],
        context: grpc.aio.ServicerContext[pb.AgentMessage, pb.HubMessage],
    ) -> AsyncIterator[pb.HubMessage]:
        peer = context.peer()
        ctrl = self._controller()
        if ctrl is None or not ctrl.members_synced.is_set():
            await _abort(context, grpc.StatusCode.UNAVAILABLE, "standby hub replica: not leading")
            return
        creds = credentials_of(context)
        if creds.bearer is None:
            await _abort(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                "missing 'authorization: Bearer <join token>' metadata",
            )
            return
        try:
            cluster = await ctrl.authenticate(creds)
        except Exception as exc:  # the term's first lists did not come in time
            log.warning("agent.auth.failed", peer=peer, error=repr(exc))
            await _abort(
                context,
                grpc_status(close_code(exc)),
                f"cannot check the join token now: {exc!r}",
            )
            return
        if cluster is None:
            log.warning("agent.refused", peer=peer, reason="unknown join token")
            await _abort(context, grpc.StatusCode.UNAUTHENTICATED, "unknown join token")
            return
        try:
            first = await asyncio.wait_for(anext(request_iterator), self._hello_timeout_s)
        except (TimeoutError, StopAsyncIteration):
            await _abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no Hello within {self._hello_timeout_s:.0f} s",
            )
            return
        if first.WhichOneof("body") != "hello":
            await _abort(
                context, grpc.StatusCode.FAILED_PRECONDITION, "the first message must be a Hello"
            )
            return
        try:
            hello = hello_from_pb(first.hello)
        except ProtocolError as exc:
            await _abort(context, grpc_status(close_code(exc)), str(exc))
            return
        if hello.cluster != cluster:
            log.warning("agent.refused", peer=peer, token_cluster=cluster, hello=hello.cluster)
            await _abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"the join token belongs to member {cluster!r}, not {hello.cluster!r}",
            )
            return
        if hello.protocol_version < MIN_PROTOCOL_VERSION:
            await _abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"protocol version {hello.protocol_version} is not supported "
                f"(this hub speaks {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION})",
            )
            return
        if self._controller() is not ctrl:
            # The term that authenticated this stream ended during the handshake.
            await _abort(context, grpc.StatusCode.UNAVAILABLE, "the hub stopped leading; retry")
            return
        if ctrl.authenticated(creds) != cluster:
            # Rotated or revoked while we waited for the Hello. Checked again here, with no
            # await before open_session, so no stream opens on a token that is no longer valid.
            await _abort(context, grpc.StatusCode.UNAUTHENTICATED, "the join token changed")
            return
        try:
            session = ctrl.open_session(hello)
        except StreamClosedError as exc:
            await _abort(context, grpc_status(close_code(exc)), exc.reason)
            return
        reader = asyncio.create_task(self._read(ctrl, session, request_iterator))
        try:
            while True:
                msg = await session.outbox.get()
                if msg is None:
                    break
                yield msg
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            reason = session.closed.reason if session.closed else "stream ended"
            ctrl.close_session(session, reason)
        closed = session.closed
        if closed is not None:
            await _abort(context, grpc_status(close_code(closed)), closed.reason)

    async def _read(
        self,
        ctrl: Controller,
        session: AgentSession,
        request_iterator: AsyncIterator[pb.AgentMessage],
    ) -> None:
        try:
            async for msg in request_iterator:
                ctrl.heard(session)
                event = session.receive(msg)
                if event is not None:
                    await ctrl.handle(session, event)
                if session.closed is not None:
                    return
        except StreamClosedError as exc:
            log.warning(
                "agent.stream.closed", cluster=session.cluster, code=exc.code, reason=exc.reason
            )
            session.close(close_code(exc), exc.reason)
            return
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as exc:
            session.close("ABORTED", f"stream error: {exc.code().name}: {exc.details()}")
            return
        except Exception as exc:
            # A bug of ours, or etcd down while acking: close this stream; the agent reconnects.
            log.exception("agent.stream.error", cluster=session.cluster, error=str(exc))
            session.close(close_code(exc), f"hub error while handling a message: {exc}")
            return
        session.close("ABORTED", "the agent closed its side of the stream")


async def _abort(
    context: grpc.aio.ServicerContext[pb.AgentMessage, pb.HubMessage],
    code: grpc.StatusCode,
    reason: str,
) -> None:
    """End the RPC with ``code``; ``context.abort`` raises, which ends the handler."""
    await context.abort(code, reason)


def server_credentials(
    cert_pem: bytes, key_pem: bytes, client_ca_pem: bytes | None = None
) -> grpc.ServerCredentials:
    """TLS server credentials; with ``client_ca_pem`` agents must present client certs too."""
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)],
        root_certificates=client_ca_pem,
        require_client_auth=client_ca_pem is not None,
    )
