"""gpufed.hub: the hub process (job intake, etcd state, scheduling loop, reservations, agent
gRPC service, status mirroring). Imports ``gpufed.api``, ``gpufed.placement``, ``gpufed.sync``.

Four sub-packages, highest layer first: ``edge`` (the process and its transport), ``components``
(one leader term), ``adapters`` (the ports and what implements them), ``rules`` (pure rules
and records); docs/design.md §9."""
