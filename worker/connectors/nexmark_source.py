"""The Nexmark source: one kind of Nexmark event (people, auctions or bids) as a replayable
split source.

The events are :mod:`snapflow.worker.connectors.nexmark_model`'s: event ``n`` of the one
serial Nexmark stream is a pure function of ``(config, n)``. The source emits the events of
one ``kind`` among the first ``num_events`` (None: unbounded) in typed batches
(``SCHEMAS[kind]``). Why typed rather than one stream of the union of the fields: every query
reads bids only, or joins two kinds; a union stream would make each of them filter 4 % to 8 %
of the rows out and carry 18 always-null columns through every operator, and generating
people and auctions costs about 5 times as much per row as a bid. A join reads two sources of
the same ``config`` (one per kind): the same events, the same event time.

Splits (:class:`snapflow.worker.connectors.split_sources.SplitSource`): the events are cut
into blocks of ``block_epochs`` epochs of 50 events, dealt round-robin to the initial
subtasks, so every split advances through event time with the others (a block apart at most)
and the union of the splits is the serial stream, whatever the parallelism. A split's position
(its next record) is operator state, checkpointed and restored like every split source's.

Watermarks: ``dateTime - watermark_delay_ms`` (4 s, Nexmark's ``WATERMARK FOR dateTime AS
dateTime - INTERVAL '4' SECOND``) over each split's events, with the split sources' bounded
out-of-orderness (the maximum so far minus the delay minus 1 ms); event time never goes back
within a split, so no event is ever late.

Batches: by default every kind's batch spans the same events, ``BATCH_EPOCHS`` epochs (65,504
bids, 4,272 auctions or 1,424 people), as when the one serial stream is read and filtered
(Flink's Nexmark source emits all kinds in one stream). Batches of 65,536 rows of every kind
would make a person batch span 46 times the event time of a bid batch (3.3 M events): a
downstream window or join then holds seconds of work in a single frame, which a checkpoint
barrier waits behind (q8's first checkpoint took 6.9 s that way), and the two inputs of a
join drift apart in event time.

Counting: ``num_events`` counts the events of all three kinds, as Nexmark's ``events.num`` does;
the source generates only its kind's rows among them (46 of 50 for bids).
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.worker.connectors.nexmark_model import (
    BID,
    SCHEMAS,
    NexmarkConfig,
    generate,
    split_count,
    split_ordinals,
)
from snapflow.worker.connectors.split_sources import SplitSource

__all__ = ["NexmarkSource"]

WATERMARK_DELAY_MS = 4000
BATCH_EPOCHS = 1424
"""Epochs (of 50 events) a batch spans by default: the largest whole number of epochs whose
bids fit in 65,536 rows."""


class NexmarkSource(SplitSource):
    """The events of ``kind`` (``"person"``, ``"auction"`` or ``"bid"``) among the first
    ``num_events`` Nexmark events (None: unbounded). ``rate_per_s``: events of this kind per
    second on the wall clock (None: as fast as possible); event time is the model's
    (``config.first_event_rate``). ``batch_size``: rows per batch (None: ``BATCH_EPOCHS``
    epochs' worth of ``kind``)."""

    def runs_on_loop(self) -> bool:
        return True  # vectorised generation (numpy), bounded by the batch size

    def __init__(
        self,
        kind: str = BID,
        num_events: int | None = None,
        *,
        config: NexmarkConfig | None = None,
        rate_per_s: float | None = None,
        batch_size: int | None = None,
        block_epochs: int = 1024,
        watermark_delay_ms: int = WATERMARK_DELAY_MS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if kind not in SCHEMAS:
            raise InvalidArgumentError(f"kind must be one of {sorted(SCHEMAS)}, got {kind!r}")
        config = config if config is not None else NexmarkConfig()
        super().__init__(
            batch_size=batch_size
            if batch_size is not None
            else BATCH_EPOCHS * config.per_epoch(kind),
            rate_per_s=rate_per_s,
            max_out_of_orderness_ms=watermark_delay_ms,
            clock=clock,
        )
        if num_events is not None and (
            isinstance(num_events, bool) or not isinstance(num_events, int) or num_events < 0
        ):
            raise InvalidArgumentError(
                f"num_events must be an integer >= 0 or None, got {num_events!r}"
            )
        if isinstance(block_epochs, bool) or not isinstance(block_epochs, int) or block_epochs < 1:
            raise InvalidArgumentError(
                f"block_epochs must be an integer >= 1, got {block_epochs!r}"
            )
        self.kind = kind
        self.num_events = num_events
        self.config = config
        self.block_epochs = block_epochs
        self.output_schema = SCHEMAS[kind]

    @property
    def bounded(self) -> bool:
        return self.num_events is not None

    def _split_sizes(self, num_splits: int) -> list[int | None]:
        if self.num_events is None:
            return [None] * num_splits
        return [
            split_count(self.config, self.kind, self.num_events, s, num_splits, self.block_epochs)
            for s in range(num_splits)
        ]

    def _generate(self, split_id: int, start: int, n: int) -> pa.RecordBatch:
        ordinals = split_ordinals(
            self.config, self.kind, start, n, split_id, max(1, self._num_splits), self.block_epochs
        )
        return generate(self.config, self.kind, ordinals)

    def _empty(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist([], schema=self.output_schema)

    def _event_times(self, batch: pa.RecordBatch) -> pa.Array | None:
        return batch.column("dateTime")

    def __repr__(self) -> str:
        return (
            f"NexmarkSource(kind={self.kind!r}, num_events={self.num_events}, "
            f"rate_per_s={self.rate_per_s}, batch_size={self.batch_size})"
        )
