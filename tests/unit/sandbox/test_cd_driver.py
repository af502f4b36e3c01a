"""The sandbox's simulated ComputeDomain controller: its CRD, channel slices, templates, and which
nodes joined a domain (the parts that need no API server)."""

from __future__ import annotations

from gpufed.api.fleet import FleetSpec, node_specs
from gpufed.sandbox.cddriver import channel_slice, channel_template, crd, joined_nodes

FLEET = FleetSpec.model_validate(
    {
        "clusters": [
            {
                "name": "nvl",
                "computeDomains": True,
                "nodePools": [
                    {"name": "gb", "nodes": 2, "gpu": {"product": "NVIDIA-GB200", "count": 4},
                     "nvlink": {"nodesPerDomain": 2}, "dra": True},
                    {"name": "plain", "nodes": 1, "gpu": {"product": "NVIDIA-GB200", "count": 4},
                     "nvlink": "node"},
                ],
            }
        ]
    }
)  # fmt: skip


def test_the_fleet_field_and_a_channel_per_gpu_node() -> None:
    cluster = FLEET.clusters[0]
    assert cluster.compute_domains
    slices = [channel_slice(s) for s in node_specs(cluster)]
    assert all(s is not None for s in slices)  # DRA and device-plugin GPU nodes alike
    s = slices[0]
    assert s is not None
    assert s["spec"]["driver"] == "compute-domain.nvidia.com"
    assert s["spec"]["devices"] == [
        {"name": "channel-0", "attributes": {"type": {"string": "channel"}, "id": {"int": 0}}}
    ]


def test_crd_names_the_documented_fields() -> None:
    c = crd()
    assert c["metadata"]["name"] == "computedomains.resource.nvidia.com"
    (version,) = c["spec"]["versions"]
    assert version["name"] == "v1beta1"
    assert version["subresources"] == {"status": {}}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert set(spec) == {"numNodes", "channel"}
    assert spec["channel"]["properties"]["allocationMode"]["enum"] == ["Single", "All"]


def test_template_and_joined_nodes() -> None:
    domain = {
        "metadata": {"name": "train", "namespace": "team-a", "uid": "cd-1"},
        "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "train-ch"}}},
    }
    tpl = channel_template(domain)
    assert tpl["metadata"]["name"] == "train-ch"
    assert tpl["metadata"]["ownerReferences"][0]["uid"] == "cd-1"
    claim_spec = tpl["spec"]["spec"]
    allocated = {
        "spec": claim_spec,
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"driver": "compute-domain.nvidia.com", "pool": "n1", "device": "channel-0"}
                    ]
                }
            }
        },
    }
    pending = {"spec": claim_spec}
    gpu_claim = {
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"driver": "gpu.nvidia.com", "pool": "n2", "device": "gpu-0"}]
                }
            }
        },
    }
    assert joined_nodes([allocated, pending, gpu_claim]) == {"cd-1": {"n1"}}
