"""Per-caller identities: the console served for many people (by the hub's Pod, behind its
Service) reads the hub cluster with each caller's own bearer token, never with one of its own.

``gpufed console --identity caller`` takes the hub cluster's address and CA from the kubeconfig
or the Pod (in-cluster) and drops every credential found there: a request without a token gets
the login page, and a token the API server does not accept gets it again. The caller's token
comes from ``Authorization: Bearer …`` (an authenticating proxy such as oauth2-proxy sets it)
or from the console's cookie, set by ``POST /login`` (a pasted token, e.g. from
``kubectl create token`` or an OIDC id-token) after a ``SelfSubjectReview`` proves the API
server accepts it. Each read then goes out with that token, so the hub cluster's RBAC decides
every page, as it does for ``gpufed console`` run locally.

Bounded: a token longer than :data:`MAX_TOKEN_BYTES` or with characters outside visible ASCII
is refused before any request; at most :data:`MAX_CALLERS` readers are kept (least recently
used evicted, each closed), and one unused for :data:`IDLE_S` seconds is dropped; a refused
token is remembered for :data:`REFUSED_S` seconds (at most :data:`MAX_REFUSED`), so repeating it
sends the API server nothing. The cache is
keyed by the token's SHA-256; the token itself is kept only inside its reader's client.

Who calls it: :mod:`gpufed.console.server` (per request) and ``gpufed console`` (building it).
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpufed.api.errors import PermanentError
from gpufed.console.reader import HubReader, HubReadError, configuration

__all__ = [
    "COOKIE",
    "IDLE_S",
    "MAX_CALLERS",
    "MAX_REFUSED",
    "MAX_TOKEN_BYTES",
    "REFUSED_S",
    "CallerReaders",
    "CallerSource",
    "TokenRefused",
    "clean_token",
]

#: The cookie that carries a pasted token (HttpOnly, SameSite=Strict; see the server).
COOKIE = "gpufed-console-token"
#: Longest token accepted (OIDC id-tokens with many groups run to a few KiB).
MAX_TOKEN_BYTES = 16 * 1024
#: Most callers whose reader is kept at once, and seconds an unused one is kept.
MAX_CALLERS = 64
IDLE_S = 600.0
#: Tokens the API server refused, remembered (by hash) so that a client repeating one costs
#: the API server nothing: at most this many, each for this many seconds.
MAX_REFUSED = 1024
REFUSED_S = 60.0


class TokenRefused(PermanentError):  # noqa: N818 - a verdict on the caller's input, not a crash
    """The caller's token is malformed or the API server does not accept it (the message says
    which); the server answers with the login page and 401."""


@dataclass(frozen=True)
class CallerSource:
    """Who a caller's reader reads as: the name the API server gave the token
    (``system:serviceaccount:team-a:viewer``, an OIDC user) and the namespace tried first when
    GPUJobs cannot be listed cluster-wide (the service account's own, else ``default``)."""

    user: str
    namespace: str

    def describe(self) -> str:
        return f"{self.user} (your token)"


def clean_token(raw: str | None) -> str | None:
    """The token in an ``Authorization`` value (``Bearer x``) or a cookie (``x``); None when
    absent. Raises :class:`TokenRefused` for one too long or with characters a token cannot
    have (anything but visible ASCII)."""
    if raw is None:
        return None
    value = raw.strip()
    scheme, _, rest = value.partition(" ")
    if scheme.lower() == "bearer":
        value = rest.strip()
    if not value:
        return None
    if len(value) > MAX_TOKEN_BYTES:
        raise TokenRefused(f"the token is longer than {MAX_TOKEN_BYTES} bytes")
    if not all(33 <= ord(c) <= 126 for c in value):
        raise TokenRefused("the token has characters other than visible ASCII")
    return value


def _namespace_of(user: str) -> str:
    parts = user.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        return parts[2]
    return "default"


@dataclass
class _Entry:
    reader: HubReader
    used: float


class CallerReaders:
    """One :class:`HubReader` per caller token, over one API server address with no
    credentials of its own. ``base``: a client configuration (host, CA, TLS settings) whose
    credentials are removed here; ``namespaces``: extra namespaces every reader tries (as
    ``--namespace``); ``hub_url``: the hub's HTTP endpoint for the blocks."""

    def __init__(
        self,
        base: client.Configuration,
        namespaces: Iterable[str] = (),
        *,
        hub_url: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_callers: int = MAX_CALLERS,
        idle_s: float = IDLE_S,
    ) -> None:
        self._base = _without_credentials(base)
        self.server = str(self._base.host)
        self._namespaces = list(namespaces)
        self._hub_url = hub_url
        self._clock = clock
        self._max = max_callers
        self._idle_s = idle_s
        self._readers: OrderedDict[str, _Entry] = OrderedDict()
        self._refused: OrderedDict[str, float] = OrderedDict()

    @classmethod
    async def connect(
        cls,
        kubeconfig: Path | None,
        context: str | None,
        namespaces: Iterable[str] = (),
        *,
        hub_url: str | None = None,
    ) -> CallerReaders:
        """The hub cluster's address and CA as kubectl would resolve them (in-cluster in a
        Pod), without the credentials. Raises as :meth:`HubReader.connect`."""
        _, cfg = await configuration(kubeconfig, context)
        return cls(cfg, namespaces, hub_url=hub_url)

    def __len__(self) -> int:
        return len(self._readers)

    async def reader(self, token: str) -> HubReader:
        """The reader of the caller with ``token`` (a cleaned token, see :func:`clean_token`),
        made on first use after a ``SelfSubjectReview`` names its user. Raises
        :class:`TokenRefused` when the API server does not accept the token (401), and
        :class:`~gpufed.console.reader.HubReadError` when it cannot say (any other answer)."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        await self._expire(now)
        entry = self._readers.get(key)
        if entry is not None:
            entry.used = now
            self._readers.move_to_end(key)
            return entry.reader
        refused_at = self._refused.get(key)
        if refused_at is not None and now - refused_at < REFUSED_S:
            raise TokenRefused("the hub cluster's API server did not accept the token")
        cfg = copy.copy(self._base)
        cfg.api_key = {"BearerToken": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        api = client.ApiClient(configuration=cfg)
        try:
            user = await _whoami(api)
        except TokenRefused:
            await api.close()
            self._refused[key] = now
            self._refused.move_to_end(key)
            while len(self._refused) > MAX_REFUSED:
                self._refused.popitem(last=False)
            raise
        except BaseException:
            await api.close()
            raise
        self._refused.pop(key, None)
        reader = HubReader(
            api,
            CallerSource(user, _namespace_of(user)),
            self._namespaces,
            hub_url=self._hub_url,
        )
        self._readers[key] = _Entry(reader, now)
        while len(self._readers) > self._max:
            _, old = self._readers.popitem(last=False)
            await old.reader.close()
        return reader

    async def _expire(self, now: float) -> None:
        stale = [k for k, e in self._readers.items() if now - e.used > self._idle_s]
        for k in stale:
            await self._readers.pop(k).reader.close()

    async def close(self) -> None:
        """Close every reader."""
        while self._readers:
            _, entry = self._readers.popitem()
            await entry.reader.close()


def _without_credentials(base: client.Configuration) -> client.Configuration:
    cfg = copy.copy(base)
    cfg.api_key = {}
    cfg.api_key_prefix = {}
    cfg.refresh_api_key_hook = None
    cfg.username = ""
    cfg.password = ""
    cfg.cert_file = None
    cfg.key_file = None
    return cfg


async def _whoami(api: client.ApiClient) -> str:
    """The user name the API server gives this client's token (SelfSubjectReview)."""
    try:
        review = await client.AuthenticationV1Api(api).create_self_subject_review(
            client.V1SelfSubjectReview(
                api_version="authentication.k8s.io/v1", kind="SelfSubjectReview"
            )
        )
    except ApiException as exc:
        if exc.status == 401:
            raise TokenRefused("the hub cluster's API server did not accept the token") from exc
        raise HubReadError(
            f"asking the hub cluster's API server who the token is: {exc.status} {exc.reason}"
        ) from exc
    user = review.status.user_info if review.status else None
    return str(user.username) if user and user.username else "an unnamed user"
