"""The Redis checkpoint store: the ONE module that owns every Redis key of Snapflow.

Nothing else in Snapflow reads or writes Redis. Records are stored as UTF-8 JSON produced by the
``to_dict`` / ``from_dict`` methods of :mod:`coordinator.model`.

Keys (``{ns}`` is the namespace, default ``snapflow``; ``{job}`` a job id):

======================================  ==========  ==============================================
Key                                     Type        Content
======================================  ==========  ==============================================
``{ns}:coordinator:epoch``              string/int  Fencing token. Every coordinator incarnation
                                                    INCRs it once at start (:meth:`acquire_epoch`)
                                                    and every mutation checks it.
``{ns}:coordinator:leader``             hash        The leader lease of highly available
                                                    coordinators (``candidate``, ``address``,
                                                    ``epoch``), with a TTL; renewed by the
                                                    leader (:meth:`try_acquire_lease`).
``{ns}:jobs``                           set         Ids of all jobs.
``{ns}:job:{job}``                      string      :class:`~snapflow.coordinator.model.JobRecord` JSON.
``{ns}:job:{job}:checkpoint-id``        string/int  Checkpoint id counter (INCR). The last id
                                                    handed out; strictly increasing per job, across
                                                    coordinator restarts.
``{ns}:job:{job}:pending``              hash        checkpoint id -> ``PendingCheckpointRecord``
                                                    JSON (enough to abort it after a crash).
``{ns}:job:{job}:completed``            sorted set  Ids of retained completed *checkpoints*
                                                    (member = score = id).
``{ns}:job:{job}:completed-data``       hash        checkpoint id -> ``CompletedCheckpoint`` JSON,
                                                    exactly the members of ``completed``.
``{ns}:job:{job}:savepoints``           hash        checkpoint id -> ``CompletedCheckpoint`` JSON
                                                    of savepoints: never subsumed, never trimmed by
                                                    retention, removed only when disposed.
``{ns}:job:{job}:shared-refs``          hash        shared state file path -> references from
                                                    retained checkpoints (scripts in
                                                    ``coordinator/shared_state.py``).
``{ns}:job:{job}:shared-of``            hash        checkpoint id -> JSON list of the shared paths
                                                    it registered.
======================================  ==========  ==============================================

Fencing: every mutation is one Lua script whose first action compares
``GET {ns}:coordinator:epoch`` with the caller's epoch; on a mismatch it changes nothing and
fails, and the store raises :class:`~snapflow.errors.StaleEpochError`. A store that has not
called :meth:`CheckpointStore.acquire_epoch` cannot mutate anything either. Deletions in
checkpoint storage are fenced the same way: :meth:`CheckpointStore.claim_deletions` decides,
inside one script, which checkpoints' files the caller may delete.

Errors: Redis connection failures and timeouts become :class:`~snapflow.errors.UnavailableError`
(naming the server); a job id that does not exist where one is required becomes
:class:`~snapflow.errors.JobNotFoundError`; creating something that exists
:class:`~snapflow.errors.AlreadyExistsError`.

Note on retries: redis-py retries a command after a connection error. A fenced script that
INCRs (:meth:`CheckpointStore.next_checkpoint_id`) may therefore skip an id after a network
failure; ids stay strictly increasing, which is all that is promised.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from snapflow.coordinator.model import CompletedCheckpoint, JobRecord, PendingCheckpointRecord
from snapflow.coordinator.shared_state import SharedStateRegistry
from snapflow.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    JobNotFoundError,
    SnapflowError,
    StaleEpochError,
    UnavailableError,
)
from snapflow.redis_client import async_redis, describe_client

DEFAULT_NAMESPACE = "snapflow"

# -------------------------------------------------------------------------------------------------
# Lua scripts. KEYS[1] is always the epoch key and ARGV[1] the caller's epoch. Error replies start
# with one of the codes below, which ``_translate_response_error`` maps to Snapflow errors.
# -------------------------------------------------------------------------------------------------

_ERR_STALE_EPOCH = "STALE_EPOCH"
_ERR_ALREADY_EXISTS = "ALREADY_EXISTS"
_ERR_JOB_NOT_FOUND = "JOB_NOT_FOUND"
_ERR_LEADER_ELECTED = "LEADER_ELECTED"

_FENCE = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return redis.error_reply('STALE_EPOCH ' .. tostring(current or 'none') .. ' ' .. ARGV[1])
end
"""

