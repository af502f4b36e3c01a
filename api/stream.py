"""What an agent stream carries besides work: the hello and the member's inventory, as models.

The hub's transport edge (:mod:`gpufed.hub.adapters.sessions`) decodes the protocol messages of
``api/protocol/agent.proto`` into these models after applying the stream's sequence rules
(snapshot parts in order, deltas exactly ``seq + 1``); the hub's logic receives only these,
:class:`gpufed.api.work.WorkAck` and :class:`gpufed.api.work.WorkloadStatus`, and never a
protobuf message.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from gpufed.api.inventory import NodeInventory
from gpufed.api.work import WorkAck, WorkloadStatus


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HeldJob(_Model):
    """A job whose objects exist in the member (the agent lists them in its Hello).

    ``hub_epoch``: the ``gpufed.io/hub-epoch`` its objects carry ("" when unknown or mixed);
    ``kind``/``name``/``namespace``: its main workload object in the member ("" when none).
    """

    job_uid: str
    hub_epoch: str = ""
    kind: str = ""
    name: str = ""
    namespace: str = ""


class AgentHello(_Model):
    """The first message of a stream: who the agent is.

    ``cluster``: the member's name (must match the join token's); ``cluster_uid``: UID of the
    member's kube-system Namespace, i.e. which Kubernetes cluster the agent talks to (``""``:
    unknown, an older agent or no access); ``served_kinds``: workload kinds as ``Kind.group``;
    ``agent_instance``: a random id per agent process (restarts are visible);
    ``held_jobs``: the jobs of this hub's origin whose objects exist in the member (at most
    :data:`gpufed.api.bounds.MAX_HELD_JOBS`), from which a hub that lost its state rebuilds.
    """

    cluster: str
    protocol_version: int = 0
    agent_version: str = ""
    agent_instance: str = ""
    served_kinds: tuple[str, ...] = ()
    cluster_uid: str = ""
    held_jobs: tuple[HeldJob, ...] = ()


class InventorySnapshot(_Model):
    """A complete inventory (every part received, in order): replaces the stored one.

    ``served_kinds`` is empty when the snapshot did not say (the Hello's then apply).
    """

    seq: int
    nodes: tuple[NodeInventory, ...]
    served_kinds: tuple[str, ...] = ()


class InventoryDelta(_Model):
    """Changes since the previous inventory message (``seq`` = previous + 1): nodes added or
    changed, and the names of nodes removed."""

    seq: int
    upserts: tuple[NodeInventory, ...] = ()
    removed: tuple[str, ...] = ()


class Heartbeat(_Model):
    """The agent is alive; ``member_api_error`` is empty while it reaches its member's API
    server, else why it does not (the hub then shows the member NotReady with that reason)."""

    inventory_seq: int = 0
    member_api_error: str = ""


class ResyncRequest(_Model):
    """The agent asks for the full desired set again (``reason`` for the log)."""

    reason: str = ""


#: Everything the hub's logic receives from an agent stream after the Hello.
AgentEvent = (
    Heartbeat | InventorySnapshot | InventoryDelta | WorkAck | WorkloadStatus | ResyncRequest
)
