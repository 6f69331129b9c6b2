"""Partitioners and watermark generators (worker/partitioners.py)."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MIN_WATERMARK
from snapflow.worker.runtime.partitioners import (
    BroadcastPartitioner,
    ForwardPartitioner,
    KeyGroupPartitioner,
    RebalancePartitioner,
    create_partitioner,
)
from snapflow.worker.runtime.watermarks import (
    AscendingTimestampsWatermarks,
    BoundedOutOfOrdernessWatermarks,
)
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.keyed_backend import KeyedStateBackend


def numbered(keys: list[Any]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"key": keys, "row": list(range(len(keys)))})


@pytest.mark.parametrize("max_parallelism", [128, 100, 7])
@pytest.mark.parametrize("channels", [1, 2, 3, 5, 7])
@pytest.mark.parametrize("key_kind", ["int", "str", "int32"])
def test_key_group_partitioner_matches_key_group_ranges(
    max_parallelism: int, channels: int, key_kind: str
) -> None:
    if channels > max_parallelism:
        pytest.skip("more channels than key groups")
    rng = random.Random(max_parallelism * 10 + channels)
    keys: list[Any] = [rng.randint(-(10**12), 10**12) for _ in range(2000)]
    if key_kind == "str":
        keys = [f"user-{k}" for k in keys]
    batch = numbered(keys)
    if key_kind == "int32":
        batch = pa.RecordBatch.from_pydict(
            {"key": pa.array([k % 100_000 for k in keys], pa.int32()), "row": batch["row"]}
        )
    part = KeyGroupPartitioner("key", max_parallelism, channels)
    out = part.partition(batch)
    seen_rows: list[int] = []
    for channel, piece in out:
        assert 0 <= channel < channels and piece.num_rows > 0
        assert piece.schema == batch.schema
        kg_range = kgs.key_group_range_for_subtask(max_parallelism, channels, channel)
        rows = piece.to_pylist()
        for r in rows:
            kg = kgs.key_group_for_key(r["key"], max_parallelism)
            assert kg in kg_range
            assert kgs.operator_index_for_key_group(max_parallelism, channels, kg) == channel
            assert part.channel_for_key(r["key"]) == channel
        ids = [r["row"] for r in rows]
        assert ids == sorted(ids)  # input order kept within a channel
        seen_rows.extend(ids)
    assert sorted(seen_rows) == list(range(batch.num_rows))  # every row exactly once
    assert len({c for c, _ in out}) == len(out)


def test_key_group_partitioner_feeds_keyed_state_backends() -> None:
    """What the partitioner sends to subtask i is accepted by subtask i's keyed backend."""
    part = KeyGroupPartitioner("key", 128, 3)
    backends = [KeyedStateBackend.for_subtask(128, 3, i) for i in range(3)]
    batch = numbered([f"k{i}" for i in range(1000)])
    for channel, piece in part.partition(batch):
        state: Any = backends[channel].get_value_state("v")
        state.update_many(piece["key"], piece["row"])  # raises on a foreign key group
    assert sum(len(b.get_value_state("v")) for b in backends) == 1000


def test_key_group_partitioner_fast_paths_and_errors() -> None:
    part = KeyGroupPartitioner("key", 128, 4)
    assert part.partition(numbered([])) == []
    single = numbered([42] * 10)
    out = part.partition(single)
    assert len(out) == 1 and out[0][1] is single  # one target: no copy
    assert out[0][0] == part.channel_for_key(42)
    one = KeyGroupPartitioner("key", 128, 1)
    assert one.partition(single) == [(0, single)]
    with pytest.raises(InvalidArgumentError):
        part.partition(pa.RecordBatch.from_pydict({"other": [1]}))
    with pytest.raises(InvalidArgumentError):
        part.partition(numbered([1, None]))
    with pytest.raises(InvalidArgumentError):
        KeyGroupPartitioner("key", 4, 5)
    copy = cloudpickle.loads(cloudpickle.dumps(part))
    batch = numbered(list(range(100)))
    assert [(c, b.to_pylist()) for c, b in copy.partition(batch)] == [
        (c, b.to_pylist()) for c, b in part.partition(batch)
    ]


def test_forward_rebalance_broadcast() -> None:
    b = numbered([1, 2, 3])
    assert ForwardPartitioner().partition(b) == [(0, b)]
    assert ForwardPartitioner().partition(numbered([])) == []
    rb = RebalancePartitioner(3, start_channel=4)
    assert [rb.partition(b)[0][0] for _ in range(7)] == [1, 2, 0, 1, 2, 0, 1]
    assert rb.partition(numbered([])) == []  # empty batches do not advance the rotation
    assert rb.partition(b)[0][0] == 2
    bc = BroadcastPartitioner(3)
    assert bc.partition(b) == [(0, b), (1, b), (2, b)]
    with pytest.raises(InvalidArgumentError):
        RebalancePartitioner(0)


def test_create_partitioner() -> None:
    from snapflow.jobgraph import PartitionerKind

    assert isinstance(create_partitioner("forward", 1), ForwardPartitioner)
    p = create_partitioner(PartitionerKind.HASH, 4, key_field="k", max_parallelism=64)
    assert isinstance(p, KeyGroupPartitioner) and p.max_parallelism == 64
    r = create_partitioner(PartitionerKind.REBALANCE, 4, subtask_index=6)
    assert isinstance(r, RebalancePartitioner) and r.partition(numbered([1]))[0][0] == 2
    assert isinstance(create_partitioner("broadcast", 2), BroadcastPartitioner)
    for kind, channels in [("hash", 2), ("forward", 2), ("zigzag", 1)]:
        with pytest.raises(InvalidArgumentError):
            create_partitioner(kind, channels)


def test_bounded_out_of_orderness_watermarks() -> None:
    wm = BoundedOutOfOrdernessWatermarks(5)
    assert wm.current_watermark() == MIN_WATERMARK
    wm.on_timestamps(pa.array([10, 30, 20], pa.int64()))
    assert wm.current_watermark() == 30 - 5 - 1
    wm.on_timestamps([25, 28])  # older: the watermark never goes back
    assert wm.current_watermark() == 24
    wm.on_timestamps(pa.array([], pa.int64()))
    wm.on_timestamps(pa.array([40_000], pa.timestamp("s")))
    assert wm.current_watermark() == 40_000_000 - 6
    state = wm.snapshot()
    again = BoundedOutOfOrdernessWatermarks(5)
    again.restore(state)
    assert again.current_watermark() == wm.current_watermark()
    asc = AscendingTimestampsWatermarks()
    asc.on_timestamp(7)
    assert asc.current_watermark() == 6
    with pytest.raises(InvalidArgumentError):
        BoundedOutOfOrdernessWatermarks(-1)