# KEYS: epoch, jobs, job | ARGV: epoch, job_id, job_json
_CREATE_JOB = (
    _FENCE
    + """
if redis.call('EXISTS', KEYS[3]) == 1 then
  return redis.error_reply('ALREADY_EXISTS job ' .. ARGV[2] .. ' already exists')
end
redis.call('SET', KEYS[3], ARGV[3])
redis.call('SADD', KEYS[2], ARGV[2])
return 1
"""
)

# KEYS: epoch, job | ARGV: epoch, job_id, job_json
_UPDATE_JOB = (
    _FENCE
    + """
if redis.call('EXISTS', KEYS[2]) == 0 then
  return redis.error_reply('JOB_NOT_FOUND job ' .. ARGV[2] .. ' does not exist')
end
redis.call('SET', KEYS[2], ARGV[3])
return 1
"""
)

# KEYS: epoch, jobs, job, <every other key of the job> | ARGV: epoch, job_id
_DELETE_JOB = (
    _FENCE
    + """
local existed = redis.call('EXISTS', KEYS[3])
for i = 3, #KEYS do
  redis.call('DEL', KEYS[i])
end
redis.call('SREM', KEYS[2], ARGV[2])
return existed
"""
)

# KEYS: epoch, counter | ARGV: epoch
_NEXT_CHECKPOINT_ID = (
    _FENCE
    + """
return redis.call('INCR', KEYS[2])
"""
)

# KEYS: epoch, counter | ARGV: epoch, value
_ENSURE_CHECKPOINT_ID_AT_LEAST = (
    _FENCE
    + """
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
local wanted = tonumber(ARGV[2])
if current < wanted then
  redis.call('SET', KEYS[2], ARGV[2])
  return wanted
end
return current
"""
)

# KEYS: epoch, job, pending | ARGV: epoch, job_id, checkpoint_id, pending_json
_ADD_PENDING = (
    _FENCE
    + """
if redis.call('EXISTS', KEYS[2]) == 0 then
  return redis.error_reply('JOB_NOT_FOUND job ' .. ARGV[2] .. ' does not exist')
end
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
return 1
"""
)

# KEYS: epoch, hash | ARGV: epoch, field
_HDEL_FENCED = (
    _FENCE
    + """
return redis.call('HDEL', KEYS[2], ARGV[2])
"""
)

# KEYS: epoch, job, pending, completed, completed-data, savepoints
# ARGV: epoch, job_id, checkpoint_id, checkpoint_json, is_savepoint ('1'/'0'), retained
# Returns the ids of the checkpoints dropped by retention, oldest first.
_COMMIT_COMPLETED = (
    _FENCE
    + """
local id = ARGV[3]
if redis.call('EXISTS', KEYS[2]) == 0 then
  return redis.error_reply('JOB_NOT_FOUND job ' .. ARGV[2] .. ' does not exist')
end
if redis.call('ZSCORE', KEYS[4], id)
    or redis.call('HEXISTS', KEYS[5], id) == 1
    or redis.call('HEXISTS', KEYS[6], id) == 1 then
  return redis.error_reply('ALREADY_EXISTS checkpoint ' .. id .. ' of job ' .. ARGV[2]
    .. ' is already completed')
end
redis.call('HDEL', KEYS[3], id)
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[6], id, ARGV[4])
  return {}
end
redis.call('ZADD', KEYS[4], id, id)
redis.call('HSET', KEYS[5], id, ARGV[4])
local excess = redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[6])
local dropped = {}
if excess > 0 then
  local ids = redis.call('ZRANGE', KEYS[4], 0, excess - 1)
  for i, old in ipairs(ids) do
    dropped[i] = old
    redis.call('ZREM', KEYS[4], old)
    redis.call('HDEL', KEYS[5], old)
  end
end
return dropped
"""
)

