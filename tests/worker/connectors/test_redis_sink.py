"""worker/connectors/redis_sink.py: the idempotent Redis hash sink against a real
redis-server (writes at the barrier, replays are idempotent)."""

from __future__ import annotations

import pickle
from typing import Any

import pyarrow as pa
import pytest
import redis
from kit.sinks import sink_ctx
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.worker.connectors.redis_sink import RedisSink
from snapflow.worker.connectors.split_sources import GeneratorSource
from snapflow.worker.runtime.chain import Chain
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.operator_state import OperatorStateBackend


def counts(rows: list[tuple[int, int]]) -> pa.RecordBatch:
    keys, values = zip(*rows, strict=True) if rows else ((), ())
    return pa.RecordBatch.from_pydict(
        {"key": pa.array(keys, pa.int64()), "count": pa.array(values, pa.int64())}
    )


def hashes(url: str, pattern: str = "*") -> dict[str, dict[str, str]]:
    r: Any = redis.Redis.from_url(url, decode_responses=True)
    try:
        keys: list[str] = sorted(r.scan_iter(match=pattern))
        return {k: dict(r.hgetall(k)) for k in keys}
    finally:
        r.close()


def test_redis_sink_writes_on_snapshot_only(redis_url: str) -> None:
    sink = RedisSink(redis_url, "key", ["count"], key_prefix="cnt:")
    sink.open(sink_ctx(OperatorStateBackend()))
    assert sink._client is None  # lazy: no connection before the first write
    assert sink.process_batch(counts([(1, 1), (2, 1), (1, 2)])) == []
    assert sink.buffered_rows == 3
    assert hashes(redis_url) == {}  # buffered until the barrier
    sink.snapshot_state(1)
    assert sink.buffered_rows == 0
    assert hashes(redis_url) == {"cnt:1": {"count": "2"}, "cnt:2": {"count": "1"}}
    sink.process_batch(counts([(2, 2)]))
    sink.notify_checkpoint_complete(1)
    assert hashes(redis_url)["cnt:2"] == {"count": "1"}
    assert sink.end_input() == []  # end of input flushes too
    assert hashes(redis_url)["cnt:2"] == {"count": "2"}
    sink.snapshot_state(2)  # nothing buffered: nothing to write
    sink.close()
    assert sink._client is None


def test_redis_sink_replay_is_idempotent(redis_url: str) -> None:
    rows = [(k, c) for c in range(1, 4) for k in range(5)]  # running counts, upserts
    once = RedisSink(redis_url, "key", key_prefix="a:")
    once.open(sink_ctx(OperatorStateBackend()))
    once.process_batch(counts(rows))
    once.snapshot_state(1)
    once.close()
    # a run that checkpoints after 6 rows, writes 4 more, fails, and replays from the checkpoint
    twice = RedisSink(redis_url, "key", key_prefix="b:", max_buffered_rows=4)
    twice.open(sink_ctx(OperatorStateBackend()))
    twice.process_batch(counts(rows[:6]))  # flushed early (buffer of 4 rows reached)
    twice.snapshot_state(1)
    twice.process_batch(counts(rows[6:10]))  # flushed (threshold): after the checkpoint
    assert hashes(redis_url, "b:*")["b:0"] == {"count": "2"}
    twice.close()  # the failure
    replay = cloudpickle.loads(cloudpickle.dumps(RedisSink(redis_url, "key", key_prefix="b:")))
    replay.open(sink_ctx(OperatorStateBackend(), restored=1))
    replay.process_batch(counts(rows[6:]))  # rows 6..9 are written a second time
    replay.snapshot_state(2)
    replay.close()
    a, b = hashes(redis_url, "a:*"), hashes(redis_url, "b:*")
    assert {k[2:]: v for k, v in a.items()} == {k[2:]: v for k, v in b.items()}
    assert a == {f"a:{k}": {"count": "3"} for k in range(5)}
    # the same rows written twice: the same final hashes
    again = RedisSink(redis_url, "key", key_prefix="a:")
    again.open(sink_ctx(OperatorStateBackend()))
    again.process_batch(counts(rows))
    again.process_batch(counts(rows))
    again.snapshot_state(3)
    again.close()
    assert hashes(redis_url, "a:*") == a


