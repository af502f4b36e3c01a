"""What each console page shows, as plain data: pure functions from hub objects (dicts as the
API server returns them) to view models the templates render.

No I/O and no clock (``now`` is passed in): :mod:`gpufed.console.server` reads with
:mod:`gpufed.console.reader` and renders these with its templates; the unit tests check them
against hand-built objects. One module per page: :mod:`.fleet` (members, their GPUs and NVLink
blocks), :mod:`.queues` (the queue tree, the fair-share line), :mod:`.jobs` (the job list, a
job's timeline); their names are re-exported here.
"""

from gpufed.console.views.fleet import (
    MAX_CELLS,
    BlockView,
    MemberView,
    ProductBar,
    fleet,
    with_blocks,
)
from gpufed.console.views.jobs import (
    PHASES,
    JobRow,
    TimelineEntry,
    age,
    job_rows,
    queue_of,
    timeline,
)
from gpufed.console.views.queues import QueueView, QuotaLine, queue_tree, sparkline

__all__ = [
    "MAX_CELLS",
    "PHASES",
    "BlockView",
    "JobRow",
    "MemberView",
    "ProductBar",
    "QueueView",
    "QuotaLine",
    "TimelineEntry",
    "age",
    "fleet",
    "job_rows",
    "queue_of",
    "queue_tree",
    "sparkline",
    "timeline",
    "with_blocks",
]