# The fenced decision before any deletion in checkpoint storage (docs/coordinator.md,
# "Fencing of storage"). KEYS: epoch, pending, completed, savepoints
# ARGV: epoch, decided ('1': the checkpoints are ended, forget their pending records too),
# checkpoint ids... Returns the ids whose files the caller may delete: the caller is still the
# current epoch (so no newer coordinator references anything yet) and none of them is a
# retained checkpoint or a recorded savepoint in Redis, whatever the caller believes.
_CLAIM_DELETIONS = (
    _FENCE
    + """
local allowed = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  if not redis.call('ZSCORE', KEYS[3], id) and redis.call('HEXISTS', KEYS[4], id) == 0 then
    if ARGV[2] == '1' then
      redis.call('HDEL', KEYS[2], id)
    end
    allowed[#allowed + 1] = id
  end
end
return allowed
"""
)

# -------------------------------------------------------------------------------------------------
# The leader lease (coordinator.leadership has the timing argument). The lease is a hash with a
# TTL; winning it and taking the next epoch are one step, so only a lease winner takes an epoch.
# -------------------------------------------------------------------------------------------------

# KEYS: leader, epoch | ARGV: candidate, address, ttl_ms
# -> {1, address, new epoch} won (free, or held by this same candidate: a new term), or
#    {0, holder address, current epoch} held by another candidate.
_ACQUIRE_LEASE = """
local holder = redis.call('HMGET', KEYS[1], 'candidate', 'address')
if holder[1] and holder[1] ~= ARGV[1] then
  return {0, holder[2] or '', tonumber(redis.call('GET', KEYS[2]) or '0')}
end
local epoch = redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'candidate', ARGV[1], 'address', ARGV[2], 'epoch', epoch)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, ARGV[2], epoch}
"""

# KEYS: leader, epoch | ARGV: candidate, epoch, ttl_ms
# -> {1, address, epoch} renewed; {0, holder address or '', current epoch} lost: the lease
#    expired, or another term holds it, or the epoch moved on. A lost lease is never re-created.
_RENEW_LEASE = """
local current = redis.call('GET', KEYS[2])
local holder = redis.call('HMGET', KEYS[1], 'candidate', 'address', 'epoch')
if current == ARGV[2] and holder[1] == ARGV[1] and holder[3] == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, holder[2], tonumber(current)}
end
return {0, holder[2] or '', tonumber(current or '0')}
"""

# KEYS: leader | ARGV: candidate, epoch -> 1 released, 0 not this term's lease
_RELEASE_LEASE = """
local holder = redis.call('HMGET', KEYS[1], 'candidate', 'epoch')
if holder[1] == ARGV[1] and holder[2] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

# KEYS: epoch, leader -> the new epoch; refused while highly available coordinators hold the
# lease (a coordinator without the election would fence their leader).
_ACQUIRE_EPOCH = """
local holder = redis.call('HGET', KEYS[2], 'address')
if holder then
  return redis.error_reply('LEADER_ELECTED ' .. holder)
end
return redis.call('INCR', KEYS[1])
"""

# Read-only. KEYS: completed, completed-data
_LATEST_COMPLETED = """
local ids = redis.call('ZREVRANGE', KEYS[1], 0, 0)
if #ids == 0 then
  return false
