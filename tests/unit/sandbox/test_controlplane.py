"""The sandbox's hub and agent components as registered (no process starts): the `gpufed`
command lines, ports, TLS from the sandbox CA."""

from __future__ import annotations

import ssl
from pathlib import Path

from cryptography import x509

from gpufed.api.fleet import FleetSpec
from gpufed.sandbox.controlplane import (
    HUB_COMPONENT,
    ControlPlaneOptions,
    configure,
    gpufed_command,
    port_names,
)
from gpufed.sandbox.pki import create_pki
from gpufed.sandbox.supervisor import Supervisor

FLEET = FleetSpec.model_validate(
    {
        "clusters": [
            {
                "name": name,
                "labels": {"region": name},
                "nodePools": [
                    {
                        "name": "h",
                        "nodes": 1,
                        "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8},
                    }
                ],
            }
            for name in ("alpha", "beta")
        ]
    }
)


def test_hub_and_agents_are_registered_as_gpufed_commands(tmp_path: Path) -> None:
    create_pki(tmp_path / "pki")
    sup = Supervisor(tmp_path)
    ports = {name: 40000 + i for i, name in enumerate(port_names(FLEET))}
    kubeconfigs = {n: tmp_path / f"{n}.kubeconfig" for n in ("hub", "alpha", "beta")}
    opts = ControlPlaneOptions(member_lease_s=5, member_lost_s=30, heartbeat_s=1)
    cp = configure(
        sup,
        state_dir=tmp_path,
        fleet=FLEET,
        etcd_url="http://127.0.0.1:2379",
        hub_etcd_prefix="/gpufed/hub/",
        kubeconfigs=kubeconfigs,
        ports=ports,
        options=opts,
    )
    assert sup.names() == [HUB_COMPONENT, "agent/alpha", "agent/beta"]
    hub = sup.spec(HUB_COMPONENT)
    assert hub.argv[: len(gpufed_command()) + 1] == [*gpufed_command(), "hub"]
    for flag in (
        "--etcd=127.0.0.1:2379",
        "--etcd-prefix=/gpufed/hub/",
        f"--listen={cp.hub_address}",
        f"--kubeconfig={kubeconfigs['hub']}",
        "--member-lease=5",
        "--member-lost-timeout=30",
        "--heartbeat-interval=1",
        "--hub-id=sandbox-hub",
    ):
        assert flag in hub.argv
    assert hub.ports == [ports["hub-grpc"], ports["hub-http"]]
    agent = sup.spec("agent/beta")
    for flag in (
        "--cluster=beta",
        f"--hub={cp.hub_address}",
        f"--ca-file={tmp_path / 'pki' / 'ca.crt'}",
        f"--kubeconfig={kubeconfigs['beta']}",
        f"--token-file={tmp_path / 'tokens' / 'beta.token'}",
    ):
        assert flag in agent.argv
    assert cp.agents["beta"].health == f"http://127.0.0.1:{ports['agent/beta']}"

    # The hub's certificate is signed by the sandbox CA the agents trust, for 127.0.0.1.
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    cert_path = next(a.split("=", 1)[1] for a in hub.argv if a.startswith("--tls-cert="))
    cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    ca = x509.load_pem_x509_certificate(cp.ca_file.read_bytes())
    assert cert.issuer == ca.subject
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    assert ctx.verify_mode == ssl.CERT_REQUIRED
