"""gpufed.sync: propagation machinery shared by hub and agent (work items, revisions, manifest
preparation, apply strategies, status summaries, retry classification). Imports only
``gpufed.api``."""
