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
======================================  ==========  ==============================================

Fencing: every mutation is one Lua script whose first action compares
``GET {ns}:coordinator:epoch`` with the caller's epoch; on a mismatch it changes nothing and
fails, and the store raises :class:`~snapflow.errors.StaleEpochError`. A store that has not
called :meth:`CheckpointStore.acquire_epoch` cannot mutate anything either.

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
from types import TracebackType
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from snapflow.coordinator.model import CompletedCheckpoint, JobRecord, PendingCheckpointRecord
from snapflow.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    JobNotFoundError,
    SnapflowError,
    StaleEpochError,
    UnavailableError,
)

DEFAULT_NAMESPACE = "snapflow"

# -------------------------------------------------------------------------------------------------
# Lua scripts. KEYS[1] is always the epoch key and ARGV[1] the caller's epoch. Error replies start
# with one of the codes below, which ``_translate_response_error`` maps to Snapflow errors.
# -------------------------------------------------------------------------------------------------

_ERR_STALE_EPOCH = "STALE_EPOCH"
_ERR_ALREADY_EXISTS = "ALREADY_EXISTS"
_ERR_JOB_NOT_FOUND = "JOB_NOT_FOUND"

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


def _decode(raw: bytes | str) -> dict[str, Any]:
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise SnapflowError(f"corrupt record in Redis: expected a JSON object, got {raw!r:.200}")
    return value


def _describe_client(client: aioredis.Redis) -> str:
    """Where ``client`` points, for error messages (never includes credentials)."""
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


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

    @classmethod
    def from_url(
        cls, url: str, namespace: str = DEFAULT_NAMESPACE, **redis_kwargs: Any
    ) -> CheckpointStore:
        """A store with its own client for ``url``; ``redis_kwargs`` go to ``Redis.from_url``
        (e.g. ``socket_timeout``, ``retry``)."""
        return cls(aioredis.Redis.from_url(url, **redis_kwargs), namespace=namespace)

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

    def all_job_keys(self, job_id: str) -> list[str]:
        """Every key that belongs to one job."""
        return [
            self.job_key(job_id),
            self.checkpoint_id_key(job_id),
            self.pending_key(job_id),
            self.completed_key(job_id),
            self.completed_data_key(job_id),
            self.savepoints_key(job_id),
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
        """Take a new coordinator epoch (fencing token); every older incarnation is fenced off."""
        with self._errors("acquire_epoch"):
            epoch = int(await self._redis.incr(self.epoch_key))
        self.epoch = epoch
        return epoch

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
