"""The hub's etcd state: the only module that talks to etcd (through ``aetcd``).

Called by leader election (:mod:`gpufed.hub.edge.leader`) and the components of a leader term
(through :class:`gpufed.hub.adapters.ports.StateStore`). Everything
lives under one key prefix (default ``/gpufed/hub/``); values are JSON of the models in
:mod:`gpufed.hub.rules.records` (and :class:`gpufed.api.decision.Reservation`, kept as JSON text):

=====================================  =========================================================
key (after the prefix)                 value
=====================================  =========================================================
``leader``                             id of the leading hub replica; attached to its lease
``epoch``                              random id of this etcd state, written once when absent;
                                       with the etcd cluster ID it is the hub state epoch
``jobs/<uid>``                         :class:`JobRecord`: the job was placed (exactly-once guard);
                                       ``stopping``: its copy is being stopped for a requeue
``work/<cluster>/<uid>``               :class:`WorkRecord`: the work outbox; its ``mod_revision``
                                       is the work item's revision
``acks/<cluster>/<uid>``               :class:`AckRecord`: the member's latest ack for the job
``reservations/<uid>``                 reservation ledger entry (JSON of ``Reservation``); for
                                       a waiting preemptor, its hold on the freed nodes
``clusters/<cluster>/meta``            :class:`MemberMeta`: served kinds, agent version, lost mark
``clusters/<cluster>/nodechunks/       the last good inventory, in chunks of the nodes of one
<bucket>/<part>``                      bucket (:mod:`gpufed.hub.adapters.nodechunks`)
``clusters/<cluster>/nodes/<node>``    :class:`NodeInventory` (the release before wrote the
                                       inventory per node): read, and deleted at the member's
                                       first write
=====================================  =========================================================

Every write is a transaction guarded by ``value(leader) == <this hub's id>``, so a replica
that lost leadership (its lease expired while it was paused or cut off) cannot write
anything: the write raises :class:`NotLeaderError`. Placement writes the job record, the work
item and the reservation in one transaction that also requires the job record to be absent
(or unchanged since read), so a job is placed at most once (docs/design.md §7 items 1 and 4).
A preemption plan is one transaction too (:meth:`Store.preempt`): the preemptor's hold and
every victim's ``stopping`` mark, each victim's record unchanged since read (§7 item 9).

Transient etcd errors (unavailable, timeouts) are retried here, once, with jittered backoff
(tenacity); callers do not retry around these methods.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import aetcd
import structlog
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)

from gpufed.api.errors import GpufedError, PermanentError, TransientError
from gpufed.api.inventory import NodeInventory
from gpufed.hub.adapters.nodechunks import ChunkIndex
from gpufed.hub.rules.records import (
    AckRecord,
    FairShareRecord,
    JobRecord,
    Loaded,
    MemberMeta,
    RecentNodesRecord,
    WorkRecord,
)
from gpufed.sync.retry import is_retryable

log = structlog.get_logger("gpufed.hub.adapters.store")

T = TypeVar("T")
#: etcd's default ``--max-txn-ops`` is 128; stay below it with room for the guard ops.
_MAX_OPS = 100


class StoreError(GpufedError, RuntimeError):
    """etcd answered, but not as expected (a value that does not decode, for example)."""


class NotLeaderError(StoreError, PermanentError):
    """A guarded write found another replica (or nobody) in the leader key: step down."""


class StoreUnavailableError(StoreError, TransientError):
    """etcd did not answer within the retry budget (about 10 s): pause and start over."""


class ConflictError(StoreError):
    """A placement transaction found the job record changed: someone placed it already."""


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``http://host:port`` or ``host:port`` -> (host, port); ``ValueError`` naming the value."""
    rest = endpoint.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"etcd endpoint {endpoint!r} is not host:port (e.g. 127.0.0.1:2379)")
    return host, int(port)


