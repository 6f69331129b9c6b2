"""How the Kafka sink turns a batch of rows into Kafka records' keys, values and headers.

:class:`KafkaSerializer` encodes one part of a record (key or value) for a whole batch at once
into a ``pa.BinaryArray`` (null: no key, or a tombstone value):

* ``raw(column)``: a binary column as it is;
* ``string(column)``: a string column as UTF-8;
* ``json(columns)``: a JSON object of the chosen columns (all: None), built with Arrow
  compute over whole columns, no Python loop per row. Integers, floats (NaN and infinities
  become ``null``), booleans, strings, and dates and timestamps (ISO text) are supported;
  other types are refused at the first batch, naming the column;
* ``function(fn)``: ``fn(batch)`` returns one ``bytes``, ``str`` (UTF-8) or ``None`` per row;
* a plain column name: ``raw`` for a binary column, ``string`` for a string one, the decimal
  text of an integer one.

Headers come from a column of ``map<string, binary|string>`` or ``list<struct<key: string,
value: binary|string>>``; a null cell has no headers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from snapflow.errors import InvalidArgumentError

Kind = Literal["raw", "string", "json", "function", "column"]

RowEncoder = Callable[[pa.RecordBatch], Sequence[bytes | str | None]]


@dataclass(frozen=True)
class KafkaSerializer:
    """How a key or a value is made from a batch (see the module docstring); build one with
    :meth:`raw`, :meth:`string`, :meth:`json`, :meth:`function` or :meth:`column`."""

    kind: Kind
    columns: tuple[str, ...] | None = None
    fn: RowEncoder | None = None

    @classmethod
    def raw(cls, column: str) -> KafkaSerializer:
        return cls("raw", (_name(column),))

    @classmethod
    def string(cls, column: str) -> KafkaSerializer:
        return cls("string", (_name(column),))

    @classmethod
    def json(cls, columns: Sequence[str] | None = None) -> KafkaSerializer:
        if columns is None:
            return cls("json", None)
        if isinstance(columns, str) or not columns:
            raise InvalidArgumentError(
                f"KafkaSerializer.json needs a non-empty list of columns (or None: all), "
                f"got {columns!r:.80}"
            )
        return cls("json", tuple(_name(c) for c in columns))

    @classmethod
    def function(cls, fn: RowEncoder) -> KafkaSerializer:
        if not callable(fn):
            raise InvalidArgumentError(f"KafkaSerializer.function needs a callable, got {fn!r:.80}")
        return cls("function", None, fn)

    @classmethod
    def column(cls, column: str) -> KafkaSerializer:
        """By the column's type: binary as is, string as UTF-8, integers as decimal text."""
        return cls("column", (_name(column),))

    @classmethod
    def of(cls, spec: KafkaSerializer | str, what: str) -> KafkaSerializer:
        """A serializer, or a column name (:meth:`column`)."""
        if isinstance(spec, KafkaSerializer):
            return spec
        if isinstance(spec, str):
            return cls.column(spec)
        raise InvalidArgumentError(
            f"KafkaSink {what} must be a column name or a KafkaSerializer (raw, string, json, "
            f"function), got {spec!r:.80}"
        )

    def encode(self, batch: pa.RecordBatch) -> pa.Array:
        """One binary (or null) cell per row of ``batch``."""
        if self.kind == "function":
            assert self.fn is not None
            return _from_function(self.fn, batch)
        if self.kind == "json":
            return json_objects(batch, self.columns)
        assert self.columns is not None
        col = _column(batch, self.columns[0])
        t = col.type
        if self.kind == "raw" or (self.kind == "column" and _is_binary(t)):
            if not _is_binary(t):
                raise InvalidArgumentError(f"column {self.columns[0]!r} is {t}, not binary")
            return col.cast(pa.binary())
        if self.kind == "string" or (self.kind == "column" and _is_string(t)):
            if not _is_string(t):
                raise InvalidArgumentError(f"column {self.columns[0]!r} is {t}, not a string")
            return col.cast(pa.string()).cast(pa.binary())
        if pa.types.is_integer(t):
            return col.cast(pa.string()).cast(pa.binary())
        raise InvalidArgumentError(
            f"column {self.columns[0]!r} is {t}: a key or value column must be binary, string "
            f"or integer; use KafkaSerializer.json or KafkaSerializer.function for others"
        )


def _name(column: object) -> str:
    if not isinstance(column, str) or not column:
        raise InvalidArgumentError(f"a column name must be a non-empty string, got {column!r:.80}")
    return column


