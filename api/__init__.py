"""gpufed.api: the one schema source shared by every gpufed component.

Pydantic models (inventory, placement requests and decisions, fleet specs, the GPUJob and
MemberCluster custom resources), label and annotation keys, Kubernetes resource arithmetic,
and the agent protocol (``gpufed.api.protocol``). Imports no other gpufed component.
"""
