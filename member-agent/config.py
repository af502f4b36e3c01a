"""Configuration of one agent process (from ``gpufed agent`` flags).

Owns the settings and their defaults; validated once at start so a wrong flag fails with the
flag's name and the fix, before anything connects.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpufed.api.labels import (
    DEFAULT_BLOCK_LABEL,
    DEFAULT_ORIGIN,
    DEFAULT_RACK_LABEL,
    GPU_CLIQUE_LABEL,
)
from gpufed.sync.manifests import DEFAULT_ALLOWED_KINDS

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class AgentConfig(BaseModel):
    """Settings of one agent.

    ``cluster``: the member cluster's name (must match the identity of its token on the hub);
    ``hub``: ``host:port`` of the hub's gRPC endpoint; ``token_file``: the bootstrap token
    (read on every connect, so a rotated token is picked up); ``ca_file``: PEM bundle to verify
    the hub's TLS certificate (TLS on); ``tls``: TLS with the system roots when no
    ``ca_file`` is given (plaintext otherwise: only for loopback and sandboxes).
    ``kubeconfig``/``context``: member credentials, resolved as kubectl does
    (``$KUBECONFIG``, ``~/.kube/config``, else the in-cluster service account when
    ``kubeconfig`` is None). ``rack_label``/``block_label``/``clique_label``: node label keys of the topology
    levels. ``coalesce_ms``: at most one inventory delta per node per this many milliseconds.
    ``health_host``/``health_port``: where ``/healthz``, ``/readyz`` and ``/metrics`` listen
    (port 0: a free port; -1: off). ``reconnect_max_s``: ceiling of the jittered reconnect
    backoff. ``origin``: the hub's ``--origin``; the agent creates, changes and deletes only
    objects labelled with it (and refuses work items labelled with another).
    ``eviction_grace_s``: how long the objects of a job that the hub's desired set leaves out,
    applied under another hub state epoch, are kept for the hub to claim before they are
    deleted (``--eviction-grace-period``, seconds; docs/agent.md). ``forbidden_retry_s``: how
    long a Forbidden on one job's apply or delete is retried before the job is refused
    (``--forbidden-retry-period``, seconds).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    cluster: str
    hub: str
    token_file: Path
    ca_file: Path | None = None
    tls: bool = False
    kubeconfig: Path | None = None
    context: str | None = None
    rack_label: str = DEFAULT_RACK_LABEL
    block_label: str = DEFAULT_BLOCK_LABEL
    clique_label: str = GPU_CLIQUE_LABEL
    coalesce_ms: int = Field(default=200, ge=0, le=60_000)
    allowed_kinds: frozenset[str] = DEFAULT_ALLOWED_KINDS
    health_host: str = "0.0.0.0"  # the probe endpoint serves the pod network
    health_port: int = Field(default=8081, ge=-1, le=65535)
    reconnect_max_s: float = Field(default=30.0, gt=0)
    origin: str = Field(default=DEFAULT_ORIGIN, min_length=1)
    eviction_grace_s: float = Field(default=3600.0, ge=0, le=30 * 86400)
    forbidden_retry_s: float = Field(default=60.0, ge=0, le=86400)
    log_level: str = "info"

    @field_validator("cluster")
    @classmethod
    def _cluster_name(cls, v: str) -> str:
        if not _DNS_LABEL.match(v) or len(v) > 63:
            raise ValueError(
                f"--cluster: {v!r} is not a DNS label (lower-case letters, digits and '-', "
                "at most 63 characters), e.g. us-east-hgx"
            )
        return v

    @field_validator("hub")
    @classmethod
    def _hub_address(cls, v: str) -> str:
        if "://" in v or ":" not in v:
            raise ValueError(f"--hub: {v!r} must be host:port (e.g. hub.example.com:7443)")
        return v

    def read_token(self) -> str:
        """The bootstrap token (whitespace stripped); raises ValueError naming the file."""
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            raise ValueError(f"--token-file {self.token_file}: {exc.strerror}") from exc
        if not token:
            raise ValueError(f"--token-file {self.token_file}: the file is empty")
        return token
