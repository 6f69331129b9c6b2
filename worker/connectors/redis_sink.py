"""An idempotent Redis hash sink (at-least-once delivery, exact final state for upserts).

RedisSink
    Upserts every row into a Redis hash: ``HSET <key_prefix><key> <field> <value>`` for each
    value field (``HDEL`` for a null value). Rows are buffered in the task (coalesced per
    hash and field: the last value wins) and written with pipelined commands (no MULTI) when
    the buffer reaches ``max_buffered_rows``, on ``end_input``, and -- synchronously -- on
    ``snapshot_state``, so the checkpoint's barrier is acknowledged only once every row that
    arrived before it is in Redis (a failed write fails the snapshot, hence the checkpoint).

    What it guarantees: *at-least-once* delivery -- every row before a completed checkpoint's
    barrier was written before that checkpoint completed, and rows after it are written again
    by the replay after a restore. HSET sets, it does not accumulate, so writing a row twice
    leaves the same hash as writing it once; with a deterministic pipeline the replay rewrites
    the very same values in the same per-key order, so once the replay has caught up the
    hashes are exactly those of a failure-free run ("effectively exactly-once final state").
    That holds when each row is an *upsert*: the full new value of its ``(key, field)``, e.g. a
    running count, or a window result keyed by ``(key, window)``.

    What it does not guarantee: readers may see uncommitted values (written before a
    checkpoint completed) and, after a restore, values going *back* to an older state until
    the replay catches up (e.g. a running count that drops, then climbs again). Rows that
    accumulate (increments, appends) or non-deterministic pipelines (e.g. processing-time
    windows) are not exact. Writes are not atomic across hashes (pipelined, not a
    transaction). Durability is Redis's: "in Redis" means acknowledged by the server; keep it
    across a Redis restart with AOF (``appendfsync always``) or replication + ``WAIT``.

    Values: ``str`` and ``bytes`` are stored as they are, ``bool`` as ``"true"``/``"false"``,
    ``int``/``float`` as their decimal text (``str``), anything else (dates, lists, ...) as
    its ``str()``. The key is ``key_prefix`` + the key field's text; several key fields
    (``key_field=("key", "window_start")``) are joined with ``key_separator``. The connection
    is made lazily in the task (``snapflow.redis_client.sync_redis(url)``: ``redis://``,
    ``rediss://``, ``unix://`` or ``redis+sentinel://host:port,host:port/service``), so the
    operator pickles without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from typing import Any

import pyarrow as pa

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.redis_client import sync_redis
from snapflow.worker.runtime.operator import Operator, OperatorContext


def _redis_value(value: Any) -> str | bytes:
    if isinstance(value, str | bytes):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class RedisSink(Operator):
    """Upserts rows into Redis hashes, idempotently (see the module docstring for exactly what
    it guarantees): ``HSET <key_prefix><key> <field> <value>`` per value field.

    ``key_field``: one field, or several (joined with ``key_separator``) -- e.g. ``("key",
    "window_start")`` for window results. ``value_fields``: the fields written into the hash
    (default: every field that is not a key field). ``max_buffered_rows``: buffered rows that
    trigger a write before the next checkpoint (writes are also made on ``snapshot_state`` and
    ``end_input``). ``batch_commands``: commands per pipelined round trip."""

    _runtime_fields: tuple[str, ...] = ("_client", "_buffer", "_buffered_rows")

    def __init__(
        self,
        url: str,
        key_field: str | Sequence[str],
        value_fields: Sequence[str] | None = None,
        key_prefix: str = "",
        *,
        key_separator: str = ":",
        max_buffered_rows: int = 10_000,
        batch_commands: int = 1_000,
    ) -> None:
        keys = (key_field,) if isinstance(key_field, str) else tuple(key_field)
        if not keys:
            raise InvalidArgumentError("RedisSink needs at least one key field")
        if value_fields is not None:
            values = tuple(value_fields)
            if not values:
                raise InvalidArgumentError("RedisSink: value_fields is empty")
            if overlap := set(values) & set(keys):
                raise InvalidArgumentError(
                    f"RedisSink: fields {sorted(overlap)} are both key and value fields"
                )
        if max_buffered_rows <= 0 or batch_commands <= 0:
            raise InvalidArgumentError("max_buffered_rows and batch_commands must be > 0")
        self.url = url
        self.key_fields = keys
        self.value_fields: tuple[str, ...] | None = (
            tuple(value_fields) if value_fields is not None else None
        )
        self.key_prefix = key_prefix
        self.key_separator = key_separator
        self.max_buffered_rows = max_buffered_rows
        self.batch_commands = batch_commands
        self._client: Any = None

    # --- operator ---------------------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._client = None  # connected on the first write
        # hash key -> field -> value (None: HDEL); dicts keep the first-insertion order
        self._buffer: dict[str, dict[str, str | bytes | None]] = {}
        self._buffered_rows = 0

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if not batch.num_rows:
            return []
        names = batch.schema.names
        missing = [f for f in self.key_fields if f not in names]
        value_fields = (
            self.value_fields
            if self.value_fields is not None
            else tuple(n for n in names if n not in self.key_fields)
        )
        missing += [f for f in value_fields if f not in names]
        if missing:
            raise InvalidArgumentError(f"{self.name}: batch has no field(s) {missing}: {names}")
        if not value_fields:
            raise InvalidArgumentError(f"{self.name}: batch has no value fields: {names}")
        key_cols = [batch.column(f).to_pylist() for f in self.key_fields]
        value_cols = [batch.column(f).to_pylist() for f in value_fields]
        for i in range(batch.num_rows):
            parts = [col[i] for col in key_cols]
            if any(p is None for p in parts):
                raise InvalidArgumentError(
                    f"{self.name}: null key {dict(zip(self.key_fields, parts, strict=True))}"
                )
            key = self.key_prefix + self.key_separator.join(
                p.decode() if isinstance(p, bytes) else str(p) for p in parts
            )
            fields = self._buffer.setdefault(key, {})
            for name, col in zip(value_fields, value_cols, strict=True):
                v = col[i]
                fields[name] = None if v is None else _redis_value(v)
        self._buffered_rows += batch.num_rows
        if self._buffered_rows >= self.max_buffered_rows:
            self.flush()
        return []

    def snapshot_state(self, checkpoint_id: int) -> None:
        # The barrier passes only once the rows before it are in Redis.
        self.flush()

    def end_input(self) -> list[pa.RecordBatch]:
        self.flush()
        return []

    def close(self) -> None:
        # Unflushed rows are dropped: they come after the last checkpoint, so a restore
        # replays them (and a clean end of input flushed them in end_input).
        client, self._client = getattr(self, "_client", None), None
        if hasattr(self, "_buffer"):
            self._buffer.clear()
            self._buffered_rows = 0
        if client is not None:
            with suppress(Exception):
                client.close()

    # --- writing ----------------------------------------------------------------------------

    @property
    def buffered_rows(self) -> int:
        """Rows received since the last write to Redis."""
        return getattr(self, "_buffered_rows", 0)

    def client(self) -> Any:
        """The task's ``redis.Redis`` client (connected on first use)."""
        if self._client is None:
            self._client = sync_redis(self.url)
        return self._client

    def flush(self) -> None:
        """Write the buffered rows (pipelined, ``batch_commands`` per round trip) and wait for
        Redis to acknowledge them; raises on any error (the buffer is kept)."""
        if not hasattr(self, "_buffer"):
            raise StateError(f"operator {self.name} is not open (call open(ctx) first)")
        if not self._buffer:
            self._buffered_rows = 0
            return
        pipe = self.client().pipeline(transaction=False)
        queued = 0
        for key, fields in self._buffer.items():
            mapping = {f: v for f, v in fields.items() if v is not None}
            deleted = [f for f, v in fields.items() if v is None]
            if mapping:
                pipe.hset(key, mapping=mapping)
                queued += 1
            if deleted:
                pipe.hdel(key, *deleted)
                queued += 1
            if queued >= self.batch_commands:
                pipe.execute()
                queued = 0
        if queued:
            pipe.execute()
        # Only now: on an error the buffer stays for a retry (re-writing is idempotent).
        self._buffer.clear()
        self._buffered_rows = 0
