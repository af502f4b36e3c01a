"""gpufed.hub: the hub process (job intake, etcd state, scheduling loop, reservations, agent
gRPC service, status mirroring). Imports ``gpufed.api``, ``gpufed.placement``, ``gpufed.sync``."""
