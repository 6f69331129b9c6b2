"""The Kafka sink's keys, values and headers from a batch: columns by type, JSON of columns
(vectorised, checked against ``json.loads`` row by row), user functions; refusals name the
fix."""

from __future__ import annotations

import datetime as dt
import json
import math

import pyarrow as pa
import pytest

from snapflow.errors import InvalidArgumentError
from snapflow.worker.connectors.kafka_sink_encoding import (
    KafkaSerializer,
    headers_of,
    json_objects,
)


def test_columns_by_type() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "b": pa.array([b"\x00\x01", None]),
            "s": pa.array(["é", "x"]),
            "i": pa.array([-5, 7], pa.int32()),
        }
    )
    assert KafkaSerializer.column("b").encode(batch).to_pylist() == [b"\x00\x01", None]
    assert KafkaSerializer.column("s").encode(batch).to_pylist() == ["é".encode(), b"x"]
    assert KafkaSerializer.column("i").encode(batch).to_pylist() == [b"-5", b"7"]
    assert KafkaSerializer.raw("b").encode(batch).type == pa.binary()
    assert KafkaSerializer.string("s").encode(batch).to_pylist() == ["é".encode(), b"x"]
    with pytest.raises(InvalidArgumentError, match="not binary"):
        KafkaSerializer.raw("s").encode(batch)
    with pytest.raises(InvalidArgumentError, match="not a string"):
        KafkaSerializer.string("i").encode(batch)
    with pytest.raises(InvalidArgumentError, match="no column 'nope'"):
        KafkaSerializer.column("nope").encode(batch)


def test_json_objects_match_json_loads_row_by_row() -> None:
    names = ["plain", 'quote " and \\ back', "new\nline\ttab\r", "ctl \x01\x1f", None, "ünï"]
    n = len(names)
    batch = pa.RecordBatch.from_pydict(
        {
            "id": pa.array(range(n), pa.int64()),
            "name": pa.array(names),
            "x": pa.array([1.5, float("nan"), float("inf"), None, -0.25, 1e20]),
            "ok": pa.array([True, False, None, True, False, True]),
            "day": pa.array([dt.date(2024, 1, 2)] * n),
            "ts": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5)] * n, pa.timestamp("ms")),
        }
    )
    got = [json.loads(v) for v in json_objects(batch, None).to_pylist()]
    for i, row in enumerate(got):
        assert row["id"] == i
        assert row["name"] == names[i]
        x = batch.column("x")[i].as_py()
        assert row["x"] == (x if x is not None and math.isfinite(x) else None)
        assert row["ok"] == batch.column("ok")[i].as_py()
        assert row["day"] == "2024-01-02"
        assert row["ts"].startswith("2024-01-02")
    assert list(got[0]) == ["id", "name", "x", "ok", "day", "ts"]
    first = KafkaSerializer.json(["ok", "id"]).encode(batch)[0].as_py()
    assert json.loads(first) == {"ok": True, "id": 0}
    assert json_objects(batch.slice(0, 0), None).to_pylist() == []


def test_json_refuses_what_it_cannot_encode() -> None:
    batch = pa.RecordBatch.from_pydict({"l": pa.array([[1]])})
    with pytest.raises(InvalidArgumentError, match=r"column 'l' of type list.*function"):
        KafkaSerializer.json().encode(batch)
    with pytest.raises(InvalidArgumentError, match="non-empty list"):
        KafkaSerializer.json("l")


def test_functions() -> None:
    batch = pa.RecordBatch.from_pydict({"v": [1, 2, 3]})
    fn = KafkaSerializer.function(lambda b: [b"a", "b", None])
    assert fn.encode(batch).to_pylist() == [b"a", b"b", None]
    with pytest.raises(InvalidArgumentError, match="2 values for 3 rows"):
        KafkaSerializer.function(lambda b: [b"a", b"b"]).encode(batch)
    with pytest.raises(InvalidArgumentError, match="bytes, str or None"):
        KafkaSerializer.function(lambda b: [1, 2, 3]).encode(batch)  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match="callable"):
        KafkaSerializer.function("nope")  # type: ignore[arg-type]


def test_headers_from_maps_and_lists_of_pairs() -> None:
    pairs = pa.struct([("key", pa.string()), ("value", pa.string())])
    batch = pa.RecordBatch.from_pydict(
        {
            "m": pa.array([[("a", b"1")], None, []], pa.map_(pa.string(), pa.binary())),
            "l": pa.array([[{"key": "a", "value": "1"}], None, []], pa.list_(pairs)),
            "x": pa.array([1, 2, 3]),
        }
    )
    assert headers_of(batch, "m") == [[("a", b"1")], None, []]
    assert headers_of(batch, "l") == [[("a", b"1")], None, []]
    with pytest.raises(InvalidArgumentError, match="headers column 'x'"):
        headers_of(batch, "x")
