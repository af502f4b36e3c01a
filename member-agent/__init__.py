"""gpufed.agent: the member agent process (inventory from Nodes/Pods, hub stream client,
applying work, reporting status). Imports ``gpufed.api`` and ``gpufed.sync``."""