def _is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _column(batch: pa.RecordBatch, name: str) -> pa.Array:
    index = batch.schema.get_field_index(name)
    if index < 0:
        raise InvalidArgumentError(f"the batch has no column {name!r}: {batch.schema.names}")
    return batch.column(index)


def _from_function(fn: RowEncoder, batch: pa.RecordBatch) -> pa.Array:
    out = list(fn(batch))
    if len(out) != batch.num_rows:
        raise InvalidArgumentError(
            f"a KafkaSerializer function returned {len(out)} values for {batch.num_rows} rows"
        )
    cells: list[bytes | None] = []
    for v in out:
        if v is None or isinstance(v, bytes):
            cells.append(v)
        elif isinstance(v, str):
            cells.append(v.encode())
        else:
            raise InvalidArgumentError(
                f"a KafkaSerializer function must return bytes, str or None per row, got "
                f"{type(v).__name__}"
            )
    return pa.array(cells, pa.binary())


# --- JSON, vectorised ------------------------------------------------------------------------

_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))
_CONTROL = "[\x00-\x1f]"


def _json_string(col: pa.Array) -> pa.Array:
    """Each string as a JSON string literal (quoted and escaped)."""
    s = col.cast(pa.string())
    for raw, escaped in _ESCAPES:
        s = pc.replace_substring(s, raw, escaped)
    if pc.any(pc.match_substring_regex(s, _CONTROL)).as_py():
        for code in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20)]:
            s = pc.replace_substring(s, chr(code), f"\\u{code:04x}")
    return pc.binary_join_element_wise('"', s, '"', "")


def _json_value(name: str, col: pa.Array) -> pa.Array:
    """The JSON text of each cell (``null`` for nulls)."""
    t = col.type
    if pa.types.is_integer(t):
        text = col.cast(pa.string())
    elif pa.types.is_floating(t):
        finite = pc.is_finite(col)
        text = pc.if_else(
            finite, col.cast(pa.float64()).cast(pa.string()), pa.scalar(None, pa.string())
        )
    elif pa.types.is_boolean(t):
        text = pc.if_else(col, "true", "false")
    elif _is_string(t):
        text = _json_string(col)
    elif pa.types.is_timestamp(t) or pa.types.is_date(t):
        text = _json_string(col.cast(pa.string()))
    else:
        raise InvalidArgumentError(
            f"KafkaSerializer.json cannot encode column {name!r} of type {t}; leave it out "
            f"(json(columns=[...])) or use KafkaSerializer.function"
        )
    return pc.fill_null(text, "null")


def json_objects(batch: pa.RecordBatch, columns: Sequence[str] | None) -> pa.Array:
    """One JSON object per row of ``batch`` with the chosen columns (all: None), as binary."""
    names = list(columns) if columns is not None else batch.schema.names
    if not names:
        raise InvalidArgumentError("KafkaSerializer.json: the batch has no columns")
    parts: list[Any] = []
    for i, name in enumerate(names):
        parts.append(("{" if i == 0 else ",") + json.dumps(name) + ":")
        parts.append(_json_value(name, _column(batch, name)))
    parts.append("}")
    if batch.num_rows == 0:
        return pa.array([], pa.binary())
    joined = pc.binary_join_element_wise(*parts, "")
    return joined.cast(pa.binary())


# --- headers ---------------------------------------------------------------------------------


def headers_of(batch: pa.RecordBatch, column: str) -> list[list[tuple[str, bytes]] | None]:
    """Per row, the headers of a ``map<string, binary|string>`` or ``list<struct<key,
    value>>`` column, as confluent-kafka takes them (None: no headers)."""
    col = _column(batch, column)
    t = col.type
    ok = pa.types.is_map(t) or (
        pa.types.is_list(t)
        and pa.types.is_struct(t.value_type)
        and {f.name for f in t.value_type} == {"key", "value"}
    )
    if not ok:
        raise InvalidArgumentError(
            f"headers column {column!r} is {t}: it must be map<string, binary|string> or "
            f"list<struct<key: string, value: binary|string>>"
        )
    out: list[list[tuple[str, bytes]] | None] = []
    for cell in col.to_pylist():
        if cell is None:
            out.append(None)
            continue
        pairs = [(p["key"], p["value"]) if isinstance(p, dict) else p for p in cell]
        out.append([(str(k), v.encode() if isinstance(v, str) else (v or b"")) for k, v in pairs])
    return out
