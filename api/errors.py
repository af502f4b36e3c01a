"""gpufed's one exception tree: every error class of the project derives from :class:`GpufedError`.

Owned here, in ``api`` (which imports no other component), so every component can raise and
catch by it. The three edges that turn an error into something outside the process translate
from this tree, each in one place (docs/design.md §11):

- the retry classifier, :func:`gpufed.sync.retry.verdict_of`: a :class:`TransientError` is
  ``Verdict.RETRY``, a :class:`PermanentError` ``Verdict.PERMANENT``; errors of other libraries
  (Kubernetes, etcd and HTTP clients) are recognised there by shape;
- the agent stream's gRPC status (:func:`gpufed.hub.edge.service.close_code`): a
  :class:`~gpufed.hub.adapters.sessions.StreamClosedError` carries its code, a
  :class:`~gpufed.api.protocol.codec.ProtocolError` is ``INVALID_ARGUMENT``, anything else
  ``UNAVAILABLE`` (the agent reconnects);
- the CLI's error line (:func:`gpufed.cli.errors.error_line`): a :class:`PermanentError` is
  printed as its message (it names the field, file or flag and the fix).

The tree (each class keeps the built-in base it had, so ``except ValueError`` and the like
still catch it)::

    GpufedError
    ├── PermanentError              the same request or input fails the same way again
    │   ├── FieldError              bad input naming its field: (field, message), ValueError
    │   ├── bad input of another shape (ValueError): QuantityError, ProtocolError,
    │   │   UnknownGPUError, FleetError, QueueFileError, KubeconfigError, TraceError,
    │   │   IntervalFileError, ManifestRefusedError, SelectorError, SubmitError
    │   ├── KindNotServedError      (LookupError) the member serves no such kind
    │   ├── TokenRefused            the console's caller token is malformed or not accepted
    │   └── NotLeaderError          (StoreError) another replica leads: the term ends
    ├── TransientError              may succeed when tried again later
    │   ├── HubUnavailableError     (ConnectionError) the agent's stream to the hub broke
    │   ├── StoreUnavailableError   (StoreError) etcd past the store's retry budget
    │   └── HubReadError            the console's read of the hub cluster failed: refresh
    └── neither: the error says what to do itself, or ends a process
        StoreError, ConflictError (RECONCILE: re-read), StreamClosedError and RefusedError
        (their gRPC code), OwnershipConflictError (``retryable``), _StillChangingError
        (HTTP 409), EtcdStartError, the sandbox's SandboxError, BinariesError, ComponentError,
        ControlPlaneError, IdentityError, placement's FleetChangedError (RuntimeError: the
        snapshot moved under a preemption plan; the hub plans again next cycle)

Private control-flow classes that never leave their module (``cli.output._GoneError``,
``api.fleetcheck._IssuesError``, ``console.server._NeedsLogin``) stay outside the tree.
"""

from __future__ import annotations

__all__ = [
    "MAX_ERROR_CHARS",
    "FieldError",
    "GpufedError",
    "PermanentError",
    "TransientError",
    "clip",
]

#: Longest error message or field path the hub writes back (a condition message may hold
#: 32,768 characters; an error quoting a huge input must still fit).
MAX_ERROR_CHARS = 1024
#: Longest field path a :class:`FieldError` keeps.
MAX_FIELD_CHARS = 256


def clip(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was (for error messages that
    quote input)."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}… ({len(text)} characters)"


class GpufedError(Exception):
    """The root of every gpufed error (the module docstring shows the tree)."""


class PermanentError(GpufedError):
    """Sending the same request, or reading the same input, again fails the same way: report
    it, never retry it (``Verdict.PERMANENT``)."""


class TransientError(GpufedError):
    """Something outside the process is unavailable for now: the same call may succeed later
    (``Verdict.RETRY``), in the one retry layer of its path."""


class FieldError(PermanentError, ValueError):
    """Bad input, naming where: ``field`` is the path in the object (``spec.template.kind``,
    ``spec.placement.gpuProducts[0]``), ``message`` what is wrong and what would be accepted.

    ``str(exc)`` is ``"<field>: <message>"``. Both are clipped (the field to 256 characters,
    the message to :data:`MAX_ERROR_CHARS`), since messages may quote tenant input and the
    status that carries them must fit.
    """

    def __init__(self, field: str, message: str) -> None:
        field, message = clip(field, MAX_FIELD_CHARS), clip(message)
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
