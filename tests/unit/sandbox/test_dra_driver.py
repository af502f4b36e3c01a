"""The sandbox's DRA pools (``nodePools[].dra``) and simulated DRA driver (gpufed.sandbox.dradriver):
the nodes offer no extended resource, the driver's slices are what the real driver publishes,
the agent reads them as the simulator places on them, and MIG through DRA is refused."""

from __future__ import annotations

import pytest

from gpufed.agent.dra import DraState
from gpufed.api.fleet import ClusterSpec, FleetError, node_specs
from gpufed.api.inventory import summarize
from gpufed.placement.sim.simulate import node_inventory
from gpufed.sandbox.dradriver import device_classes, node_slice


def dra_cluster(**pool: object) -> ClusterSpec:
    return ClusterSpec.model_validate(
        {
            "name": "m",
            "nodePools": [
                {
                    "name": "nvl",
                    "nodes": 2,
                    "dra": True,
                    "gpu": {"product": "NVIDIA-GB200", "count": 4},
                    "nvlink": {"nodesPerDomain": 2},
                    **pool,
                },
                {
                    "name": "hgx",
                    "nodes": 1,
                    "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8},
                },
            ],
        }
    )


def test_a_dra_pool_offers_no_extended_resource_and_its_driver_publishes_the_gpus() -> None:
    dra, _, plain = node_specs(dra_cluster())
    assert "nvidia.com/gpu" not in dra.allocatable
    assert dra.dra_gpus == 4
    assert plain.allocatable["nvidia.com/gpu"] == "8"
    assert node_slice(plain) is None
    s = node_slice(dra)
    assert s is not None
    assert s["spec"]["driver"] == "gpu.nvidia.com"
    assert s["spec"]["nodeName"] == dra.name
    assert s["spec"]["pool"] == {"name": dra.name, "generation": 1, "resourceSliceCount": 1}
    names = [d["name"] for d in s["spec"]["devices"]]
    assert names == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    attrs = s["spec"]["devices"][0]["attributes"]
    assert attrs["productName"] == {"string": "NVIDIA GB200"}
    assert attrs["type"] == {"string": "gpu"}
    assert attrs["driverVersion"] == {"version": "580.82.7"}
    uuids = {d["attributes"]["uuid"]["string"] for d in s["spec"]["devices"]}
    assert len(uuids) == 4
    assert {c["metadata"]["name"] for c in device_classes()} == {"gpu.nvidia.com", "mig.nvidia.com"}


def test_the_agent_reads_the_simulated_slices_as_the_simulator_places_on_them() -> None:
    for spec in node_specs(dra_cluster()):
        sim = node_inventory(spec)
        state = DraState()
        s = node_slice(spec)
        if s is None:
            assert not sim.gpus_via_dra
            continue
        state.upsert_slice(s)
        seen = state.node_gpus(spec.name)
        assert seen is not None
        assert seen.groups == sim.dra_gpus
        assert seen.offered == sim.allocatable["nvidia.com/gpu"] == 4
        assert seen.product == sim.gpu_product == "NVIDIA-GB200"
    summary = summarize(node_inventory(s) for s in node_specs(dra_cluster()))
    assert summary.gpus_total == {"NVIDIA-GB200": 8, "NVIDIA-H100-80GB-HBM3": 8}


def test_mig_through_dra_is_refused_naming_the_field() -> None:
    with pytest.raises((FleetError, ValueError)) as err:
        dra_cluster(mig={"strategy": "mixed", "gpus": 1, "profiles": {"1g.23gb": 7}})
    assert "dra" in str(err.value)
    assert "MIG through DRA" in str(err.value)


def test_the_kind_provider_applies_the_driver_objects_after_the_nodes() -> None:
    from gpufed.sandbox.kind import kwok_nodes

    docs = kwok_nodes(dra_cluster())
    assert [d["kind"] for d in docs] == ["Node"] * 3 + ["DeviceClass"] * 2 + ["ResourceSlice"] * 2