#: Keys per etcd Range request when the leader loads its state (:meth:`Store.load`). The
#: hub's records are a few KiB at most (a node's inventory ~1 KiB), so a page stays well under
#: :data:`MAX_RECEIVE_BYTES`.
LOAD_PAGE = 500
#: Largest gRPC message the etcd client accepts (gRPC's default is 4 MiB).
MAX_RECEIVE_BYTES = 64 * 1024 * 1024
#: Most value bytes in one inventory transaction (etcd's ``--max-request-bytes`` is 1.5 MiB).
TXN_BYTES = 1024 * 1024
#: Most nodes encoded for one inventory transaction (~1-3 µs each, so a few ms of the event
#: loop at a time).
TXN_NODES = 1024


class Store:
    """Typed access to the hub's keys in etcd (see the module docstring for the layout).

    ``hub_id`` is the value this replica writes into the leader key and that every guarded
    write compares against.
    """

    def __init__(self, client: aetcd.Client, *, prefix: str, hub_id: str) -> None:
        self._client = client
        self.prefix = prefix
        self.hub_id = hub_id
        self._leader_key = self._k("leader")
        #: each member's stored chunks as this replica last loaded or wrote them
        self._chunks = ChunkIndex()

    @classmethod
    async def connect(
        cls, endpoints: Sequence[str], *, prefix: str, hub_id: str, timeout_s: int = 5
    ) -> Store:
        """Connect to the first endpoint (``host:port``); raises on a malformed endpoint."""
        host, port = parse_endpoint(endpoints[0])
        client = aetcd.Client(
            host=host,
            port=port,
            timeout=timeout_s,
            options={"grpc.max_receive_message_length": MAX_RECEIVE_BYTES},
        )
        await client.connect()
        return cls(client, prefix=prefix, hub_id=hub_id)

    async def close(self) -> None:
        """Close the etcd connection."""
        await self._client.close()

    def _k(self, *parts: str) -> bytes:
        return (self.prefix + "/".join(parts)).encode()

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """The one retry layer for etcd: transient errors (the verdict of
        :func:`gpufed.sync.retry.verdict_of`) retry for about 10 s, then
        :class:`StoreUnavailableError`."""
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(is_retryable),
                wait=wait_random_exponential(multiplier=0.1, max=2.0),
                stop=stop_after_delay(10),
                reraise=True,
            ):
                with attempt:
                    return await fn()
        except Exception as exc:
            if is_retryable(exc):
                raise StoreUnavailableError(f"etcd at {self.prefix!r}: {exc}") from exc
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    # --- health -------------------------------------------------------------------------------

    async def ping(self) -> bool:
        """True when etcd answers a read now (for ``/readyz``); never raises."""
        try:
            await self._client.get(self._leader_key)
        except Exception:
            return False
        return True

    # --- leader election ----------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> aetcd.Lease:
        """A new lease of ``ttl_s`` seconds."""
        return await self._call(lambda: self._client.lease(ttl_s))

    async def try_acquire(self, lease: aetcd.Lease) -> bool:
        """Write our id into the leader key if nobody holds it (atomically); True on success."""
        tx = self._client.transactions
        ok, _ = await self._call(
            lambda: self._client.transaction(
                compare=[tx.create(self._leader_key) == 0],
                success=[tx.put(self._leader_key, self.hub_id.encode(), lease=lease)],
                failure=[],
            )
        )
        return bool(ok)

    async def refresh(self, lease: aetcd.Lease) -> int:
        """Keep the lease alive; returns the remaining TTL (<= 0: the lease is gone)."""
        reply = await self._client.refresh_lease(lease.id)
        return int(reply.TTL) if reply is not None else 0

    async def leader(self) -> str | None:
        """Id of the current leader, or None."""
        got = await self._call(lambda: self._client.get(self._leader_key))
        return got.value.decode() if got is not None else None

    async def drop_stale_self(self) -> bool:
        """Delete the leader key if it still names this replica under an older lease (left when
        it stepped down while etcd was unreachable); True when it did."""
        tx = self._client.transactions
        ok, _ = await self._call(
            lambda: self._client.transaction(
                compare=[tx.value(self._leader_key) == self.hub_id.encode()],
                success=[tx.delete(self._leader_key)],
                failure=[],
            )
        )
        return bool(ok)

    async def resign(self, lease: aetcd.Lease) -> None:
        """Give up leadership at once (revoke the lease; the leader key goes with it)."""
        await self._client.revoke_lease(lease.id)

    # --- guarded transactions -----------------------------------------------------------------

    def _leader_compare(self) -> list[Any]:
        tx = self._client.transactions
        return [tx.value(self._leader_key) == self.hub_id.encode()]

    async def _txn(self, ops: list[Any], extra: Iterable[Any] = ()) -> tuple[bool, list[Any]]:
        compare = self._leader_compare() + list(extra)
        ok, responses = await self._call(
            lambda: self._client.transaction(compare=compare, success=ops, failure=[])
        )
        return bool(ok), responses

    async def _guarded(self, ops: list[Any]) -> int:
        """Run ``ops`` under the leader guard; returns the revision they were written at."""
        if not ops:
            return 0
        ok, responses = await self._txn(ops)
        if not ok:
            raise NotLeaderError(f"{self.hub_id} is not the leader any more")
        return _revision(responses)

    # --- placement ----------------------------------------------------------------------------

    async def place(
        self,
        job: JobRecord,
        work: WorkRecord,
        reservation_json: str,
        *,
        expect_job_revision: int | None,
    ) -> tuple[int, int]:
        """Record a placement: job record, work item and reservation in ONE transaction.

        ``expect_job_revision``: None when the job was never placed (the job record must not
        exist), else the ``mod_revision`` the caller read (the job waits to be placed again
        after its member was lost). Returns ``(work revision, job record revision)`` (equal:
        one transaction). Raises :class:`ConflictError` when the job record changed (someone
        placed it), :class:`NotLeaderError` when this replica is not the leader.
        """
        tx = self._client.transactions
        extra = [tx.put(self._k("reservations", job.uid), reservation_json.encode())]
        return await self._record(job, work, extra, expect_job_revision, "placed")

    async def preempt(
        self,
        hold_uid: str,
        hold_json: str,
        victims: Sequence[tuple[JobRecord, int]],
    ) -> int:
        """Commit one preemption plan in ONE transaction, before anything is deleted: the
        preemptor's hold (``reservations/<hold_uid>``: the freed nodes' GPUs, JSON of a
        ``Reservation``) and each victim's job record marked ``stopping`` (each unchanged since
        the ``mod_revision`` given with it). Returns the revision the records were written at.
        Raises :class:`ConflictError` when a victim's record changed (nothing written),
        :class:`NotLeaderError` when this replica is not the leader."""
        tx = self._client.transactions
        ops = [tx.put(self._k("reservations", hold_uid), hold_json.encode())]
        cond = []
        for rec, rev in victims:
            key = self._k("jobs", rec.uid)
            ops.append(tx.put(key, rec.model_dump_json().encode()))
            cond.append(tx.mod(key) == rev)
        ok, responses = await self._txn(ops, cond)
        if ok:
            return _revision(responses)
        if await self.leader() != self.hub_id:
            raise NotLeaderError(f"{self.hub_id} is not the leader any more")
        raise ConflictError(f"a victim's job record changed: preemption for {hold_uid} not written")

    async def adopt(
        self,
        job: JobRecord,
        work: WorkRecord,
        ack: AckRecord | None,
        *,
        expect_job_revision: int | None,
    ) -> tuple[int, int]:
        """Record a placement rebuilt from what survived a loss of state (docs/design.md §7
        item 7): job record, work item and (when the member holds it) its ack, in ONE
        transaction, with no reservation (the member's inventory already counts the pods).

        ``expect_job_revision`` as for :meth:`place`. Returns ``(work revision, job record
        revision)``; :class:`ConflictError` when the job record changed, :class:`NotLeaderError`.
        """
        assert job.cluster is not None
        tx = self._client.transactions
        extra = []
        if ack is not None:
            extra.append(
                tx.put(self._k("acks", job.cluster, job.uid), ack.model_dump_json().encode())
            )
        return await self._record(job, work, extra, expect_job_revision, "recorded")

    async def _record(
        self,
        job: JobRecord,
        work: WorkRecord,
        extra: list[Any],
        expect_job_revision: int | None,
        verb: str,
    ) -> tuple[int, int]:
        """One transaction: the job record (absent, or at ``expect_job_revision``), its work
        item and ``extra`` puts (see :meth:`place`)."""
        assert job.cluster is not None
        tx = self._client.transactions
        job_key = self._k("jobs", job.uid)
        cond = (
            tx.create(job_key) == 0
            if expect_job_revision is None
            else tx.mod(job_key) == expect_job_revision
        )
        ops = [
            tx.put(job_key, job.model_dump_json().encode()),
            tx.put(self._k("work", job.cluster, job.uid), work.model_dump_json().encode()),
            *extra,
        ]
        ok, responses = await self._txn(ops, [cond])
        if ok:
            rev = _revision(responses)
            return rev, rev
        if await self.leader() != self.hub_id:
            raise NotLeaderError(f"{self.hub_id} is not the leader any more")
        raise ConflictError(f"job {job.job} ({job.uid}) was {verb} by someone else")

    async def ensure_epoch(self, new_id: str) -> str:
        """The ``epoch`` key's value, writing ``new_id`` first when it is absent (a new or
        wiped state); returns the hub state epoch as :attr:`Loaded.epoch` spells it."""
        tx = self._client.transactions
        key = self._k("epoch")
        await self._txn([tx.put(key, new_id.encode())], [tx.create(key) == 0])
        got = await self._call(lambda: self._client.get(key))
        if got is None:
            raise StoreError(f"etcd key {key.decode()}: absent right after it was written")
        return f"{got.value.decode()}.{int(got.header.cluster_id):x}"

    async def put_job(self, job: JobRecord, *, expect_revision: int) -> int:
        """Update a job record if unchanged since ``expect_revision``; returns its new revision."""
        tx = self._client.transactions
        key = self._k("jobs", job.uid)
        ok, responses = await self._txn(
            [tx.put(key, job.model_dump_json().encode())], [tx.mod(key) == expect_revision]
        )
        if ok:
            return _revision(responses)
        if await self.leader() != self.hub_id:
            raise NotLeaderError(f"{self.hub_id} is not the leader any more")
        raise ConflictError(f"job record {job.uid} changed since revision {expect_revision}")

    async def put_fair_share(self, record: FairShareRecord) -> None:
        """Replace the queues' decayed usage (key ``fairshare``)."""
        tx = self._client.transactions
        await self._guarded([tx.put(self._k("fairshare"), record.model_dump_json().encode())])

    async def put_recent_nodes(self, record: RecentNodesRecord) -> None:
        """Replace the nodes that left a member or shrank within the hour (key
        ``recentnodes``)."""
        tx = self._client.transactions
        await self._guarded([tx.put(self._k("recentnodes"), record.model_dump_json().encode())])

    async def put_work(self, cluster: str, record: WorkRecord) -> int:
        """Write (replace) one work item; returns its new revision."""
        tx = self._client.transactions
        key = self._k("work", cluster, record.job_uid)
        return await self._guarded([tx.put(key, record.model_dump_json().encode())])

    async def put_ack(self, cluster: str, job_uid: str, ack: AckRecord) -> None:
        """Record the member's latest ack for a job."""
        tx = self._client.transactions
        await self._guarded(
            [tx.put(self._k("acks", cluster, job_uid), ack.model_dump_json().encode())]
        )

    async def forget_work(self, cluster: str, job_uid: str) -> None:
        """Delete one job's work item and ack in one member (the member copy is gone)."""
        tx = self._client.transactions
        await self._guarded(
            [
                tx.delete(self._k("work", cluster, job_uid)),
                tx.delete(self._k("acks", cluster, job_uid)),
            ]
        )

    async def forget_job(self, job_uid: str) -> None:
        """Delete a job's record and reservation (the GPUJob is gone from the hub)."""
        tx = self._client.transactions
        await self._guarded(
            [tx.delete(self._k("jobs", job_uid)), tx.delete(self._k("reservations", job_uid))]
        )

    async def delete_reservations(self, job_uids: Iterable[str]) -> None:
        """Drop reservation ledger entries (pods bound, expired, or job finished)."""
        tx = self._client.transactions
        keys = [self._k("reservations", uid) for uid in job_uids]
        for i in range(0, len(keys), _MAX_OPS):
            await self._guarded([tx.delete(k) for k in keys[i : i + _MAX_OPS]])

    async def put_reservations(self, entries: dict[str, str]) -> None:
        """Write reservation ledger entries (job uid -> JSON), e.g. with restarted TTLs."""
        tx = self._client.transactions
        items = sorted(entries.items())
        for i in range(0, len(items), _MAX_OPS):
            await self._guarded(
                [tx.put(self._k("reservations", u), v.encode()) for u, v in items[i : i + _MAX_OPS]]
            )

    # --- members ------------------------------------------------------------------------------

    async def put_member_meta(self, cluster: str, meta: MemberMeta) -> None:
        """Write a member's meta record (served kinds, agent version, lost mark)."""
        tx = self._client.transactions
        await self._guarded(
            [tx.put(self._k("clusters", cluster, "meta"), meta.model_dump_json().encode())]
        )

    async def write_nodes(
        self, cluster: str, nodes: Mapping[str, NodeInventory], changed: Iterable[str]
    ) -> None:
        """Persist one member's inventory after ``changed`` nodes were upserted or removed:
        ``nodes`` is the member's whole inventory now (name -> node), ``changed`` the names
        added, changed or gone since the last write. Which keys each bucket writes and deletes
        is :meth:`~gpufed.hub.adapters.nodechunks.ChunkIndex.plan_write`'s; here they run
        guarded, in transactions of at most ``_MAX_OPS`` ops, :data:`TXN_BYTES` and
        :data:`TXN_NODES` nodes (the event loop is free between two; a value's JSON is made
        just before its transaction). Raises as the other writes."""
        tx, prefix, end = self._client.transactions, self.prefix, aetcd.utils.prefix_range_end
        plan = self._chunks.plan_write(
            cluster,
            nodes,
            changed,
            put=lambda key, value: tx.put((prefix + key).encode(), value),
            delete=lambda key, under: tx.delete(
                (prefix + key).encode(), range_end=end((prefix + under).encode()) if under else None
            ),
        )
        batch: list[Any] = []
        size = count = 0
        for bucket in plan.buckets:
            ops = bucket.ops
            if batch and (
                len(batch) + len(ops) > _MAX_OPS
                or size + bucket.value_bytes > TXN_BYTES
                or count + bucket.nodes > TXN_NODES
            ):
                await self._guarded(batch)
                batch, size, count = [], 0, 0
            batch += ops
            size += bucket.value_bytes
            count += bucket.nodes
        await self._guarded(batch)
        self._chunks.written(plan)

    async def get_job(self, job_uid: str) -> tuple[JobRecord, int] | None:
        """One job record and its revision (after an ambiguous placement write)."""
        got = await self._call(lambda: self._client.get(self._k("jobs", job_uid)))
        if got is None:
            return None
        return JobRecord.model_validate_json(got.value), int(got.mod_revision)

    async def get_work(self, cluster: str, job_uid: str) -> tuple[WorkRecord, int] | None:
        """One work item and its revision."""
        got = await self._call(lambda: self._client.get(self._k("work", cluster, job_uid)))
        if got is None:
            return None
        return WorkRecord.model_validate_json(got.value), int(got.mod_revision)

    # --- loading ------------------------------------------------------------------------------

    async def load(self) -> Loaded:
        """Read every key under the prefix into a :class:`Loaded` (the leader's starting state).

        Raises :class:`StoreError` naming the key of a value that does not decode: a corrupt
        record is a bug to look at, not something to paper over.
        """
        prefix = self.prefix.encode()
        end = aetcd.utils.prefix_range_end(prefix)
        start, revision = prefix, 0
        out: Loaded | None = None
        self._chunks.start_load()
        while True:
            # Pages of LOAD_PAGE keys, every page at the first page's revision (one consistent
            # view): etcd answers a range in one gRPC message, and a fleet's inventory is far
            # more than one message may carry (a 20,000-node fleet is ~20 MB).
            request = aetcd.rpc.RangeRequest(
                key=start,
                range_end=end,
                limit=LOAD_PAGE,
                revision=revision,
                sort_order=aetcd.rpc.RangeRequest.ASCEND,
                sort_target=aetcd.rpc.RangeRequest.KEY,
            )
            page = await self._call(functools.partial(self._range, request))
            if out is None:
                out = Loaded(cluster_id=int(page.header.cluster_id or 0))
                revision = int(page.header.revision)
            for kv in page.kvs:
                key = kv.key.decode()[len(self.prefix) :]
                try:
                    parts = key.split("/")
                    if not self._chunks.load_key(out.nodes, parts, kv.value):
                        _load_one(out, parts, kv.value, kv.mod_revision)
                except ValueError as exc:
                    raise StoreError(f"etcd key {self.prefix}{key}: {exc}") from exc
            if not page.more or not page.kvs:
                self._chunks.finish_load(out.nodes)
                return out
            start = bytes(page.kvs[-1].key) + b"\0"

    async def _range(self, request: Any) -> Any:
        """One etcd Range request (aetcd's ``get_prefix`` has no ``limit``), its gRPC errors
        translated into aetcd's exceptions as aetcd's own calls are (so the retry verdict
        classifies them alike)."""
        client = self._client
        await client.connect()
        try:
            return await client.kvstub.Range(
                request, timeout=client._timeout, metadata=client.metadata
            )
        except aetcd.rpc.AioRpcError as exc:
            aetcd.exceptions._handle_exception(exc)
            raise


