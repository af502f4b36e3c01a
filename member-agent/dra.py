"""The member's GPUs published through DRA: ResourceSlices of ``gpu.nvidia.com`` and the
ResourceClaims that hold them, reduced to whole GPUs offered and held per node.

Owns the agent's picture of DRA (``resource.k8s.io/v1``): per pool only the slices of its
newest ``spec.pool.generation`` count (older ones are leftovers the driver is replacing), and
a pool whose newest generation is not complete yet (fewer slices seen than
``resourceSliceCount``) makes its node degraded rather than half-counted. A claim holds the
devices of ``status.allocation.devices.results`` of this driver; a device held by a claim
counts once, however many pods the claim is reserved for (and a device two claims name, which
the scheduler never allocates, counts for the first seen). Only node-local slices
(``spec.nodeName``) of whole GPUs (``type: gpu``) count: MIG devices published through DRA and
network-attached devices (``nodeSelector``, ``allNodes``, ``perDeviceNodeSelection``) are not
read yet (docs/placement.md, "DRA and ComputeDomains").

Fed by the ResourceSlice and ResourceClaim informers of :mod:`gpufed.agent.agent`, read by
:class:`gpufed.agent.inventory.InventoryState` when it builds a node. Pure and synchronous:
no I/O, no clock. Bad input degrades only its node (a slice whose device cannot be read).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufed.api.dra import DeviceFacts, device_facts
from gpufed.api.gpus import gfd_product_name
from gpufed.api.inventory import MAX_DEVICE_GROUPS, DeviceGroup
from gpufed.api.labels import DRA_GPU_DRIVER, GPU_RESOURCE

_Device = tuple[str, str]  # (pool, device name)


@dataclass(frozen=True, slots=True)
class SliceFacts:
    """What the agent keeps of one ResourceSlice of the GPU driver."""

    name: str
    pool: str
    generation: int
    slice_count: int
    node: str | None
    devices: tuple[DeviceFacts, ...]
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimFacts:
    """What the agent keeps of one allocated ResourceClaim: the GPU driver's devices it holds
    and the pods (``namespace/name``) it is reserved for."""

    devices: tuple[_Device, ...]
    pods: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NodeGPUs:
    """The DRA GPUs of one node: ``offered`` whole GPUs, ``held`` of them by claims,
    ``held_by_pod`` (pod key -> GPUs, for the job attribution; a claim's devices go to the
    first pod it is reserved for), ``groups`` for placement, ``product`` (GFD form) and the
    problems that degrade the node."""

    offered: int
    held: int
    held_by_pod: Mapping[str, int]
    groups: tuple[DeviceGroup, ...]
    product: str | None
    problems: tuple[str, ...]


def slice_facts(raw: Mapping[str, Any]) -> SliceFacts | None:
    """Reduce a ResourceSlice; None when it is not the GPU driver's. Never raises: an
    unreadable device becomes the slice's ``problem``."""
    spec = raw.get("spec") or {}
    if spec.get("driver") != DRA_GPU_DRIVER:
        return None
    name = str((raw.get("metadata") or {}).get("name", ""))
    pool = spec.get("pool") or {}
    node = spec.get("nodeName")
    facts: list[DeviceFacts] = []
    problem = None
    for i, dev in enumerate(spec.get("devices") or []):
        try:
            facts.append(device_facts(dev or {}, field=f"spec.devices[{i}]"))
        except ValueError as exc:
            problem = f"ResourceSlice {name}: {exc}"
            break
    try:
        generation = int(pool.get("generation") or 0)
        count = int(pool.get("resourceSliceCount") or 1)
    except (TypeError, ValueError):
        generation, count = 0, 1
        problem = problem or f"ResourceSlice {name}: spec.pool: generation or count not integers"
    return SliceFacts(
        name=name,
        pool=str(pool.get("name", "")),
        generation=generation,
        slice_count=max(1, count),
        node=str(node) if node else None,
        devices=tuple(facts),
        problem=problem,
    )


def claim_key(raw: Mapping[str, Any]) -> str:
    """``namespace/name`` of a claim object."""
    meta = raw.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def claim_facts(raw: Mapping[str, Any]) -> ClaimFacts | None:
    """Reduce a ResourceClaim; None when it holds none of the GPU driver's devices."""
    status = raw.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    devices = tuple(
        sorted(
            {
                (str(r.get("pool", "")), str(r.get("device", "")))
                for r in results
                if isinstance(r, Mapping) and r.get("driver") == DRA_GPU_DRIVER
            }
        )
    )
    if not devices:
        return None
    namespace = str((raw.get("metadata") or {}).get("namespace", ""))
    pods = tuple(
        f"{namespace}/{ref.get('name', '')}"
        for ref in status.get("reservedFor") or []
        if isinstance(ref, Mapping) and ref.get("resource") == "pods" and not ref.get("apiGroup")
    )
    return ClaimFacts(devices=devices, pods=pods)


