"""The identities the sandbox's hub and agents run as: the shipped RBAC, one ServiceAccount
token per process, one kubeconfig per process.

:meth:`gpufed.sandbox.runtime.Sandbox.up` calls :func:`install` once the CRDs are installed
and the members joined, before the hub and agents start: for the hub cluster it applies
``manifests/hub/{namespace,serviceaccount,rbac}.yaml``, for every member
``manifests/agent/{namespace,serviceaccount,rbac,admission}.yaml`` (created by kind), asks the API server for a token of the ServiceAccount (TokenRequest,
``TOKEN_SECONDS``) and writes ``identities/<cluster>.kubeconfig`` with it. The processes use
those kubeconfigs, never the admin one, so every test and drill exercises exactly the
permissions an installation from ``manifests/`` grants (least privilege, proved: a missing rule
fails a test, it is not hidden by admin rights). The admin kubeconfig stays the operator's
(setup, ``kubectl``, the tests' own checks).

Raises :class:`IdentityError` naming the manifest or the account when something cannot be
applied; it needs a checkout (``manifests/`` next to the package sources).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import utils
from kubernetes.client.exceptions import ApiException

from gpufed.api.errors import GpufedError
from gpufed.sandbox.pki import Pki
from gpufed.sandbox.state import ClusterEndpoint, write_kubeconfig

#: Namespace of both ServiceAccounts (as in manifests/).
NAMESPACE = "gpufed-system"
HUB_ACCOUNT = "gpufed-hub"
AGENT_ACCOUNT = "gpufed-agent"
#: Lifetime of a sandbox process token: long enough for a sandbox left running for weeks.
TOKEN_SECONDS = 60 * 24 * 3600
_FILES = {
    "hub": ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml"),
    "agent": ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "admission.yaml"),
}


class IdentityError(GpufedError, RuntimeError):
    """The shipped RBAC could not be applied, or no token could be had."""


def manifests_dir() -> Path:
    """``manifests/`` of the checkout this package runs from."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "manifests" / "agent" / "rbac.yaml").is_file():
            return parent / "manifests"
    raise IdentityError(
        f"no manifests/ directory above {here}: the sandbox runs from a gpufed checkout"
    )


def kubeconfig_path(state_dir: Path, cluster: str) -> Path:
    """Where the kubeconfig of the process serving ``cluster`` (the hub, or a member's agent)
    lives."""
    return state_dir / "identities" / f"{cluster}.kubeconfig"


def documents(component: str) -> list[dict[str, Any]]:
    """The objects of ``manifests/<component>/`` that give the process its identity and
    rights (``component``: ``hub`` or ``agent``), in apply order."""
    base = manifests_dir() / component
    docs: list[dict[str, Any]] = []
    for name in _FILES[component]:
        path = base / name
        try:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
        except (OSError, yaml.YAMLError) as exc:
            raise IdentityError(f"cannot read {path}: {exc}") from exc
    return docs


def install(
    api: k8s.ApiClient,
    endpoint: ClusterEndpoint,
    pki: Pki,
    path: Path,
    *,
    component: str,
    account: str,
) -> None:
    """Apply ``manifests/<component>/`` RBAC to the cluster ``api`` talks to, and write at
    ``path`` a kubeconfig (mode 0600) authenticating as ServiceAccount
    ``gpufed-system/<account>`` with a fresh token."""
    for doc in documents(component):
        what = f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}"
        try:
            # Typed creates by kind (a DynamicClient would first discover every API group:
            # seconds per cluster). The clusters are new at every `up`; an object that exists
            # already (409) is the one the manifest describes.
            utils.create_from_dict(api, doc)  # type: ignore[no-untyped-call]
        except utils.FailToCreateError as exc:
            refused = [e for e in exc.api_exceptions if e.status != 409]
            if refused:
                raise IdentityError(
                    f"cannot apply {what} of manifests/{component}/ to {endpoint.name}: "
                    f"{refused[0].status} {refused[0].reason}: {refused[0].body}"
                ) from exc
        except (ApiException, ValueError, AttributeError) as exc:
            raise IdentityError(
                f"cannot apply {what} of manifests/{component}/ to {endpoint.name}: {exc}"
            ) from exc
    request = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=TOKEN_SECONDS)
    )
    try:
        got = k8s.CoreV1Api(api).create_namespaced_service_account_token(
            account, NAMESPACE, request
        )
    except ApiException as exc:
        raise IdentityError(
            f"no token for ServiceAccount {NAMESPACE}/{account} in {endpoint.name}: "
            f"{exc.status} {exc.reason}"
        ) from exc
    token = got.status.token if got.status is not None else None
    if not token:
        raise IdentityError(f"the TokenRequest for {NAMESPACE}/{account} returned no token")
    write_kubeconfig(path, [endpoint], pki, current=endpoint.context, user=account, token=token)