def test_redis_sink_composite_keys_values_and_nulls(redis_url: str) -> None:
    sink = RedisSink(redis_url, ("key", "window_start"), key_prefix="win:", key_separator="|")
    sink.open(sink_ctx(OperatorStateBackend()))
    batch = pa.RecordBatch.from_pydict(
        {
            "key": ["a", "b"],
            "window_start": pa.array([0, 1000], pa.int64()),
            "sum": [1.5, None],
            "ok": [True, False],
            "tag": [b"x", b"y"],
        }
    )
    sink.process_batch(batch)
    sink.snapshot_state(1)
    assert hashes(redis_url) == {
        "win:a|0": {"sum": "1.5", "ok": "true", "tag": "x"},
        "win:b|1000": {"ok": "false", "tag": "y"},
    }
    # a null deletes the field; other fields are left as they are
    sink.process_batch(
        pa.RecordBatch.from_pydict(
            {"key": ["a"], "window_start": [0], "sum": [None], "ok": [False], "tag": ["z"]}
        )
    )
    sink.snapshot_state(2)
    assert hashes(redis_url)["win:a|0"] == {"ok": "false", "tag": "z"}
    with pytest.raises(InvalidArgumentError, match="no field"):
        sink.process_batch(pa.RecordBatch.from_pydict({"key": ["a"], "sum": [1]}))
    with pytest.raises(InvalidArgumentError, match="null key"):
        sink.process_batch(
            pa.RecordBatch.from_pydict({"key": [None], "window_start": [0], "sum": [1]})
        )
    sink.close()


def test_redis_sink_validation_pickling_and_failed_flush(redis_url: str) -> None:
    with pytest.raises(InvalidArgumentError):
        RedisSink(redis_url, ())
    with pytest.raises(InvalidArgumentError):
        RedisSink(redis_url, "key", ["key"])
    with pytest.raises(InvalidArgumentError):
        RedisSink(redis_url, "key", [])
    with pytest.raises(InvalidArgumentError):
        RedisSink(redis_url, "key", max_buffered_rows=0)
    with pytest.raises(StateError):
        RedisSink(redis_url, "key").flush()  # not open
    sink = RedisSink(redis_url, "key", ["count"])
    sink.open(sink_ctx(OperatorStateBackend()))
    sink.process_batch(counts([(1, 1)]))
    sink.snapshot_state(1)
    assert sink._client is not None
    copy = pickle.loads(pickle.dumps(sink))  # the open client is not shipped
    assert "_client" not in copy.__dict__ and copy.url == redis_url
    sink.close()
    # Redis unreachable: the snapshot (hence the checkpoint) fails, the rows stay buffered
    down = RedisSink("redis://127.0.0.1:1/0", "key")
    down.open(sink_ctx(OperatorStateBackend()))
    down.process_batch(counts([(1, 1)]))
    with pytest.raises(redis.ConnectionError):
        down.snapshot_state(1)
    assert down.buffered_rows == 1
    down.url = redis_url
    down._client = None
    down.snapshot_state(2)  # the retry writes them
    assert down.buffered_rows == 0 and hashes(redis_url) == {"1": {"count": "1"}}
    down.close()


def test_redis_sink_in_a_chain_flushes_at_the_barrier(redis_url: str) -> None:
    source = GeneratorSource(500, batch_size=50, num_keys=7, seed=1)
    sink = RedisSink(redis_url, "key", ["value", "ts"], key_prefix="g:")
    chain = Chain([source, sink])
    chain.open(OperatorContext(vertex_id="v", operator_id="x"))
    while chain.poll_batch(64) is not None:
        pass
    chain.snapshot_state(1)
    chain.close()
    last: dict[int, dict[str, str]] = {}
    for i in range(500):
        rec = source.record(0, i)
        last[rec["key"]] = {"value": str(rec["value"]), "ts": str(rec["ts"])}
    assert hashes(redis_url) == {f"g:{k}": v for k, v in sorted(last.items())}
