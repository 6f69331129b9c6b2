"""The Nexmark generator: determinism by event id, the 1/3/46 proportions, the id and time
model, the watermark bound, and the split source's replay from a checkpointed position."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from kit.sources import src_ctx
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError
from snapflow.worker.connectors.nexmark_model import (
    AUCTION,
    BID,
    KINDS,
    PERSON,
    NexmarkConfig,
    event_ids,
    generate,
    kind_count,
    kind_of,
    nexmark_events,
    split_count,
    split_ordinals,
)
from snapflow.worker.connectors.nexmark_source import BATCH_EPOCHS, NexmarkSource
from snapflow.worker.state.operator_state import OperatorStateBackend

CONFIG = NexmarkConfig(first_event_rate=1000.0)


def test_kinds_follow_the_proportions_1_3_46() -> None:
    kinds = Counter(kind_of(CONFIG, n) for n in range(5000))
    assert kinds == {PERSON: 100, AUCTION: 300, BID: 4600}
    assert [kind_of(CONFIG, n) for n in range(6)] == [PERSON, AUCTION, AUCTION, AUCTION, BID, BID]
    for kind in KINDS:
        assert kind_count(CONFIG, kind, 5000) == kinds[kind]
        ids = event_ids(CONFIG, kind, np.arange(kinds[kind], dtype=np.int64))
        assert all(kind_of(CONFIG, int(n)) == kind for n in ids)
        assert len(set(ids.tolist())) == len(ids) and int(ids.max()) < 5000


def test_ids_and_time_model() -> None:
    people = nexmark_events(CONFIG, PERSON, 5000)
    auctions = nexmark_events(CONFIG, AUCTION, 5000)
    bids = nexmark_events(CONFIG, BID, 5000)
    assert people["id"].to_pylist() == list(range(1000, 1100))
    assert auctions["id"].to_pylist() == list(range(1000, 1300))
    # Event n happens at base + n ms at 1000 events/s: person n = 50 * (id - 1000).
    assert people["dateTime"].to_pylist() == [CONFIG.base_time_ms + 50 * i for i in range(100)]
    times = bids["dateTime"].to_numpy()
    assert (np.diff(times) >= 0).all()
    # Bids point at existing (or at most 10 ahead) auctions and people, hot ones most often.
    auction = bids["auction"].to_numpy()
    bidder = bids["bidder"].to_numpy()
    assert auction.min() >= 1000 and auction.max() < 1300 + 10
    assert bidder.min() >= 1000 and bidder.max() < 1100 + 10
    hot_auction = (auction - 1000) % 100 == 0
    assert 0.45 < hot_auction.mean() < 0.6  # 1 - 1/2, plus the cold ones landing on a hot id
    assert 0.7 < ((bidder - 1000) % 100 == 1).mean() < 0.8  # 1 - 1/4
    seller = auctions["seller"].to_numpy()
    assert 0.7 < ((seller - 1000) % 100 == 0).mean() < 0.8
    assert set(auctions["category"].to_pylist()) <= set(range(10, 15))
    assert (auctions["reserve"].to_numpy() > auctions["initialBid"].to_numpy()).all()
    assert (auctions["expires"].to_numpy() > auctions["dateTime"].to_numpy()).all()
    prices = bids["price"].to_numpy()
    assert prices.min() >= 100 and prices.max() <= 100_000_000
    channels = Counter(bids["channel"].to_pylist())
    hot = sum(channels[c] for c in ("Google", "Facebook", "Baidu", "Apple"))
    assert 0.45 < hot / len(prices) < 0.55
    extra = np.array([len(e) for e in bids["extra"].to_pylist()])
    assert 55 <= extra.mean() <= 80  # padding to 100 bytes a bid


def test_events_are_a_function_of_the_event_id_alone() -> None:
    whole = generate(CONFIG, BID, np.arange(0, 3000, dtype=np.int64))
    scattered = [generate(CONFIG, BID, np.array([i], dtype=np.int64)) for i in (0, 17, 2999)]
    assert [b.to_pylist()[0] for b in scattered] == [
        whole.slice(i, 1).to_pylist()[0] for i in (0, 17, 2999)
    ]
    odd = generate(CONFIG, BID, np.arange(1, 3000, 2, dtype=np.int64))
    assert odd.to_pylist() == whole.take(pa.array(range(1, 3000, 2))).to_pylist()
    other_seed = generate(NexmarkConfig(first_event_rate=1000.0, seed=1), BID, np.arange(100))
    assert other_seed.column("price") != whole.slice(0, 100).column("price")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_splits,block", [(1, 1024), (2, 3), (3, 1)])
def test_splits_partition_the_stream(kind: str, num_splits: int, block: int) -> None:
    num_events = 10_007
    parts = []
    for s in range(num_splits):
        n = split_count(CONFIG, kind, num_events, s, num_splits, block)
        parts.append(split_ordinals(CONFIG, kind, 0, n, s, num_splits, block))
    ordinals = np.sort(np.concatenate(parts))
    assert ordinals.tolist() == list(range(kind_count(CONFIG, kind, num_events)))


def test_invalid_config_and_source_arguments() -> None:
    with pytest.raises(InvalidArgumentError):
        NexmarkConfig(first_event_rate=0)
    with pytest.raises(InvalidArgumentError):
        NexmarkSource("people")
    with pytest.raises(InvalidArgumentError):
        NexmarkSource(BID, -1)


def _drain(source: NexmarkSource, limit: int | None = None) -> list[pa.RecordBatch]:
    batches: list[pa.RecordBatch] = []
    while limit is None or len(batches) < limit:
        b = source.poll_batch(1 << 20)
        if b is None:
            break
        if b.num_rows:
            batches.append(b)
    return batches


def test_source_replays_from_its_checkpointed_position_and_bounds_the_watermark(
    tmp_path: Path,
) -> None:
    num_events = 20_000
    expected = nexmark_events(CONFIG, BID, num_events)
    rows = []
    for s in range(2):
        backend = OperatorStateBackend()
        first = NexmarkSource(BID, num_events, config=CONFIG, batch_size=1000, block_epochs=2)
        first.open(src_ctx(s, 2, backend))
        before = _drain(first, 3)
        seen = max(max(b["dateTime"].to_pylist()) for b in before)
        assert first.current_watermark() == seen - 4000 - 1  # dateTime - 4 s
        first.snapshot_state(1)
        handles = backend.snapshot(1).write(str(tmp_path / f"chk-{s}"))
        # A restored source resumes at the snapshot's position: the same records follow.
        restored = OperatorStateBackend()
        restored.restore({s: handles}, s, 2)
        second = cloudpickle.loads(
            cloudpickle.dumps(
                NexmarkSource(BID, num_events, config=CONFIG, batch_size=1000, block_epochs=2)
            )
        )
        second.open(src_ctx(s, 2, restored, restored=1))
        assert second.current_watermark() == seen - 4000 - 1
        after_restore = _drain(second)
        after_original = _drain(first)
        assert [b.to_pylist() for b in after_restore] == [b.to_pylist() for b in after_original]
        rows += [r for b in before + after_original for r in b.to_pylist()]
    assert len(rows) == expected.num_rows

    def key(r: dict[str, object]) -> tuple[object, ...]:
        return (r["dateTime"], r["auction"], r["bidder"], r["price"], r["extra"])

    assert sorted(rows, key=key) == sorted(expected.to_pylist(), key=key)


def test_every_kind_s_batches_span_the_same_events_by_default() -> None:
    """A person batch spans as many events (as much event time) as a bid batch: a join's two
    inputs advance together, and a downstream window never gets seconds of work in one frame."""
    num_events = 50 * 3 * BATCH_EPOCHS
    spans = {}
    for kind in KINDS:
        source = NexmarkSource(kind, num_events, config=CONFIG)
        assert source.batch_size == BATCH_EPOCHS * CONFIG.per_epoch(kind)
        source.open(src_ctx(0, 1, OperatorStateBackend()))
        first = _drain(source, 1)[0]
        assert first.num_rows == source.batch_size
        spans[kind] = max(first["dateTime"].to_pylist()) - min(first["dateTime"].to_pylist())
    # the same epochs: the first and last event time of each kind within one epoch's span
    epoch_ms = 50 * 1000 / CONFIG.first_event_rate
    assert max(spans.values()) - min(spans.values()) <= epoch_ms
    assert NexmarkSource(BID, num_events, config=CONFIG, batch_size=10).batch_size == 10