end
return redis.call('HGET', KEYS[2], ids[1])
"""


def _encode(d: dict[str, Any]) -> bytes:
    return json.dumps(d, separators=(",", ":"), sort_keys=True).encode("utf-8")


def _text(raw: bytes | str | None) -> str:
    if raw is None:
        return ""
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _decode(raw: bytes | str) -> dict[str, Any]:
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise SnapflowError(f"corrupt record in Redis: expected a JSON object, got {raw!r:.200}")
    return value


@dataclass(frozen=True)
class LeaseAnswer:
    """What a lease script answered."""

    ok: bool
    """Acquired (or renewed, or released)."""

    address: str
    """The lease holder's advertised address ("" when nobody holds it)."""

    epoch: int
    """The won epoch when acquired; else the current epoch in Redis (0: none)."""


def _describe_client(client: aioredis.Redis) -> str:
    """Where ``client`` points, for error messages (never includes credentials)."""
    return describe_client(client)


class CheckpointStore:
    """Durable job, checkpoint-id, pending and completed-checkpoint records in Redis.

    Every mutation is fenced by the coordinator epoch (see the module docstring). Reads are not
    fenced. All methods are coroutines; use the store from a single event loop.
    """

    def __init__(self, redis: aioredis.Redis, namespace: str = DEFAULT_NAMESPACE) -> None:
        if not namespace:
            raise InvalidArgumentError("the Redis namespace must not be empty")
        self._redis = redis
        self.namespace = namespace
        self.epoch: int | None = None
        self._shared_state: SharedStateRegistry | None = None
        self.where = _describe_client(redis)
        self._create_job = redis.register_script(_CREATE_JOB)
        self._update_job = redis.register_script(_UPDATE_JOB)
        self._delete_job = redis.register_script(_DELETE_JOB)
        self._next_checkpoint_id = redis.register_script(_NEXT_CHECKPOINT_ID)
        self._ensure_at_least = redis.register_script(_ENSURE_CHECKPOINT_ID_AT_LEAST)
        self._add_pending = redis.register_script(_ADD_PENDING)
        self._hdel_fenced = redis.register_script(_HDEL_FENCED)
        self._commit_completed = redis.register_script(_COMMIT_COMPLETED)
        self._latest_completed = redis.register_script(_LATEST_COMPLETED)
        self._claim_deletions = redis.register_script(_CLAIM_DELETIONS)
        self._acquire_lease = redis.register_script(_ACQUIRE_LEASE)
        self._renew_lease = redis.register_script(_RENEW_LEASE)
        self._release_lease = redis.register_script(_RELEASE_LEASE)
        self._acquire_epoch = redis.register_script(_ACQUIRE_EPOCH)

    @classmethod
    def from_url(
        cls, url: str, namespace: str = DEFAULT_NAMESPACE, **redis_kwargs: Any
    ) -> CheckpointStore:
        """A store with its own client for ``url`` (``redis+sentinel://`` too:
        ``snapflow.redis_client``); ``redis_kwargs`` are redis-py connection options (e.g.
        ``socket_timeout``, ``retry``)."""
        return cls(async_redis(url, **redis_kwargs), namespace=namespace)

    async def close(self) -> None:
        """Close the Redis client (also one passed to the constructor)."""
        await self._redis.aclose()

    async def __aenter__(self) -> CheckpointStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- keys ----------------------------------------------------------------------------------

    @property
    def epoch_key(self) -> str:
        return f"{self.namespace}:coordinator:epoch"

    @property
    def leader_key(self) -> str:
        return f"{self.namespace}:coordinator:leader"

    @property
    def jobs_key(self) -> str:
        return f"{self.namespace}:jobs"

    def job_key(self, job_id: str) -> str:
        if not job_id or ":" in job_id:
            raise InvalidArgumentError(f"invalid job id {job_id!r}: must be non-empty without ':'")
        return f"{self.namespace}:job:{job_id}"

    def checkpoint_id_key(self, job_id: str) -> str:
        return f"{self.job_key(job_id)}:checkpoint-id"

    def pending_key(self, job_id: str) -> str:
        return f"{self.job_key(job_id)}:pending"

    def completed_key(self, job_id: str) -> str:
        return f"{self.job_key(job_id)}:completed"

    def completed_data_key(self, job_id: str) -> str:
        return f"{self.job_key(job_id)}:completed-data"

    def savepoints_key(self, job_id: str) -> str:
        return f"{self.job_key(job_id)}:savepoints"

    def shared_refs_key(self, job_id: str) -> str:
        return f"{self.job_key(job_id)}:shared-refs"

    def shared_of_key(self, job_id: str) -> str:
        return f"{self.job_key(job_id)}:shared-of"

    @property
    def shared_state(self) -> SharedStateRegistry:
        """Reference counts of shared state files (``coordinator/shared_state.py``), on this
        store's client, namespace and epoch."""
        if self._shared_state is None:
            self._shared_state = SharedStateRegistry(self._redis, self, self._fence, self._errors)
        return self._shared_state

    def all_job_keys(self, job_id: str) -> list[str]:
        """Every key that belongs to one job."""
        return [
            self.job_key(job_id),
            self.checkpoint_id_key(job_id),
            self.pending_key(job_id),
            self.completed_key(job_id),
            self.completed_data_key(job_id),
            self.savepoints_key(job_id),
            self.shared_refs_key(job_id),
            self.shared_of_key(job_id),
        ]

    # -- error handling ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
            raise UnavailableError(f"Redis at {self.where} is unavailable ({what}): {e}") from e
        except redis.exceptions.ResponseError as e:
            raise self._translate_response_error(e, what) from e

    def _translate_response_error(
        self, e: redis.exceptions.ResponseError, what: str
    ) -> SnapflowError:
        message = str(e)
        code, _, rest = message.partition(" ")
        if code == _ERR_STALE_EPOCH:
            current, _, mine = rest.partition(" ")
            return StaleEpochError(
                f"stale coordinator epoch: this coordinator holds epoch {mine} but Redis at "
                f"{self.where} holds epoch {current}; a newer coordinator has taken over "
                f"({what} refused, nothing changed)"
            )
        if code == _ERR_ALREADY_EXISTS:
            return AlreadyExistsError(rest)
        if code == _ERR_JOB_NOT_FOUND:
            return JobNotFoundError(rest)
        if code == _ERR_LEADER_ELECTED:
            return FailedPreconditionError(
                f"highly available coordinators use Redis at {self.where} (namespace "
                f"{self.namespace!r}; their leader is {rest}): start this coordinator with "
                f'high_availability = "redis" as well, and it waits as a standby'
            )
        return SnapflowError(f"Redis at {self.where} refused {what}: {message}")

    def _fence(self, what: str) -> str:
        if self.epoch is None:
            raise StaleEpochError(
                f"{what} refused: this coordinator has not acquired an epoch "
                "(call acquire_epoch first)"
            )
        return str(self.epoch)

    # -- epoch ---------------------------------------------------------------------------------

    async def acquire_epoch(self) -> int:
        """Take a new coordinator epoch (fencing token); every older incarnation is fenced off.
        Without the leader election only: refused (FailedPreconditionError) while highly
        available coordinators hold the leader lease."""
        with self._errors("acquire_epoch"):
            epoch = int(await self._acquire_epoch([self.epoch_key, self.leader_key], []))
        self.epoch = epoch
        return epoch

    def with_epoch(self, epoch: int) -> CheckpointStore:
        """A store on the same Redis client whose mutations are fenced by ``epoch`` (won
        with the leader lease): one per leadership term, so a term that ended can never write
        with a later term's epoch. Close only the original store (it owns the client)."""
        store = CheckpointStore(self._redis, namespace=self.namespace)
        store.epoch = epoch
        return store

    # -- the leader lease ----------------------------------------------------------------------

    async def try_acquire_lease(self, candidate: str, address: str, ttl_ms: int) -> LeaseAnswer:
        """Win the leader lease and a new epoch if the lease is free (or ``candidate``'s own,
        from an earlier term); else answer who holds it. Does not set ``self.epoch`` (use
        :meth:`with_epoch` for the term's store)."""
        with self._errors("try_acquire_lease"):
            ok, holder, epoch = await self._acquire_lease(
                [self.leader_key, self.epoch_key], [candidate, address, str(int(ttl_ms))]
            )
        return LeaseAnswer(bool(ok), _text(holder), int(epoch))

    async def renew_lease(self, candidate: str, epoch: int, ttl_ms: int) -> LeaseAnswer:
        """Extend the lease of ``candidate``'s term ``epoch`` by ``ttl_ms``; ``ok`` False when
        it is lost (expired, another term's, or the epoch moved on)."""
        with self._errors("renew_lease"):
            ok, holder, current = await self._renew_lease(
                [self.leader_key, self.epoch_key], [candidate, str(int(epoch)), str(int(ttl_ms))]
            )
        return LeaseAnswer(bool(ok), _text(holder), int(current))

    async def release_lease(self, candidate: str, epoch: int) -> bool:
        """Delete the lease if it is still ``candidate``'s term ``epoch``."""
        with self._errors("release_lease"):
            released = await self._release_lease([self.leader_key], [candidate, str(int(epoch))])
        return bool(released)

    async def read_lease(self) -> LeaseAnswer | None:
        """The lease holder (``ok`` True) and its epoch, or None when nobody holds it."""
        with self._errors("read_lease"):
            raw = await self._redis.hmget(self.leader_key, ["address", "epoch"])
        if raw[0] is None:
            return None
        return LeaseAnswer(True, _text(raw[0]), int(raw[1] or 0))

    async def current_epoch(self) -> int | None:
        """The epoch stored in Redis (the newest incarnation's), or None if none was taken."""
        with self._errors("current_epoch"):
            raw = await self._redis.get(self.epoch_key)
        return int(raw) if raw is not None else None

    # -- jobs ----------------------------------------------------------------------------------

    async def create_job(self, record: JobRecord) -> None:
        """Store a new job. Raises AlreadyExistsError if the job id exists."""
        epoch = self._fence("create_job")
        keys = [self.epoch_key, self.jobs_key, self.job_key(record.job_id)]
        with self._errors("create_job"):
            await self._create_job(keys, [epoch, record.job_id, _encode(record.to_dict())])

    async def update_job(self, record: JobRecord) -> None:
        """Replace an existing job's record. Raises JobNotFoundError if it does not exist."""
        epoch = self._fence("update_job")
        keys = [self.epoch_key, self.job_key(record.job_id)]
        with self._errors("update_job"):
            await self._update_job(keys, [epoch, record.job_id, _encode(record.to_dict())])

    async def get_job(self, job_id: str) -> JobRecord | None:
        with self._errors("get_job"):
            raw = await self._redis.get(self.job_key(job_id))
        return JobRecord.from_dict(_decode(raw)) if raw is not None else None

    async def list_jobs(self) -> list[JobRecord]:
        """All jobs, sorted by creation time, then id."""
        with self._errors("list_jobs"):
            members = await self._redis.smembers(self.jobs_key)
            ids = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)
            raws: Sequence[bytes | str | None] = (
                await self._redis.mget([self.job_key(i) for i in ids]) if ids else []
            )
        jobs = [JobRecord.from_dict(_decode(r)) for r in raws if r is not None]
        return sorted(jobs, key=lambda j: (j.created_at_ms, j.job_id))

    async def delete_job(self, job_id: str) -> bool:
        """Remove the job and every key it owns. Returns whether the job existed."""
        epoch = self._fence("delete_job")
        keys = [self.epoch_key, self.jobs_key, *self.all_job_keys(job_id)]
        with self._errors("delete_job"):
            existed = await self._delete_job(keys, [epoch, job_id])
        return bool(existed)

    # -- checkpoint ids ------------------------------------------------------------------------

    async def next_checkpoint_id(self, job_id: str) -> int:
        """The next checkpoint id of the job (fenced INCR; the first id is 1)."""
        epoch = self._fence("next_checkpoint_id")
        keys = [self.epoch_key, self.checkpoint_id_key(job_id)]
        with self._errors("next_checkpoint_id"):
            return int(await self._next_checkpoint_id(keys, [epoch]))

    async def ensure_checkpoint_id_at_least(self, job_id: str, value: int) -> int:
        """Raise the job's id counter to ``value`` if it is lower (never lowers it), so the next
        id handed out is greater than ``value``. Returns the counter afterwards."""
        if value < 0:
            raise InvalidArgumentError(f"checkpoint id must be >= 0, got {value}")
        epoch = self._fence("ensure_checkpoint_id_at_least")
        keys = [self.epoch_key, self.checkpoint_id_key(job_id)]
        with self._errors("ensure_checkpoint_id_at_least"):
            return int(await self._ensure_at_least(keys, [epoch, str(int(value))]))

    async def checkpoint_id_counter(self, job_id: str) -> int:
        """The last checkpoint id handed out for the job (0 if none). Read at recovery, right
        after taking the epoch: every id an older incarnation allocated is at most this."""
        with self._errors("checkpoint_id_counter"):
            raw = await self._redis.get(self.checkpoint_id_key(job_id))
        return int(raw) if raw is not None else 0

    # -- storage deletions ---------------------------------------------------------------------

    async def claim_deletions(
        self, job_id: str, checkpoint_ids: Sequence[int], *, decided: bool
    ) -> set[int]:
        """The fenced step before deleting anything in checkpoint storage: of the checkpoints
        (and savepoints) ``checkpoint_ids``, those whose files this coordinator may delete.

        One Lua script checks the epoch (raises :class:`StaleEpochError` when a newer
        coordinator exists: it may reference anything, so nothing may be deleted) and refuses
        every id that Redis holds as a retained checkpoint or a recorded savepoint, even one the
        caller believes aborted (a commit whose reply was lost). ``decided``: the checkpoints
        have ended; their pending records are removed in the same step, so a record never
        outlives its files' deletion decision."""
        epoch = self._fence("claim_deletions")
        if not checkpoint_ids:
            return set()
        keys = [
            self.epoch_key,
            self.pending_key(job_id),
            self.completed_key(job_id),
            self.savepoints_key(job_id),
        ]
        args = [epoch, "1" if decided else "0", *(str(int(i)) for i in checkpoint_ids)]
        with self._errors("claim_deletions"):
            allowed = await self._claim_deletions(keys, args)
        return {int(i) for i in allowed}

    # -- pending checkpoints -------------------------------------------------------------------

    async def add_pending(self, record: PendingCheckpointRecord) -> None:
        """Record a pending checkpoint (overwrites the same id). Raises JobNotFoundError if the
        job does not exist."""
        epoch = self._fence("add_pending")
        job_id = record.job_id
        keys = [self.epoch_key, self.job_key(job_id), self.pending_key(job_id)]
        args: list[str | bytes] = [
            epoch,
            job_id,
            str(int(record.checkpoint_id)),
            _encode(record.to_dict()),
        ]
        with self._errors("add_pending"):
            await self._add_pending(keys, args)

    async def remove_pending(self, job_id: str, checkpoint_id: int) -> bool:
        """Forget a pending checkpoint. Returns whether it was recorded."""
        epoch = self._fence("remove_pending")
        keys = [self.epoch_key, self.pending_key(job_id)]
        with self._errors("remove_pending"):
            removed = await self._hdel_fenced(keys, [epoch, str(int(checkpoint_id))])
        return bool(removed)

    async def list_pending(self, job_id: str) -> list[PendingCheckpointRecord]:
        """The job's pending checkpoints, ascending id."""
        with self._errors("list_pending"):
            raw = await self._redis.hgetall(self.pending_key(job_id))
        records = [PendingCheckpointRecord.from_dict(_decode(v)) for v in raw.values()]
        return sorted(records, key=lambda r: r.checkpoint_id)

    # -- completed checkpoints and savepoints --------------------------------------------------

    async def commit_completed(self, checkpoint: CompletedCheckpoint, retained: int) -> list[int]:
        """Atomically (one fenced script): remove the id from pending, store the completed
        checkpoint, and for a regular checkpoint trim the completed set to the newest
        ``retained``. Returns the ids of the checkpoints dropped by retention, oldest first
        (their state must be deleted by the caller, who knows the records: decoding them back
        from Redis cost more than the commit itself at 1024 subtasks). Savepoints are stored
        apart and trim nothing.

        A checkpoint older than ``retained`` newer completed ones is dropped at once and is then
        part of the returned list.

        Raises AlreadyExistsError if the id is already completed (as checkpoint or savepoint;
        nothing is overwritten) and JobNotFoundError if the job does not exist.
        """
        if retained < 1:
            raise InvalidArgumentError(f"retained must be >= 1, got {retained}")
        epoch = self._fence("commit_completed")
        job_id = checkpoint.job_id
        keys = [
            self.epoch_key,
            self.job_key(job_id),
            self.pending_key(job_id),
            self.completed_key(job_id),
            self.completed_data_key(job_id),
            self.savepoints_key(job_id),
        ]
        args: list[str | bytes] = [
            epoch,
            job_id,
            str(int(checkpoint.checkpoint_id)),
            _encode(checkpoint.to_dict()),
            "1" if checkpoint.kind.is_savepoint else "0",
            str(int(retained)),
        ]
        with self._errors("commit_completed"):
            dropped = await self._commit_completed(keys, args)
        return [int(d) for d in dropped]

    async def get_completed(self, job_id: str, checkpoint_id: int) -> CompletedCheckpoint | None:
        """A completed checkpoint or savepoint by id, or None."""
        field = str(int(checkpoint_id))
        with self._errors("get_completed"):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hget(self.completed_data_key(job_id), field)
                pipe.hget(self.savepoints_key(job_id), field)
                checkpoint, savepoint = await pipe.execute()
        raw = checkpoint if checkpoint is not None else savepoint
        return CompletedCheckpoint.from_dict(_decode(raw)) if raw is not None else None

    async def list_completed(self, job_id: str) -> list[CompletedCheckpoint]:
        """The job's retained completed checkpoints (not savepoints), ascending id."""
        with self._errors("list_completed"):
            raw = await self._redis.hgetall(self.completed_data_key(job_id))
        return self._sorted_checkpoints(raw)

    async def latest_completed(self, job_id: str) -> CompletedCheckpoint | None:
        """The job's newest completed checkpoint (not savepoint), or None."""
        keys = [self.completed_key(job_id), self.completed_data_key(job_id)]
        with self._errors("latest_completed"):
            raw = await self._latest_completed(keys, [])
        return CompletedCheckpoint.from_dict(_decode(raw)) if raw is not None else None

    async def list_savepoints(self, job_id: str) -> list[CompletedCheckpoint]:
        """The job's savepoints, ascending id."""
        with self._errors("list_savepoints"):
            raw = await self._redis.hgetall(self.savepoints_key(job_id))
        return self._sorted_checkpoints(raw)

    async def remove_savepoint(self, job_id: str, checkpoint_id: int) -> bool:
        """Forget a disposed savepoint. Returns whether it was recorded."""
        epoch = self._fence("remove_savepoint")
        keys = [self.epoch_key, self.savepoints_key(job_id)]
        with self._errors("remove_savepoint"):
            removed = await self._hdel_fenced(keys, [epoch, str(int(checkpoint_id))])
        return bool(removed)

    @staticmethod
    def _sorted_checkpoints(raw: dict[Any, Any]) -> list[CompletedCheckpoint]:
        checkpoints = [CompletedCheckpoint.from_dict(_decode(v)) for v in raw.values()]
        return sorted(checkpoints, key=lambda c: c.checkpoint_id)
