"""gpufed.sandbox: the local multi-cluster sandbox (building and running real control planes,
kwok GPU nodes from a fleet spec, kind provider). Imports only ``gpufed.api``."""