def _load_one(out: Loaded, parts: list[str], value: bytes, revision: int) -> None:
    match parts:
        case ["jobs", uid]:
            out.jobs[uid] = JobRecord.model_validate_json(value)
            out.job_revisions[uid] = revision
        case ["work", cluster, uid]:
            out.work[(cluster, uid)] = (WorkRecord.model_validate_json(value), revision)
        case ["acks", cluster, uid]:
            out.acks[(cluster, uid)] = AckRecord.model_validate_json(value)
        case ["reservations", uid]:
            out.reservations[uid] = value.decode()
        case ["clusters", cluster, "meta"]:
            out.members[cluster] = MemberMeta.model_validate_json(value)
        case ["epoch"]:
            out.epoch_id = value.decode()
        case ["fairshare"]:
            out.fair_share = FairShareRecord.model_validate_json(value)
        case ["recentnodes"]:
            out.recent_nodes = RecentNodesRecord.model_validate_json(value)
        case _:
            pass  # the leader key and anything a newer hub wrote


def _revision(responses: list[Any]) -> int:
    """The store revision a successful transaction was committed at."""
    for r in responses:
        for attr in ("response_put", "response_delete_range"):
            if r.HasField(attr):
                return int(getattr(r, attr).header.revision)
    raise StoreError("transaction response carries no revision")
