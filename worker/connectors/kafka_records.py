"""Kafka records to Arrow batches: the value formats (:class:`KafkaValueFormat`), the columns of
a record's metadata, and the policy for records whose value cannot be decoded.

A batch is built column by column from the consumer's messages (one list per field, then one
Arrow array each); JSON values are parsed in one ``pyarrow.json`` call over their
concatenation. Only a batch that holds an undecodable value is looked at record by record, to
find which ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from snapflow.errors import InvalidArgumentError

__all__ = [
    "METADATA_COLUMNS",
    "DecodedBatch",
    "KafkaValueFormat",
    "RecordDecoder",
    "UndecodableRecordError",
]

METADATA_COLUMNS: dict[str, pa.DataType] = {
    "key": pa.binary(),
    "topic": pa.string(),
    "partition": pa.int32(),
    "offset": pa.int64(),
    "timestamp": pa.int64(),
    "headers": pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
}
"""The metadata columns a source may emit: the record's key (binary, or string with
``key_format="utf-8"``), where it was (topic, partition, offset), its Kafka timestamp (int64
milliseconds, null when the record has none) and its headers."""

DEFAULT_METADATA = ("key", "topic", "partition", "offset", "timestamp")

ValueKind = Literal["bytes", "utf-8", "json", "function"]
ValueFunction = Callable[[bytes], Mapping[str, Any]]


class UndecodableRecordError(ValueError):
    """A record's value (or key) could not be decoded and the policy is ``"fail"``."""


@dataclass(frozen=True)
class KafkaValueFormat:
    """How a record's value becomes columns: ``bytes()`` and ``utf8()`` give one column
    ``value``; ``json(schema)`` and ``function(fn, schema)`` give the fields of ``schema`` (a
    JSON object per value, fields not in the schema ignored; ``fn`` maps a value's bytes to a
    row). A record without a value (a tombstone) has nulls in these columns."""

    kind: ValueKind = "bytes"
    schema: pa.Schema | None = None
    function: ValueFunction | None = None

    @classmethod
    def bytes(cls) -> KafkaValueFormat:
        return cls("bytes")

    @classmethod
    def utf8(cls) -> KafkaValueFormat:
        return cls("utf-8")

    @classmethod
    def json(cls, schema: pa.Schema) -> KafkaValueFormat:
        return cls("json", _check_schema(schema, "json"))

    @classmethod
    def from_function(cls, function: ValueFunction, schema: pa.Schema) -> KafkaValueFormat:
        if not callable(function):
            raise InvalidArgumentError(f"from_function needs a callable, got {function!r:.60}")
        return cls("function", _check_schema(schema, "from_function"), function)

    def fields(self) -> list[pa.Field]:
        if self.kind == "bytes":
            return [pa.field("value", pa.binary())]
        if self.kind == "utf-8":
            return [pa.field("value", pa.string())]
        assert self.schema is not None
        return list(self.schema)


def _check_schema(schema: pa.Schema, who: str) -> pa.Schema:
    if not isinstance(schema, pa.Schema) or not len(schema):
        raise InvalidArgumentError(f"{who} needs a pyarrow.Schema with at least one field")
    return schema


@dataclass(frozen=True)
class DecodedBatch:
    """One poll's records: the batch of all of them (undecodable ones with null values), which
    to keep (``kept``, None: all), where each was (``topics``: None when the source reads one
    topic), their Kafka timestamps (when asked for), and how many are undecodable."""

    batch: pa.RecordBatch
    partitions: pa.Array
    offsets: pa.Array
    kept: pa.Array | None
    timestamps: pa.Array | None
    topics: list[str] | None
    skipped: int


