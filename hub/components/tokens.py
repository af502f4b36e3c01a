"""Join tokens: the watched token Secrets, which member each token belongs to, and the one
check of an agent's credentials.

Owned by one leader term (:class:`gpufed.hub.components.core.Controller` builds it; :mod:`gpufed.hub.components.members`
tells it when a MemberCluster's ``spec.joinTokenRef`` changes or the member goes;
:mod:`gpufed.hub.edge.service` asks :meth:`JoinTokens.authenticate`).

- **Watched, not read on demand.** The term list+watches (:func:`gpufed.hub.adapters.listwatch.list_watch`)
  the Secrets labelled ``gpufed.io/join-token=true`` in the hub's token namespace
  (``--token-namespace``) and in every other namespace a MemberCluster's ``joinTokenRef``
  names (one watch per namespace, started when first named). Unlabelled Secrets are never
  cached; a member whose Secret is not labelled has no token (``hub.token.absent`` says how
  to fix it). RBAC must allow ``list``/``watch`` of Secrets in those namespaces (a Role per
  namespace, ``manifests/hub/rbac.yaml``); a namespace the hub may not read is retried with
  backoff and logged (``hub.list_failed``), it does not end the term.
- **Rotation and revocation take effect at once.** When the token a member resolves to
  changes (the Secret's key was rewritten, the Secret deleted or unlabelled, or
  ``joinTokenRef`` now names another Secret), the member's open stream is closed with
  ``PERMISSION_DENIED`` and the reason; a new stream with the old token is refused
  ``UNAUTHENTICATED`` from then on.
- **Unauthenticated callers cost no Kubernetes request**: :meth:`JoinTokens.authenticate`
  compares a SHA-256 digest of the presented token against the in-memory map, nothing else
  (dict lookup on a digest: no timing signal about the token's bytes). A token two members
  share authenticates neither (``hub.token.shared``).

Client certificates (a later issue) join in :class:`Credentials` and
:meth:`JoinTokens.authenticate`, the one place a credential is checked.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpufed.api.labels import JOIN_TOKEN_LABEL
from gpufed.hub.adapters.listwatch import list_watch
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.components.term import MemberState, Term
from gpufed.sync.retry import Verdict

log = structlog.get_logger("gpufed.hub.components.tokens")

#: The label selector of the watched Secrets.
SELECTOR = f"{JOIN_TOKEN_LABEL}=true"


@dataclass(frozen=True)
class Credentials:
    """What an agent presented on its stream: ``bearer``, the join token of
    ``authorization: Bearer <token>`` (None when absent)."""

    bearer: str | None


@dataclass
class _Namespace:
    """One watched namespace: ``attempted`` is set once its first list answered (or failed)."""

    attempted: asyncio.Event = field(default_factory=asyncio.Event)
    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> data (base64)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class JoinTokens:
    """The join tokens of one leader term (see the module docstring)."""

    def __init__(self, term: Term) -> None:
        self._term = term
        self._namespaces: dict[str, _Namespace] = {}
        #: member name -> digest of its current token (absent: no token)
        self._digest_of: dict[str, bytes] = {}
        #: digest -> the members whose token it is (more than one: refused)
        self._holders: dict[bytes, set[str]] = {}

    # --- watching ------------------------------------------------------------------------------

    def start(self) -> None:
        """Watch the default token namespace (the term's loops call this once)."""
        self._want(self._term.config.token_namespace)

    def _want(self, namespace: str) -> None:
        if namespace in self._namespaces:
            return
        self._namespaces[namespace] = _Namespace()
        self._term.spawn(self._list_watch(namespace))

    async def _list_watch(self, namespace: str) -> None:
        kube = self._term.kube
        ns = self._namespaces[namespace]
        await list_watch(
            f"secrets/{namespace}",
            lambda: kube.list_secrets(namespace, SELECTOR),
            lambda rv: kube.watch_secrets(namespace, rv, SELECTOR),
            on_listed=lambda items: self._listed(namespace, items),
            on_event=lambda ev: self._changed(namespace, ev),
            # 403: no Role in that namespace; the operator can add one while the hub runs.
            tolerate=frozenset({Verdict.RETRY, Verdict.REFUSED}),
            on_error=lambda _exc: ns.attempted.set(),
        )

    def _listed(self, namespace: str, items: list[dict[str, Any]]) -> None:
        ns = self._namespaces[namespace]
        ns.secrets = {
            str(o.get("metadata", {}).get("name", "")): dict(o.get("data") or {}) for o in items
        }
        ns.attempted.set()
        self._resolve(lambda ref: ref[0] == namespace)

    def _changed(self, namespace: str, ev: WatchEvent) -> None:
        name = str(ev.obj.get("metadata", {}).get("name", ""))
        secrets = self._namespaces[namespace].secrets
        if ev.type == "DELETED":
            secrets.pop(name, None)
        else:
            secrets[name] = dict(ev.obj.get("data") or {})
        self._resolve(lambda ref: ref[:2] == (namespace, name))

    async def synced(self) -> None:
        """Wait until every watched namespace's first list answered (or failed)."""
        while True:
            pending = [ns for ns in self._namespaces.values() if not ns.attempted.is_set()]
            if not pending:
                return
            await pending[0].attempted.wait()

    # --- members -------------------------------------------------------------------------------

    def member_changed(self, m: MemberState) -> None:
        """``m``'s MemberCluster was added or changed: watch its token namespace, resolve its
        token again (a new ``joinTokenRef`` closes streams opened with the old token)."""
        ref = self._ref(m)
        if ref is not None:
            self._want(ref[0])
        self._resolve(lambda _ref: True, only=m)

    def member_gone(self, name: str) -> None:
        """The MemberCluster was deleted: its token authenticates nobody any more."""
        self._set(name, None)

    def _ref(self, m: MemberState) -> tuple[str, str, str] | None:
        if m.spec is None:
            return None
        ref = m.spec.join_token_ref
        return ref.namespace or self._term.config.token_namespace, ref.name, ref.key

    def _resolve(
        self, refers: Callable[[tuple[str, str, str]], bool], *, only: MemberState | None = None
    ) -> None:
        """Recompute the token of every registered member whose Secret ``refers(ref)``; with
        ``only``, of that member alone (one MemberCluster event reads one member, not the fleet)."""
        members = self._term.state.registered_members() if only is None else [only]
        for m in members:
            ref = self._ref(m)
            if ref is None or not refers(ref):
                continue
            namespace, name, key = ref
            ns = self._namespaces.get(namespace)
            token = self._decode(ref, ns.secrets.get(name)) if ns is not None else None
            listed = ns is not None and ns.attempted.is_set()
            if token is None and listed and (m.name in self._digest_of or only is not None):
                log.warning(
                    "hub.token.absent",
                    cluster=m.name,
                    secret=f"{namespace}/{name}",
                    key=key,
                    fix=f"create it with `gpufed hub join {m.name}`, or label it "
                    f"{SELECTOR} (the hub watches labelled Secrets only)",
                )
            self._set(m.name, token, secret=f"{namespace}/{name}", m=m)

    @staticmethod
    def _decode(ref: tuple[str, str, str], data: dict[str, Any] | None) -> str | None:
        if data is None or ref[2] not in data:
            return None
        try:
            token = base64.b64decode(str(data[ref[2]]), validate=True).decode().strip()
        except (binascii.Error, UnicodeDecodeError):
            log.warning("hub.token.undecodable", secret=f"{ref[0]}/{ref[1]}", key=ref[2])
            return None
        return token or None

    def _set(
        self, name: str, token: str | None, *, secret: str = "", m: MemberState | None = None
    ) -> None:
        new = _digest(token) if token is not None else None
        old = self._digest_of.get(name)
        if new == old:
            return
        if old is not None:
            del self._digest_of[name]
            holders = self._holders[old]
            holders.discard(name)
            if not holders:
                del self._holders[old]
        if new is not None:
            self._digest_of[name] = new
            holders = self._holders.setdefault(new, set())
            holders.add(name)
            if len(holders) > 1:
                log.warning("hub.token.shared", clusters=sorted(holders))
        if old is None:
            return
        # The token that authenticated this member's stream is no longer its token.
        how = "rotated" if new is not None else "revoked"
        reason = f"the join token of member {name} was {how}" + (
            f" (Secret {secret})" if secret else ""
        )
        log.info("hub.token.changed", cluster=name, change=how, secret=secret)
        member = m or self._term.state.members.get(name)
        if member is not None and member.session is not None:
            # PERMISSION_DENIED: the stream's credential no longer grants it; a new stream with
            # the old token is refused UNAUTHENTICATED (hub/edge/service.py).
            member.session.close("PERMISSION_DENIED", reason)

    # --- authentication ------------------------------------------------------------------------

    def authenticate(self, creds: Credentials) -> str | None:
        """The member whose credentials these are, or None. In memory only: no Kubernetes or
        etcd request, whatever the caller presents."""
        if creds.bearer is None:
            return None
        holders = self._holders.get(_digest(creds.bearer), ())
        return next(iter(holders)) if len(holders) == 1 else None