@dataclass
class _Pool:
    """The slices of one pool, and what its newest complete generation offers."""

    slices: dict[str, SliceFacts] = field(default_factory=dict)
    node: str | None = None
    devices: dict[str, DeviceFacts] = field(default_factory=dict)
    problems: tuple[str, ...] = ()


class DraState:
    """ResourceSlices and ResourceClaims of one member, per node.

    ``on_node(name)`` is called for every node whose DRA GPUs may have changed (the inventory
    marks it dirty).
    """

    def __init__(self, on_node: Callable[[str], None] | None = None) -> None:
        self._on_node = on_node
        self._slice_pool: dict[str, str] = {}
        self._pools: dict[str, _Pool] = {}
        self._node_pools: dict[str, set[str]] = {}
        self._claims: dict[str, ClaimFacts] = {}
        self._holder: dict[_Device, str] = {}
        self._slice_relist: set[str] | None = None
        self._claim_relist: set[str] | None = None

    # --- slices ------------------------------------------------------------------------------

    def upsert_slice(self, raw: Mapping[str, Any]) -> None:
        name = str((raw.get("metadata") or {}).get("name", ""))
        if self._slice_relist is not None:
            self._slice_relist.add(name)
        facts = slice_facts(raw)
        old_pool = self._slice_pool.get(name)
        if (
            facts is not None
            and old_pool == facts.pool
            and self._pools[old_pool].slices.get(name) == facts
        ):
            return
        if old_pool is not None:
            self._pools[old_pool].slices.pop(name, None)
            del self._slice_pool[name]
            self._refresh(old_pool)
        if facts is not None:
            self._slice_pool[name] = facts.pool
            self._pools.setdefault(facts.pool, _Pool()).slices[name] = facts
            self._refresh(facts.pool)

    def delete_slice(self, name: str) -> None:
        pool = self._slice_pool.pop(name, None)
        if pool is not None:
            self._pools[pool].slices.pop(name, None)
            self._refresh(pool)

    def begin_slice_relist(self) -> None:
        self._slice_relist = set()

    def end_slice_relist(self) -> None:
        seen, self._slice_relist = self._slice_relist, None
        if seen is not None:
            for name in [n for n in self._slice_pool if n not in seen]:
                self.delete_slice(name)

    def _refresh(self, pool_name: str) -> None:
        """Recompute what a pool offers from its newest generation, and touch its nodes."""
        pool = self._pools[pool_name]
        before = pool.node
        if not pool.slices:
            del self._pools[pool_name]
            pool.node = None
        else:
            newest = max(s.generation for s in pool.slices.values())
            current = sorted(
                (s for s in pool.slices.values() if s.generation == newest), key=lambda s: s.name
            )
            problems = [s.problem for s in current if s.problem]
            expected = max(s.slice_count for s in current)
            if len(current) < expected:
                problems.append(
                    f"DRA pool {pool_name}: {len(current)} of {expected} ResourceSlices of "
                    f"generation {newest} seen"
                )
            nodes = {s.node for s in current}
            if len(nodes) != 1 or None in nodes:
                # Not one node's GPUs (nodeSelector, allNodes or per-device nodes): not read.
                pool.node, pool.devices, pool.problems = None, {}, ()
            else:
                pool.node = current[0].node
                pool.devices = {d.name: d for s in current for d in s.devices if d.whole_gpu}
                pool.problems = tuple(problems)
        for node in {before, pool.node} - {None}:
            assert node is not None
            pools = self._node_pools.setdefault(node, set())
            if pool.node == node and pool_name in self._pools:
                pools.add(pool_name)
            else:
                pools.discard(pool_name)
                if not pools:
                    del self._node_pools[node]
            self._touch(node)

    # --- claims ------------------------------------------------------------------------------

    def upsert_claim(self, raw: Mapping[str, Any]) -> None:
        key = claim_key(raw)
        if self._claim_relist is not None:
            self._claim_relist.add(key)
        self._set_claim(key, claim_facts(raw))

    def delete_claim(self, key: str) -> None:
        self._set_claim(key, None)

    def begin_claim_relist(self) -> None:
        self._claim_relist = set()

    def end_claim_relist(self) -> None:
        seen, self._claim_relist = self._claim_relist, None
        if seen is not None:
            for key in [k for k in self._claims if k not in seen]:
                self._set_claim(key, None)

    def _set_claim(self, key: str, new: ClaimFacts | None) -> None:
        old = self._claims.get(key)
        if old == new:
            return
        touched: set[_Device] = set()
        if old is not None:
            del self._claims[key]
            for dev in old.devices:
                if self._holder.get(dev) == key:
                    del self._holder[dev]
                touched.add(dev)
        if new is not None:
            self._claims[key] = new
            for dev in new.devices:
                self._holder.setdefault(dev, key)
                touched.add(dev)
        for node in sorted({n for n in (self._node_of(d) for d in touched) if n is not None}):
            self._touch(node)

    def _node_of(self, device: _Device) -> str | None:
        pool = self._pools.get(device[0])
        return pool.node if pool is not None else None

    # --- reading -----------------------------------------------------------------------------

    def _touch(self, node: str) -> None:
        if self._on_node is not None:
            self._on_node(node)

    def nodes(self) -> list[str]:
        """Nodes that have a pool of the GPU driver."""
        return sorted(self._node_pools)

    def node_gpus(self, node: str) -> NodeGPUs | None:
        """The DRA GPUs of ``node``, None when it publishes no pool of the GPU driver."""
        pool_names = self._node_pools.get(node)
        if not pool_names:
            return None
        groups: dict[tuple[Any, ...], list[int]] = {}
        held_by_pod: dict[str, int] = {}
        problems: list[str] = []
        held = offered = 0
        for pool_name in sorted(pool_names):
            pool = self._pools[pool_name]
            problems.extend(pool.problems)
            for dev_name, dev in sorted(pool.devices.items()):
                holder = self._holder.get((pool_name, dev_name))
                counts = groups.setdefault((dev.attributes, dev.versions, dev.capacity), [0, 0])
                counts[0] += 1
                offered += 1
                if holder is not None:
                    counts[1] += 1
                    held += 1
                    pods = self._claims[holder].pods
                    if pods:
                        held_by_pod[pods[0]] = held_by_pod.get(pods[0], 0) + 1
        if len(groups) > MAX_DEVICE_GROUPS:
            problems.append(
                f"DRA: {len(groups)} kinds of GPU on one node, at most {MAX_DEVICE_GROUPS} read"
            )
        out = tuple(
            DeviceGroup(
                count=c[0],
                allocated=c[1],
                attributes=dict(attrs),
                versions=dict(versions),
                capacity=dict(capacity),
            )
            for (attrs, versions, capacity), c in sorted(groups.items(), key=_group_order)
        )[:MAX_DEVICE_GROUPS]
        product = next(
            (
                gfd_product_name(str(g.attributes["productName"]))
                for g in out
                if "productName" in g.attributes
            ),
            None,
        )
        return NodeGPUs(
            offered=offered,
            held=held,
            held_by_pod=held_by_pod,
            groups=out,
            product=product,
            problems=tuple(problems),
        )


