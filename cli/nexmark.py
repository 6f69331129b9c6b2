"""A NexMark-style bid stream: a deterministic, replayable source and its windowed query.

`NexMark <https://datalab.cs.pdx.edu/niagara/NEXMark/>`_ models an online auction: people,
auctions and *bids*. :class:`BidSource` generates the bid stream only, with NexMark's shape: a
few hot auctions take half of the bids, event time increases with bounded out-of-orderness.

Record ``i`` of split ``s`` (:meth:`BidSource.record` is the scalar definition;
``fmix64`` is MurmurHash3's 64-bit finalizer, arithmetic mod 2**64)::

    h       = fmix64((base(seed, s) + i) mod 2**64)       # base: as GeneratorSource's
    g       = fmix64(h xor 0x9E3779B97F4A7C15)
    auction = (h >> 8) mod (num_hot_auctions if h & 1 == 0 else num_auctions)
    bidder  = (h >> 24) mod num_bidders
    price   = min_price + (g >> 32) mod price_range       # cents
    ts      = start_ms + i * interval_ms - (g >> 8) mod (max_out_of_orderness_ms + 1)

Like every split source (:mod:`snapflow.worker.connectors.split_sources`), the records are split over the source's
initial parallelism, replay exactly from a checkpointed position, and the watermark (bounded
out-of-orderness with the same bound) never makes a bid late.

The query of the demo (``snapflow demo``) is a tumbling event-time window per auction with
the number of bids, the sum and the maximum of their prices: :class:`PriceStatsWindow`, a
keyed process function (``KeyedStream.process``). :func:`expected_window_stats` computes its
result from :meth:`BidSource.record` alone, in plain Python (for tests); the demo computes it
with a batch Spark job (:func:`bids_dataframe` and :func:`batch_window_stats`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from snapflow.errors import InvalidArgumentError
from snapflow.worker.api.arrays import arange
from snapflow.worker.api.functions import KeyedContext
from snapflow.worker.connectors.split_sources import SplitSource, split_base
from snapflow.worker.state import keygroups as kgs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "BID_SCHEMA",
    "WINDOW_STATS_SCHEMA",
    "BidSource",
    "PriceStatsWindow",
    "batch_window_stats",
    "bids_dataframe",
    "expected_window_stats",
    "window_stats_rows",
]

_U64 = pa.uint64()
_I64 = pa.int64()
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15

BID_SCHEMA = pa.schema(
    [("auction", _I64), ("bidder", _I64), ("price", _I64), ("ts", _I64)],
)
WINDOW_STATS_SCHEMA = pa.schema(
    [
        ("auction", _I64),
        ("window_start", _I64),
        ("window_end", _I64),
        ("bids", _I64),
        ("sum_price", _I64),
        ("max_price", _I64),
    ]
)
"""The rows of the windowed query: one per auction and window that received bids."""

WindowRow = tuple[int, int, int, int, int, int]

# 2024-01-01T00:00:00Z: a round epoch, so event-time windows print as whole seconds.
DEFAULT_START_MS = 1_704_067_200_000


def _u64(value: int) -> pa.Scalar:
    return pa.scalar(value, _U64)


def _mod_shift(h: pa.Array, shift: int, modulus: int) -> pa.Array:
    """``(h >> shift) mod modulus`` as int64."""
    shifted = pc.shift_right(h, _u64(shift)) if shift else h
    return pc.cast(pc.modulo(shifted, _u64(modulus)), _I64)


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
    return value


class BidSource(SplitSource):
    """Deterministic, replayable NexMark-style bids ``auction, bidder, price, ts`` (int64; ``ts``
    in event-time milliseconds). See the module docstring for the definition of a record.

    ``total_records`` None: unbounded; otherwise split over the initial parallelism.
    ``rate_per_s``: the total rate of the source (None: as fast as possible; see
    :class:`snapflow.worker.connectors.split_sources.SplitSource`). ``interval_ms``: event time between consecutive bids
    of one split. ``clock``: the rate limit's time source (default ``time.monotonic``).
    """

    def __init__(
        self,
        total_records: int | None = None,
        rate_per_s: float | None = None,
        *,
        num_auctions: int = 1000,
        num_hot_auctions: int = 10,
        num_bidders: int = 10_000,
        min_price: int = 100,
        price_range: int = 100_000,
        start_ms: int = DEFAULT_START_MS,
        interval_ms: int = 1,
        max_out_of_orderness_ms: int = 500,
        batch_size: int = 4096,
        seed: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(
            batch_size=batch_size,
            rate_per_s=rate_per_s,
            max_out_of_orderness_ms=max_out_of_orderness_ms,
            clock=clock,
        )
        if total_records is not None and (
            isinstance(total_records, bool)
            or not isinstance(total_records, int)
            or total_records < 0
        ):
            raise InvalidArgumentError(
                f"total_records must be an integer >= 0 or None, got {total_records!r}"
            )
        self.total_records = total_records
        self.num_auctions = _positive("num_auctions", num_auctions)
        self.num_hot_auctions = _positive("num_hot_auctions", num_hot_auctions)
        if num_hot_auctions > num_auctions:
            raise InvalidArgumentError(
                f"num_hot_auctions ({num_hot_auctions}) must not exceed num_auctions ({num_auctions})"
            )
        self.num_bidders = _positive("num_bidders", num_bidders)
        self.price_range = _positive("price_range", price_range)
        if isinstance(min_price, bool) or not isinstance(min_price, int) or min_price < 0:
            raise InvalidArgumentError(f"min_price must be an integer >= 0, got {min_price!r}")
        self.min_price = min_price
        for name, value in (("start_ms", start_ms), ("interval_ms", interval_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(f"{name} must be an integer >= 0, got {value!r}")
        self.start_ms = start_ms
        self.interval_ms = interval_ms
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise InvalidArgumentError(f"seed must be an integer, got {seed!r}")
        self.seed = seed

    @property
    def bounded(self) -> bool:
        return self.total_records is not None

    def split_sizes(self, num_splits: int) -> list[int | None]:
        """Records per split when the source starts fresh at parallelism ``num_splits``."""
        if self.total_records is None:
            return [None] * num_splits
        base, rest = divmod(self.total_records, num_splits)
        return [base + (1 if s < rest else 0) for s in range(num_splits)]

    def _split_sizes(self, num_splits: int) -> list[int | None]:
        return self.split_sizes(num_splits)

    # --- the definition -----------------------------------------------------------------------

    def record(self, split_id: int, i: int) -> dict[str, int]:
        """Bid ``i`` of split ``split_id`` (the scalar definition of the source)."""
        h = kgs.fmix64((split_base(self.seed, split_id) + i) & _MASK64)
        g = kgs.fmix64(h ^ _GOLDEN)
        auctions = self.num_hot_auctions if h & 1 == 0 else self.num_auctions
        return {
            "auction": (h >> 8) % auctions,
            "bidder": (h >> 24) % self.num_bidders,
            "price": self.min_price + (g >> 32) % self.price_range,
            "ts": self.start_ms
            + i * self.interval_ms
            - (g >> 8) % (self.max_out_of_orderness_ms + 1),
        }

    def records(self, split_id: int, start: int, n: int) -> Iterator[dict[str, int]]:
        """Bids ``start .. start + n - 1`` of a split, one by one (:meth:`record`)."""
        for i in range(start, start + n):
            yield self.record(split_id, i)

    # --- the generator ------------------------------------------------------------------------

    def _generate(self, split_id: int, start: int, n: int) -> pa.RecordBatch:
        if n == 0:
            return pa.RecordBatch.from_arrays([pa.array([], _I64)] * 4, schema=BID_SCHEMA)
        return self.generate(split_id, start, n)

    def generate(self, split_id: int, start: int, n: int) -> pa.RecordBatch:
        """Bids ``start .. start + n - 1`` of a split as one batch (vectorised :meth:`record`)."""
        rel = pc.cast(arange(n), _U64)
        base = (split_base(self.seed, split_id) + start) & _MASK64
        h = kgs.fmix64_array(pc.add(rel, _u64(base)))
        g = kgs.fmix64_array(pc.bit_wise_xor(h, _u64(_GOLDEN)))
        hot = pc.equal(pc.bit_wise_and(h, _u64(1)), _u64(0))
        auction = pc.if_else(
            hot, _mod_shift(h, 8, self.num_hot_auctions), _mod_shift(h, 8, self.num_auctions)
        )
        bidder = _mod_shift(h, 24, self.num_bidders)
        price = pc.add(_mod_shift(g, 32, self.price_range), pa.scalar(self.min_price, _I64))
        idx = pc.add(pc.cast(rel, _I64), pa.scalar(start, _I64))
        ts = pc.add(
            pc.multiply(idx, pa.scalar(self.interval_ms, _I64)), pa.scalar(self.start_ms, _I64)
        )
        if self.max_out_of_orderness_ms:
            ts = pc.subtract(ts, _mod_shift(g, 8, self.max_out_of_orderness_ms + 1))
        return pa.RecordBatch.from_arrays([auction, bidder, price, ts], schema=BID_SCHEMA)

    def _event_times(self, batch: pa.RecordBatch) -> pa.Array | None:
        return batch.column(3)

    def __repr__(self) -> str:
        return (
            f"BidSource(total_records={self.total_records}, rate_per_s={self.rate_per_s}, "
            f"num_auctions={self.num_auctions}, seed={self.seed})"
        )


# ---------------------------------------------------------------------------------------------
# The query: bids, sum and max of the price per auction and tumbling event-time window
# ---------------------------------------------------------------------------------------------


class PriceStatsWindow:
    """A tumbling event-time window of ``size_ms`` per auction with the number of bids, the sum
    and the maximum of their prices, as a keyed process function::

        window = PriceStatsWindow(10_000)
        bids.key_by("auction").process(
            window, on_timer=window.on_timer, output_schema=WINDOW_STATS_SCHEMA
        )

    State: per auction, a map ``window_start -> (bids, sum, max)``; one event-time timer per
    auction and window at the window's last millisecond, which emits the window's row and drops
    its entry (Flink's ``EventTimeTrigger`` without allowed lateness). Bids for a window whose
    timer already fired (late bids: impossible with :class:`BidSource`'s watermarks) are
    dropped and counted in keyed state ``late``.
    """

    def __init__(self, size_ms: int) -> None:
        self.size_ms = _positive("size_ms", size_ms)

    def window_start(self, ts: int) -> int:
        return ts - ts % self.size_ms

    def __call__(
        self, key: Any, rows: list[dict[str, Any]], ctx: KeyedContext
    ) -> list[dict[str, Any]] | None:
        windows = ctx.get_map_state("windows")
        watermark = ctx.current_watermark
        size = self.size_ms
        partial: dict[int, list[int]] = {}
        late = 0
        for row in rows:
            ts = row["ts"]
            start = ts - ts % size
            if start + size - 1 <= watermark:
                late += 1
                continue
            price = row["price"]
            acc = partial.get(start)
            if acc is None:
                partial[start] = [1, price, price]
            else:
                acc[0] += 1
                acc[1] += price
                if price > acc[2]:
                    acc[2] = price
        for start, (n, total, top) in partial.items():
            old = windows.get(start)
            if old is None:
                windows.put(start, (n, total, top))
                ctx.register_event_time_timer(start + size - 1)
            else:
                windows.put(start, (old[0] + n, old[1] + total, max(old[2], top)))
        if late:
            dropped = ctx.get_value_state("late", 0)
            dropped.update((dropped.value() or 0) + late)
        return None

    def on_timer(self, timestamp: int, key: Any, ctx: KeyedContext) -> list[dict[str, Any]]:
        start = timestamp - self.size_ms + 1
        windows = ctx.get_map_state("windows")
        entry = windows.get(start)
        if entry is None:
            return []
        windows.remove(start)
        n, total, top = entry
        return [
            {
                "auction": key,
                "window_start": start,
                "window_end": start + self.size_ms,
                "bids": n,
                "sum_price": total,
                "max_price": top,
            }
        ]

    def __repr__(self) -> str:
        return f"PriceStatsWindow(size_ms={self.size_ms})"


def window_stats_rows(table: pa.Table) -> Counter[WindowRow]:
    """The rows of a table of :data:`WINDOW_STATS_SCHEMA` columns as a multiset of tuples."""
    if table.num_rows == 0:
        return Counter()
    columns = [table.column(name).to_pylist() for name in WINDOW_STATS_SCHEMA.names]
    return Counter(zip(*columns, strict=True))


def expected_window_stats(source: BidSource, parallelism: int, size_ms: int) -> Counter[WindowRow]:
    """The query's result over a bounded ``source`` started at ``parallelism``, in plain Python
    from :meth:`BidSource.record` (each row once)."""
    if source.total_records is None:
        raise InvalidArgumentError("expected_window_stats needs a bounded source")
    acc: dict[tuple[int, int], list[int]] = {}
    for split, size in enumerate(source.split_sizes(parallelism)):
        assert size is not None
        for bid in source.records(split, 0, size):
            ts = bid["ts"]
            key = (bid["auction"], ts - ts % size_ms)
            entry = acc.get(key)
            price = bid["price"]
            if entry is None:
                acc[key] = [1, price, price]
            else:
                entry[0] += 1
                entry[1] += price
                entry[2] = max(entry[2], price)
    return Counter(
        (auction, start, start + size_ms, n, total, top)
        for (auction, start), (n, total, top) in acc.items()
    )


# ---------------------------------------------------------------------------------------------
# The same query as a batch Spark job
# ---------------------------------------------------------------------------------------------

CHUNK_RECORDS = 20_000


def _chunks(source: BidSource, parallelism: int) -> list[tuple[int, int, int]]:
    """``(split, start, n)`` pieces of at most CHUNK_RECORDS covering every split."""
    out = []
    for split, size in enumerate(source.split_sizes(parallelism)):
        assert size is not None
        for start in range(0, size, CHUNK_RECORDS):
            out.append((split, start, min(CHUNK_RECORDS, size - start)))
    return out


def bids_dataframe(
    spark: SparkSession, source: BidSource, parallelism: int, partitions: int | None = None
) -> DataFrame:
    """Every bid of a bounded ``source`` started at ``parallelism`` as a Spark DataFrame,
    generated on the executors from :meth:`BidSource.record` (not from the vectorised generator
    the streaming job reads, so the check is independent of it), in at most ``partitions``
    partitions (default: Spark's default parallelism)."""
    if source.total_records is None:
        raise InvalidArgumentError("bids_dataframe needs a bounded source")
    chunks = _chunks(source, parallelism)
    names = BID_SCHEMA.names

    def generate(chunk: tuple[int, int, int]) -> Iterator[tuple[int, ...]]:
        split, start, n = chunk
        for bid in source.records(split, start, n):
            yield tuple(bid[name] for name in names)

    sc = spark.sparkContext
    slices = max(1, min(len(chunks), partitions or sc.defaultParallelism))
    rows = sc.parallelize(chunks, slices).flatMap(generate)
    schema = ", ".join(f"{name} long" for name in names)
    return spark.createDataFrame(rows, schema, verifySchema=False)


def batch_window_stats(bids: DataFrame, size_ms: int) -> Counter[WindowRow]:
    """The query over a DataFrame of bids, in Spark SQL: group by auction and tumbling window."""
    from pyspark.sql import functions as F

    start = (F.col("ts") - F.pmod(F.col("ts"), F.lit(size_ms))).alias("window_start")
    rows = (
        bids.groupBy("auction", start)
        .agg(
            F.count(F.lit(1)).alias("bids"),
            F.sum("price").alias("sum_price"),
            F.max("price").alias("max_price"),
        )
        .select(
            "auction",
            "window_start",
            (F.col("window_start") + F.lit(size_ms)).alias("window_end"),
            "bids",
            "sum_price",
            "max_price",
        )
        .collect()
    )
    return Counter(tuple(int(v) for v in row) for row in rows)  # type: ignore[misc]
