"""The plugin vocabulary of placement: result codes, a filter's :class:`Status`, and the
Protocols member filters, pool filters, the planner and scorers satisfy.

The plugins themselves are :mod:`.filters` and :mod:`.scorers`; the tuples ``place()`` runs,
in order, are :func:`gpufed.placement.plugins.plugins_for` (which re-exports these names).
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Protocol

from gpufed.placement.fit import Plan
from gpufed.placement.index import PoolState
from gpufed.placement.member import ClusterState
from gpufed.placement.memo import PoolMemo
from gpufed.placement.shape import JobShape


class Code(StrEnum):
    """Result codes of filter plugins (kube-scheduler / Karmada vocabulary)."""

    SUCCESS = "Success"
    #: does not fit now; may fit when jobs finish, health returns or reservations expire
    UNSCHEDULABLE = "Unschedulable"
    #: cannot fit unless the member's configuration or shape changes
    UNRESOLVABLE = "UnschedulableAndUnresolvable"
    #: broken input
    ERROR = "Error"


@dataclass(frozen=True, slots=True)
class Status:
    """A filter's answer: ``code`` and a human ``reason`` (empty on success)."""

    code: Code
    reason: str = ""

    @property
    def ok(self) -> bool:
        """True for ``Success``."""
        return self.code is Code.SUCCESS


SUCCESS: Status = Status(Code.SUCCESS)


class ClusterFilter(Protocol):
    """Judges one member as a whole from its metadata (static: memoised per generation)."""

    name: ClassVar[str]

    def filter(self, job: JobShape, cluster: ClusterState) -> Status:
        """``SUCCESS`` or why the member cannot take the job."""
        ...


class PoolFilter(Protocol):
    """Judges one pool of a member. ``static`` filters are memoised per generation."""

    name: ClassVar[str]
    static: ClassVar[bool]

    def filter(
        self, job: JobShape, cluster: ClusterState, pool: PoolState, memo: PoolMemo
    ) -> Status:
        """``SUCCESS`` or why the pool cannot take the job; ``memo`` is the pool's memo, for
        values derived from the pool that later decisions may reuse."""
        ...


class Planner(Protocol):
    """Chooses nodes for every pod of the job inside one pool (the last filter)."""

    name: ClassVar[str]

    def plan(
        self,
        job: JobShape,
        cluster: ClusterState,
        pool: PoolState | None,
        exclude: Set[str] = frozenset(),
    ) -> Plan | Status:
        """A :class:`Plan` that uses no node in ``exclude``, or the status saying why none
        exists."""
        ...


class Scorer(Protocol):
    """Scores a plan 0-100; ``bound`` never underestimates ``score`` for a pool's plans."""

    name: ClassVar[str]
    weight: float

    def bound(self, job: JobShape, pool: PoolState | None, memo: PoolMemo | None) -> float:
        """Upper bound of :meth:`score` over every plan in ``pool`` (lets ``place`` stop early);
        ``memo`` is the pool's memo (None: nothing remembered)."""
        ...

    def score(self, job: JobShape, plan: Plan) -> float:
        """The plan's score, 0-100."""
        ...