def _group_order(item: tuple[tuple[Any, ...], list[int]]) -> tuple[int, str]:
    """Largest group first, then by its attributes: the first group names the product."""
    return (-item[1][0], repr(item[0]))


def count_once(
    dra: NodeGPUs,
    job_of: Mapping[str, str | None],
    allocatable: dict[str, int],
    requested: dict[str, int],
    job_requests: dict[str, dict[str, int]],
) -> None:
    """Count a DRA node's GPUs once, in place: allocatable ``nvidia.com/gpu`` = the published
    devices, requested = those claims hold, per job through ``job_of`` (pod key -> its
    ``gpufed.io/job-uid``). A pod's own ``nvidia.com/gpu`` request on such a node is served by
    a claim (the DeviceClass's ``extendedResourceName``), so it is not added again."""
    allocatable[GPU_RESOURCE] = dra.offered
    if dra.held:
        requested[GPU_RESOURCE] = dra.held
    else:
        requested.pop(GPU_RESOURCE, None)
    for amounts in job_requests.values():
        amounts.pop(GPU_RESOURCE, None)
    for pod, gpus in dra.held_by_pod.items():
        uid = job_of.get(pod)
        if uid:
            per_job = job_requests.setdefault(uid, {})
            per_job[GPU_RESOURCE] = per_job.get(GPU_RESOURCE, 0) + gpus
    for uid in [u for u, r in job_requests.items() if not r]:
        del job_requests[uid]


class SliceHandler:
    """Informer handler feeding ResourceSlices into a :class:`DraState`."""

    def __init__(self, state: DraState) -> None:
        self.state = state

    def begin_relist(self) -> None:
        self.state.begin_slice_relist()

    def upsert(self, obj: dict[str, Any]) -> None:
        self.state.upsert_slice(obj)

    def delete(self, obj: dict[str, Any]) -> None:
        self.state.delete_slice(str((obj.get("metadata") or {}).get("name", "")))

    def end_relist(self) -> None:
        self.state.end_slice_relist()


class ClaimHandler:
    """Informer handler feeding ResourceClaims into a :class:`DraState`."""

    def __init__(self, state: DraState) -> None:
        self.state = state

    def begin_relist(self) -> None:
        self.state.begin_claim_relist()

    def upsert(self, obj: dict[str, Any]) -> None:
        self.state.upsert_claim(obj)

    def delete(self, obj: dict[str, Any]) -> None:
        self.state.delete_claim(claim_key(obj))

    def end_relist(self) -> None:
        self.state.end_claim_relist()
