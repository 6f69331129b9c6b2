"""Reference counts of the state files shared between checkpoints (Flink's
``SharedStateRegistry``), kept in Redis so that they outlive the coordinator.

The disk state backend's incremental checkpoints name, besides their own files, SST files in
the job's shared directory (``<root>/<job>/shared/``): handles of kind ``shared-new`` (uploaded
for this checkpoint) and ``shared`` (uploaded for an earlier completed checkpoint and reused).
A shared file is deleted once no retained checkpoint names it; savepoints are self-contained
(canonical files only) and never name shared files.

* **Register** (:meth:`SharedStateRegistry.register`, at completion, before ``_metadata`` and the
  Redis commit): every shared path of the checkpoint gets one more reference, in one fenced
  script. A reused (``shared``) path that has no reference any more is refused: the checkpoint
  that uploaded it was subsumed (and its file deleted) after the task picked it as its base,
  so the new checkpoint cannot complete (Flink refuses the same with "Attempt to reference
  unknown state"); the task's next checkpoints use a newer base.
* **Release** (:meth:`SharedStateRegistry.release`, when retention drops checkpoints, or when a
  registered checkpoint failed to commit): one reference less per path; the paths that reach 0
  are returned and deleted through the fenced deletion path (``CheckpointIo.discard``).
* **Reset** (:meth:`SharedStateRegistry.reset`, at the first orphan sweep of a coordinator
  incarnation): the counts are rebuilt from the retained checkpoints Redis records, which drops
  references of a checkpoint registered by a coordinator that died before committing it.
* **Orphans**: a shared file's name carries the id of the checkpoint that uploaded it
  (``...-chk<id>-<16 hex>-<name>.sst``, :func:`creator_id`); the orphan sweep deletes shared
  files without a reference whose checkpoint has ended (never one of a pending checkpoint), so
  uploads of a task that died before acknowledging are removed too.

Redis keys (named by ``coordinator/redis_store.py``, which owns every key):
``{ns}:job:{job}:shared-refs`` (hash: path -> references) and ``{ns}:job:{job}:shared-of``
(hash: checkpoint id -> JSON list of the shared paths it registered).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from snapflow.checkpointing import SHARED, SHARED_NEW
from snapflow.coordinator.model import CompletedCheckpoint
from snapflow.errors import FailedPreconditionError, SnapflowError


class _Keys(Protocol):
    """The key names (``CheckpointStore``'s, the one owner of Redis keys)."""

    @property
    def epoch_key(self) -> str: ...

    def shared_refs_key(self, job_id: str) -> str: ...

    def shared_of_key(self, job_id: str) -> str: ...


__all__ = [
    "SHARED",
    "SHARED_NEW",
    "SharedStateMissingError",
    "SharedStateRegistry",
    "creator_id",
    "shared_paths",
]


_CREATOR = re.compile(r"-chk(0|[1-9][0-9]*)-[0-9a-f]{16}-[^/]+\.sst$")


def creator_id(path: str) -> int | None:
    """The id of the checkpoint that uploaded the shared file at ``path`` (None when the name
    does not follow the worker's naming)."""
    match = _CREATOR.search(path)
    return int(match.group(1)) if match else None


def shared_paths(checkpoint: CompletedCheckpoint) -> tuple[list[str], list[str]]:
    """``(all, reused)``: the shared paths ``checkpoint`` names (each once), and those of them
    an earlier checkpoint uploaded."""
    every: dict[str, None] = {}
    reused: dict[str, None] = {}
    for ack in checkpoint.subtask_states:
        for state in ack.operator_states:
            for handle in state.handles:
                if handle.kind == SHARED:
                    every[handle.path] = None
                    reused[handle.path] = None
                elif handle.kind == SHARED_NEW:
                    every[handle.path] = None
    return list(every), [p for p in reused]


class SharedStateMissingError(FailedPreconditionError):
    """A checkpoint reuses a shared file that is no longer referenced (already deleted)."""


# KEYS: epoch, refs, of | ARGV: epoch, checkpoint id, JSON all paths, JSON reused paths
_REGISTER = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return redis.error_reply('STALE_EPOCH ' .. tostring(current or 'none') .. ' ' .. ARGV[1])
end
if redis.call('HEXISTS', KEYS[3], ARGV[2]) == 1 then
  return 0
end
for _, path in ipairs(cjson.decode(ARGV[4])) do
  if not redis.call('HGET', KEYS[2], path) then
    return redis.error_reply('SHARED_MISSING ' .. path)
  end
end
for _, path in ipairs(cjson.decode(ARGV[3])) do
  redis.call('HINCRBY', KEYS[2], path, 1)
end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
return 1
"""

# KEYS: epoch, refs, of | ARGV: epoch, checkpoint ids... -> paths whose count reached 0
_RELEASE = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return redis.error_reply('STALE_EPOCH ' .. tostring(current or 'none') .. ' ' .. ARGV[1])
end
local gone = {}
for i = 2, #ARGV do
  local raw = redis.call('HGET', KEYS[3], ARGV[i])
  if raw then
    for _, path in ipairs(cjson.decode(raw)) do
      if redis.call('HINCRBY', KEYS[2], path, -1) <= 0 then
        redis.call('HDEL', KEYS[2], path)
        gone[#gone + 1] = path
      end
    end
    redis.call('HDEL', KEYS[3], ARGV[i])
  end
end
return gone
"""

# KEYS: epoch, refs, of | ARGV: epoch, JSON {checkpoint id: [paths]}
_RESET = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then
  return redis.error_reply('STALE_EPOCH ' .. tostring(current or 'none') .. ' ' .. ARGV[1])
end
redis.call('DEL', KEYS[2], KEYS[3])
for id, paths in pairs(cjson.decode(ARGV[2])) do
  for _, path in ipairs(paths) do
    redis.call('HINCRBY', KEYS[2], path, 1)
  end
  redis.call('HSET', KEYS[3], id, cjson.encode(paths))
end
return 1
"""


def _json_list(items: Sequence[str]) -> str:
    # cjson encodes an empty table as an object: '[]' decodes to an empty table either way.
    return json.dumps(list(items))


class SharedStateRegistry:
    """Reference counts of one coordinator's jobs' shared files (fenced by the store's epoch).
    Made by ``CheckpointStore.shared_state``, which hands over its client, key names, epoch
    check (``fence(what) -> epoch``) and error translation (``errors(what)``)."""

    def __init__(
        self,
        redis: Any,
        keys: _Keys,
        fence: Callable[[str], str],
        errors: Callable[[str], AbstractContextManager[None]],
    ) -> None:
        self._redis = redis
        self._names = keys
        self._fence = fence
        self._errors = errors
        self._register = redis.register_script(_REGISTER)
        self._release = redis.register_script(_RELEASE)
        self._reset = redis.register_script(_RESET)

    def _keys(self, job_id: str) -> list[str]:
        n = self._names
        return [n.epoch_key, n.shared_refs_key(job_id), n.shared_of_key(job_id)]

    async def register(self, checkpoint: CompletedCheckpoint) -> int:
        """One reference more to every shared file ``checkpoint`` names (idempotent per
        checkpoint id). Returns how many paths it names. Raises
        :class:`SharedStateMissingError` naming a reused file that has no reference left."""
        every, reused = shared_paths(checkpoint)
        if not every:
            return 0
        epoch = self._fence("register_shared_state")
        args = [epoch, str(checkpoint.checkpoint_id), _json_list(every), _json_list(reused)]
        try:
            with self._errors("register_shared_state"):
                await self._register(self._keys(checkpoint.job_id), args)
        except SnapflowError as e:
            marker = "SHARED_MISSING "
            text = str(e)
            if marker not in text:
                raise
            path = text.split(marker, 1)[1].strip()
            raise SharedStateMissingError(
                f"checkpoint {checkpoint.checkpoint_id} reuses the shared state file {path}, "
                "which no retained checkpoint references any more (the checkpoint that uploaded "
                "it was subsumed); the checkpoint cannot complete, the next ones will not "
                "reuse it"
            ) from None
        return len(every)

    async def release(self, job_id: str, checkpoint_ids: Iterable[int]) -> list[str]:
        """One reference less for every shared file of these checkpoints; returns the paths
        no checkpoint references any more (to be deleted by the caller)."""
        ids = [str(int(i)) for i in checkpoint_ids]
        if not ids:
            return []
        epoch = self._fence("release_shared_state")
        with self._errors("release_shared_state"):
            gone = await self._release(self._keys(job_id), [epoch, *ids])
        return [g.decode() if isinstance(g, bytes) else str(g) for g in gone]

    async def reset(self, job_id: str, checkpoints: Iterable[CompletedCheckpoint]) -> None:
        """Rebuild the counts from ``checkpoints`` (the retained ones Redis records)."""
        table = {str(c.checkpoint_id): paths for c in checkpoints if (paths := shared_paths(c)[0])}
        epoch = self._fence("reset_shared_state")
        with self._errors("reset_shared_state"):
            await self._reset(self._keys(job_id), [epoch, json.dumps(table)])

    async def referenced(self, job_id: str) -> dict[str, int]:
        """Path -> references (read, not fenced)."""
        with self._errors("shared_state_references"):
            raw = await self._redis.hgetall(self._names.shared_refs_key(job_id))
        return {(k.decode() if isinstance(k, bytes) else str(k)): int(v) for k, v in raw.items()}