class RecordDecoder:
    """Builds the source's batches (see the module docstring)."""

    def __init__(
        self,
        value_format: KafkaValueFormat,
        *,
        metadata: Sequence[str] = DEFAULT_METADATA,
        key_format: Literal["bytes", "utf-8"] = "bytes",
        on_undecodable: Literal["fail", "skip"] = "fail",
    ) -> None:
        if not isinstance(value_format, KafkaValueFormat):
            raise InvalidArgumentError(
                f"value_format must be a KafkaValueFormat (KafkaValueFormat.json(schema), ...), "
                f"got {value_format!r:.60}"
            )
        unknown = [m for m in metadata if m not in METADATA_COLUMNS]
        if unknown or len(set(metadata)) != len(metadata):
            raise InvalidArgumentError(
                f"metadata columns are distinct names among {sorted(METADATA_COLUMNS)}, got "
                f"{list(metadata)!r}"
            )
        if key_format not in ("bytes", "utf-8"):
            raise InvalidArgumentError(f"key_format is 'bytes' or 'utf-8', got {key_format!r}")
        if on_undecodable not in ("fail", "skip"):
            raise InvalidArgumentError(
                f"on_undecodable is 'fail' or 'skip', got {on_undecodable!r}"
            )
        self.value_format = value_format
        self.metadata = tuple(metadata)
        self.key_format = key_format
        self.on_undecodable = on_undecodable
        value_fields = value_format.fields()
        clash = sorted({f.name for f in value_fields} & set(self.metadata))
        if clash:
            raise InvalidArgumentError(
                f"value columns {clash} clash with metadata columns of the same names: leave "
                f"them out of metadata or rename the fields"
            )
        meta_fields = [
            pa.field(
                m, pa.string() if m == "key" and key_format == "utf-8" else METADATA_COLUMNS[m]
            )
            for m in self.metadata
        ]
        key_first = [f for f in meta_fields if f.name == "key"]
        rest = [f for f in meta_fields if f.name != "key"]
        self.schema = pa.schema([*key_first, *value_fields, *rest])

    def empty(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [pa.array([], f.type) for f in self.schema], schema=self.schema
        )

    def decode(
        self, messages: Sequence[Any], topic: str | None, need_timestamps: bool
    ) -> DecodedBatch:
        """The batch of ``messages`` (confluent-kafka ``Message``s without errors). ``topic``:
        the one topic they all come from (None: read each record's)."""
        n = len(messages)
        partitions = pa.array([m.partition() for m in messages], pa.int32())
        offsets = pa.array([m.offset() for m in messages], pa.int64())
        topics = None if topic is not None else [m.topic() for m in messages]
        timestamps = None
        if need_timestamps or "timestamp" in self.metadata:
            timestamps = pa.array([m.timestamp()[1] for m in messages], pa.int64())
            if n and pc.min(timestamps).as_py() < 0:  # type NOT_AVAILABLE: -1
                timestamps = pc.if_else(
                    pc.less(timestamps, 0), pa.scalar(None, pa.int64()), timestamps
                )
        bad: dict[int, str] = {}
        values = [m.value() for m in messages]
        value_columns = self._values(values, bad)
        columns: dict[str, pa.Array] = {}
        if "key" in self.metadata:
            columns["key"] = self._keys([m.key() for m in messages], bad)
        for field, column in zip(self.value_format.fields(), value_columns, strict=True):
            columns[field.name] = column
        for name in self.metadata:
            if name == "topic":
                columns[name] = (
                    pa.nulls(n, pa.string()).fill_null(topic)
                    if topic is not None
                    else pa.array(topics, pa.string())
                )
            elif name == "partition":
                columns[name] = partitions
            elif name == "offset":
                columns[name] = offsets
            elif name == "timestamp":
                assert timestamps is not None
                columns[name] = timestamps
            elif name == "headers":
                columns[name] = pa.array(
                    [m.headers() for m in messages], METADATA_COLUMNS["headers"]
                )
        batch = pa.RecordBatch.from_arrays(
            [columns[f.name] for f in self.schema], schema=self.schema
        )
        kept = None
        if bad:
            first = min(bad)
            if self.on_undecodable == "fail":
                m = messages[first]
                raise UndecodableRecordError(
                    f"KafkaSource: cannot decode the record at topic {m.topic()!r} partition "
                    f"{m.partition()} offset {m.offset()}: {bad[first]}; fix the producer or "
                    f"the value format, or pass on_undecodable='skip' to skip and count such "
                    f"records"
                )
            kept = pa.array([i not in bad for i in range(n)], pa.bool_())
        return DecodedBatch(batch, partitions, offsets, kept, timestamps, topics, len(bad))

    # --- keys and values --------------------------------------------------------------------

    def _keys(self, keys: list[bytes | None], bad: dict[int, str]) -> pa.Array:
        raw = pa.array(keys, pa.binary())
        if self.key_format == "bytes":
            return raw
        return _utf8(raw, keys, bad, "key")

    def _values(self, values: list[bytes | None], bad: dict[int, str]) -> list[pa.Array]:
        kind = self.value_format.kind
        if kind == "bytes":
            return [pa.array(values, pa.binary())]
        if kind == "utf-8":
            return [_utf8(pa.array(values, pa.binary()), values, bad, "value")]
        schema = self.value_format.schema
        assert schema is not None
        if kind == "json":
            table = _json_values(values, schema, bad)
        else:
            table = self._function_values(values, schema, bad)
        return [table.column(i).combine_chunks() for i in range(len(schema))]

    def _function_values(
        self, values: list[bytes | None], schema: pa.Schema, bad: dict[int, str]
    ) -> pa.Table:
        fn = self.value_format.function
        assert fn is not None
        rows: list[Mapping[str, Any]] = []
        for i, value in enumerate(values):
            if value is None:
                rows.append({})
                continue
            try:
                rows.append(fn(value))
            except Exception as exc:
                bad[i] = f"the value function raised {type(exc).__name__}: {exc}"
                rows.append({})
        try:
            return pa.Table.from_pylist(rows, schema)
        except (pa.ArrowException, TypeError, ValueError):
            pass
        for i, row in enumerate(rows):
            try:
                pa.Table.from_pylist([row], schema)
            except (pa.ArrowException, TypeError, ValueError) as exc:
                bad[i] = f"the value function's row does not fit the schema: {exc}"
                rows[i] = {}
        return pa.Table.from_pylist(rows, schema)


