"""Fixtures for hub integration tests: a real etcd (one per test session)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpufed.hub.etcd import EmbeddedEtcd
from gpufed.hub.store import Store
from tests.integration.hub.harness import HubAPI


def etcd_binary() -> Path:
    """The etcd binary for tests: $GPUFED_ETCD, the sandbox build cache, /tmp/coldbuild, PATH."""
    env = os.environ.get("GPUFED_ETCD")
    candidates = [Path(env)] if env else []
    candidates += sorted((Path.home() / ".cache" / "gpufed" / "bin").glob("*/etcd"))
    candidates.append(Path("/tmp/coldbuild/bin/etcd"))
    on_path = shutil.which("etcd")
    if on_path:
        candidates.append(Path(on_path))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    pytest.skip("no etcd binary (run `gpufed local build`)")


@pytest.fixture(scope="session")
def etcd_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One embedded etcd for the whole test session; each test uses its own key prefix."""
    etcd = EmbeddedEtcd(etcd_binary(), tmp_path_factory.mktemp("etcd"))
    loop = asyncio.new_event_loop()
    loop.run_until_complete(etcd.start())
    try:
        yield etcd.endpoint
    finally:
        loop.run_until_complete(etcd.stop())
        loop.close()


@pytest.fixture
def prefix() -> str:
    """A fresh key prefix per test."""
    return f"/test/{uuid.uuid4().hex[:8]}/"


@pytest.fixture
async def store(etcd_endpoint: str, prefix: str) -> AsyncIterator[Store]:
    s = await Store.connect([etcd_endpoint], prefix=prefix, hub_id="hub-a")
    try:
        yield s
    finally:
        await s.close()


# --- a hub API server ------------------------------------------------------------------------
# Until the sandbox's session fixture lands, hub tests run their own single kube-apiserver
# (against the session etcd, under its own prefix) with the gpufed CRDs applied.


def _binary(name: str) -> Path:
    candidates = sorted((Path.home() / ".cache" / "gpufed" / "bin").glob(f"*/{name}"))
    candidates.append(Path("/tmp/coldbuild/bin") / name)
    on_path = shutil.which(name)
    if on_path:
        candidates.append(Path(on_path))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    pytest.skip(f"no {name} binary (run `gpufed local build`)")


@pytest.fixture(scope="session")
def hub_kubeconfig(etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A kube-apiserver with the gpufed CRDs; yields the path of an admin kubeconfig."""
    import subprocess
    import time

    import yaml
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from kubernetes import client as kclient
    from kubernetes import config as kconfig

    from gpufed.api.crdgen import all_crds
    from gpufed.hub.etcd import free_port

    run = tmp_path_factory.mktemp("hubapi")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (run / "sa.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    (run / "tokens.csv").write_text('admin-token,admin,admin-uid,"system:masters"\n')
    port = free_port()
    args = [
        str(_binary("kube-apiserver")),
        f"--etcd-servers=http://{etcd_endpoint}",
        f"--etcd-prefix=/hubtest-{uuid.uuid4().hex[:6]}/registry",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={run / 'pki'}",
        f"--token-auth-file={run / 'tokens.csv'}",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={run / 'sa.key'}",
        f"--service-account-signing-key-file={run / 'sa.key'}",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--authorization-mode=RBAC",
        "--disable-admission-plugins=ServiceAccount",
        "--advertise-address=127.0.0.1",
        "--enable-priority-and-fairness=false",
        "--profiling=false",
    ]
    log = (run / "apiserver.log").open("wb")
    proc = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True)
    kubeconfig = run / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "hub",
                        "cluster": {
                            "server": f"https://127.0.0.1:{port}",
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [{"name": "admin", "user": {"token": "admin-token"}}],
                "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "admin"}}],
                "current-context": "hub",
            }
        )
    )
    try:
        api = kclient.ApiClient(kconfig.new_client_from_config(str(kubeconfig)).configuration)
        deadline = time.monotonic() + 90
        while True:
            try:
                kclient.VersionApi(api).get_code()
                kclient.CoreV1Api(api).list_namespace()
                break
            except Exception as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"kube-apiserver did not start; see {run / 'apiserver.log'}"
                    ) from exc
                time.sleep(0.5)
        ext = kclient.ApiextensionsV1Api(api)
        for crd in all_crds().values():
            ext.create_custom_resource_definition(crd)
        for crd in all_crds().values():
            name = crd["metadata"]["name"]
            while not any(
                c.type == "Established" and c.status == "True"
                for c in (ext.read_custom_resource_definition(name).status.conditions or [])
            ):
                time.sleep(0.2)
        core = kclient.CoreV1Api(api)
        for ns in ("gpufed-system", "team-a", "team-b"):
            core.create_namespace({"metadata": {"name": ns}})
        # The API server serves a new CRD a moment after Established; wait until it lists.
        while True:
            try:
                kclient.CustomObjectsApi(api).list_cluster_custom_object(
                    "gpufed.io", "v1alpha1", "gpujobs"
                )
                break
            except Exception:
                time.sleep(0.2)
        api.close()
        yield kubeconfig
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
async def hub_api(hub_kubeconfig: Path) -> AsyncIterator[HubAPI]:
    """Test access to the hub API server; every GPUJob, MemberCluster and join Secret a test
    made is removed afterwards (finalizers stripped), so tests do not see each other."""
    api = await HubAPI.connect(hub_kubeconfig)
    try:
        yield api
    finally:
        jobs = await api.custom.list_cluster_custom_object("gpufed.io", "v1alpha1", "gpujobs")
        for obj in jobs["items"]:
            meta = obj["metadata"]
            with contextlib.suppress(Exception):
                await api.custom.patch_namespaced_custom_object(
                    "gpufed.io",
                    "v1alpha1",
                    meta["namespace"],
                    "gpujobs",
                    meta["name"],
                    {"metadata": {"finalizers": None}},
                    _content_type="application/merge-patch+json",
                )
            with contextlib.suppress(Exception):
                await api.delete_job(meta["name"], meta["namespace"])
        members = await api.custom.list_cluster_custom_object(
            "gpufed.io", "v1alpha1", "memberclusters"
        )
        for obj in members["items"]:
            await api.custom.delete_cluster_custom_object(
                "gpufed.io", "v1alpha1", "memberclusters", obj["metadata"]["name"]
            )
        await api.core.delete_collection_namespaced_secret("gpufed-system")
        await api.close()
