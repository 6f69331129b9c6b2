"""Output partitioners: which downstream channel gets which rows.

A partitioner splits one output batch over the ``num_channels`` channels of an edge (channel
i goes to downstream subtask i): ``partition(batch) -> [(channel, batch), ...]``, with only
non-empty batches listed (an empty input gives ``[]``). Row order within a channel is the
order of the input.

* :class:`ForwardPartitioner`: everything to channel 0 (the one-to-one edge).
* :class:`RebalancePartitioner`: round-robin *per batch* -- each batch goes whole to the next
  channel. Splitting every batch row-wise over all channels would cost a take per channel and
  shrink batches by ``num_channels``; whole-batch rotation is O(1) and balances as well once a
  channel has seen a few batches. The first channel is ``start_channel`` (the task passes its
  subtask index, so parallel producers do not all begin at channel 0, as Flink randomises it).
* :class:`BroadcastPartitioner`: every channel gets the (immutable, shared) batch.
* :class:`KeyGroupPartitioner`: by key group, exactly as the downstream keyed state expects:
  ``channel = operator_index_for_key_group(max_parallelism, num_channels, key_group(key))``,
  so every row lands on the subtask whose key-group range contains its key group. Vectorised:
  key groups with Arrow kernels (:func:`snapflow.worker.state.keygroups.key_groups`), channel through a
  precomputed key group -> channel lookup table, then one stable sort of the row indices by
  channel, one ``take`` and zero-copy slices per channel (a batch that maps to one channel is
  passed through without a copy).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapflow.errors import InvalidArgumentError
from snapflow.worker.state import keygroups as kgs


def _check_channels(num_channels: Any) -> int:
    if not isinstance(num_channels, int) or isinstance(num_channels, bool) or num_channels < 1:
        raise InvalidArgumentError(f"num_channels must be an integer >= 1, got {num_channels!r}")
    return num_channels


class Partitioner:
    """Splits an output batch over ``num_channels`` channels."""

    num_channels: int = 1

    def partition(self, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch]]:
        raise NotImplementedError


class ForwardPartitioner(Partitioner):
    """One-to-one: every batch to channel 0."""

    num_channels = 1

    def partition(self, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch]]:
        return [(0, batch)] if batch.num_rows else []

    def __repr__(self) -> str:
        return "ForwardPartitioner()"


class RebalancePartitioner(Partitioner):
    """Round-robin per batch, starting at ``start_channel % num_channels``."""

    def __init__(self, num_channels: int, start_channel: int = 0) -> None:
        self.num_channels = _check_channels(num_channels)
        self._next = start_channel % self.num_channels

    def partition(self, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch]]:
        if not batch.num_rows:
            return []
        channel = self._next
        self._next = channel + 1 if channel + 1 < self.num_channels else 0
        return [(channel, batch)]

    def __repr__(self) -> str:
        return f"RebalancePartitioner(num_channels={self.num_channels})"


class BroadcastPartitioner(Partitioner):
    """Every channel gets every batch."""

    def __init__(self, num_channels: int) -> None:
        self.num_channels = _check_channels(num_channels)

    def partition(self, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch]]:
        if not batch.num_rows:
            return []
        return [(i, batch) for i in range(self.num_channels)]

    def __repr__(self) -> str:
        return f"BroadcastPartitioner(num_channels={self.num_channels})"


class KeyGroupPartitioner(Partitioner):
    """Hash partitioning by key group of ``key_field`` (see the module docstring)."""

    def __init__(self, key_field: str, max_parallelism: int, num_channels: int) -> None:
        kgs.check_max_parallelism(max_parallelism)
        self.num_channels = _check_channels(num_channels)
        if self.num_channels > max_parallelism:
            raise InvalidArgumentError(
                f"{num_channels} channels exceed the max parallelism {max_parallelism}"
            )
        if not isinstance(key_field, str) or not key_field:
            raise InvalidArgumentError(f"key_field must be a column name, got {key_field!r}")
        self.key_field = key_field
        self.max_parallelism = max_parallelism
        # key group -> channel, computed by the very function the state backends use
        self._channel_of_group = pa.array(
            [
                kgs.operator_index_for_key_group(max_parallelism, num_channels, kg)
                for kg in range(max_parallelism)
            ],
            pa.int32(),
        )

    def channel_for_key(self, key: Any) -> int:
        """The channel of one key (the scalar reference of :meth:`partition`)."""
        return kgs.subtask_for_key(key, self.max_parallelism, self.num_channels)

    def channels(self, batch: pa.RecordBatch) -> pa.Int32Array:
        """The target channel of every row of ``batch``."""
        idx = batch.schema.get_field_index(self.key_field)
        if idx < 0:
            raise InvalidArgumentError(
                f"key field {self.key_field!r} not in the batch (columns: {batch.schema.names})"
            )
        groups = kgs.key_groups(batch.column(idx), self.max_parallelism)
        return pc.take(self._channel_of_group, groups)

    def partition(self, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch]]:
        if not batch.num_rows:
            return []
        if self.num_channels == 1:
            self.channels(batch)  # validates the keys (no nulls, column present)
            return [(0, batch)]
        targets = self.channels(batch)
        order = pc.sort_indices(targets)  # stable: row order is kept within a channel
        runs = pc.run_end_encode(pc.take(targets, order))
        ends = runs.run_ends.to_pylist()
        channels = runs.values.to_pylist()
        if len(channels) == 1:
            return [(channels[0], batch)]
        shuffled = batch.take(order)
        out = []
        begin = 0
        for channel, end in zip(channels, ends, strict=True):
            out.append((channel, shuffled.slice(begin, end - begin)))
            begin = end
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_channel_of_group")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["key_field"], state["max_parallelism"], state["num_channels"]
        )

    def __repr__(self) -> str:
        return (
            f"KeyGroupPartitioner(key_field={self.key_field!r}, "
            f"max_parallelism={self.max_parallelism}, num_channels={self.num_channels})"
        )


def create_partitioner(
    kind: Any,
    num_channels: int,
    *,
    key_field: str | None = None,
    max_parallelism: int = kgs.DEFAULT_MAX_PARALLELISM,
    subtask_index: int = 0,
) -> Partitioner:
    """The partitioner of an edge: ``kind`` is ``"forward"``, ``"hash"``, ``"rebalance"`` or
    ``"broadcast"`` (or a ``PartitionerKind`` enum). ``max_parallelism`` is the *target*
    vertex's; ``subtask_index`` (the producer's) staggers the rebalance start channel."""
    name = str(getattr(kind, "value", kind)).lower()
    if name == "forward":
        if num_channels != 1:
            raise InvalidArgumentError(f"a forward edge has one channel, got {num_channels}")
        return ForwardPartitioner()
    if name in ("hash", "key_group", "keyed"):
        if not key_field:
            raise InvalidArgumentError("a hash edge needs a key field")
        return KeyGroupPartitioner(key_field, max_parallelism, num_channels)
    if name == "rebalance":
        return RebalancePartitioner(num_channels, start_channel=subtask_index)
    if name == "broadcast":
        return BroadcastPartitioner(num_channels)
    raise InvalidArgumentError(f"unknown partitioner kind {kind!r}")