def _utf8(raw: pa.Array, items: list[bytes | None], bad: dict[int, str], what: str) -> pa.Array:
    try:
        return pc.cast(raw, pa.string())
    except pa.ArrowInvalid:
        pass
    fixed: list[str | None] = []
    for i, item in enumerate(items):
        if item is None:
            fixed.append(None)
            continue
        try:
            fixed.append(item.decode("utf-8"))
        except UnicodeDecodeError as exc:
            bad[i] = f"the {what} is not UTF-8 ({exc.reason} at byte {exc.start})"
            fixed.append(None)
    return pa.array(fixed, pa.string())


_EMPTY_OBJECT = b"{}"


def _json_values(values: list[bytes | None], schema: pa.Schema, bad: dict[int, str]) -> pa.Table:
    """``values`` (JSON objects) parsed into ``schema`` in one call; tombstones give nulls;
    undecodable values go into ``bad`` (and give nulls)."""
    docs = [_EMPTY_OBJECT if v is None else v for v in values]
    if not docs:
        return schema.empty_table()
    # Each value must be one object: pyarrow.json takes a top-level "null" as a row (and
    # crashes on a document that is only "null"), so anything else is caught first.
    raw = pa.array(docs, pa.binary())
    objects = pc.match_substring_regex(raw, r"^\s*\{")
    if not pc.all(objects).as_py():
        for i, ok in enumerate(objects.to_pylist()):
            if not ok:
                bad[i] = "the value is not a JSON object"
                docs[i] = _EMPTY_OBJECT
    joined = b"\n".join(docs)
    if joined.count(b"\n") != len(docs) - 1 or b"\r" in joined:
        docs = [d.replace(b"\r", b" ").replace(b"\n", b" ") for d in docs]
        joined = b"\n".join(docs)
    table = _read_json(joined, schema)
    if table is not None and table.num_rows == len(docs):
        return table
    for i, doc in enumerate(docs):  # find the undecodable ones, then parse the rest again
        reason = _json_problem(doc, schema)
        if reason is not None:
            bad[i] = reason
            docs[i] = _EMPTY_OBJECT
    table = _read_json(b"\n".join(docs), schema)
    assert table is not None and table.num_rows == len(docs)
    return table


def _read_json(joined: bytes, schema: pa.Schema) -> pa.Table | None:
    try:
        return pa_json.read_json(
            pa.BufferReader(joined),
            read_options=pa_json.ReadOptions(block_size=max(1 << 20, len(joined) + 1)),
            parse_options=pa_json.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    except pa.ArrowInvalid:
        return None


def _json_problem(doc: bytes, schema: pa.Schema) -> str | None:
    """Why ``doc`` is not one JSON object that fits ``schema`` (None: it is)."""
    try:
        parsed = json.loads(doc)
    except (ValueError, UnicodeDecodeError) as exc:
        return f"the value is not JSON ({exc})"
    if not isinstance(parsed, dict):
        return "the value is not a JSON object"
    table = _read_json(doc, schema)
    if table is None or table.num_rows != 1:
        return f"the JSON object does not fit the schema {schema.names}"
    return None
