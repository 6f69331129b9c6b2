"""Pickling state that holds Arrow data, compactly.

pyarrow pickles an array, a record batch or a table with the whole buffers under it, so a
slice of a large batch (a key group's rows, a partitioner's part, a window's rows) pickles as
the entire parent: a snapshot of many small slices of one batch would write that batch once
per slice. :func:`dumps` pickles Arrow objects through the Arrow IPC stream format instead,
which writes only the rows a slice covers; everything else pickles as usual (protocol 5), a
small Arrow object as a nested pickle of its own.
:func:`pickle.loads` reads the result back with no special reader.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import pyarrow as pa

__all__ = ["dumps"]


def dumps(obj: Any) -> bytes:
    """``obj`` pickled (protocol 5), Arrow arrays, batches and tables at their own size."""
    buffer = io.BytesIO()
    _CompactArrowPickler(buffer, protocol=5).dump(obj)
    return buffer.getvalue()


_SMALL = 4096
"""Buffer bytes under which an Arrow object cannot hold more than its own rows, by the
measure of :func:`_holds_more`."""


class _CompactArrowPickler(pickle.Pickler):
    # reducer_override is not consulted for exact ints, strings, dicts, lists and the like, so
    # ordinary keyed state pickles at the C pickler's speed.
    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, pa.RecordBatch | pa.Table | pa.Array):
            return NotImplemented
        total = obj.get_total_buffer_size()
        if total <= _SMALL:
            # pyarrow's own pickling, by the C pickler as one nested pickle: what a small
            # object holds (a batch's schema, fields, types, arrays and buffers, two dozen
            # objects) would otherwise each come through this method, which costs more than
            # the pickling itself (a window's rows are many batches of a few rows)
            return pickle.loads, (pickle.dumps(obj, protocol=5),)
        if not _holds_more(obj, total):
            return NotImplemented  # pyarrow's own pickling is the faster one then
        if isinstance(obj, pa.RecordBatch):
            return _batch_from_ipc, (_ipc(obj.schema, [obj]),)
        if isinstance(obj, pa.Table):
            return _table_from_ipc, (_ipc(obj.schema, obj.to_batches()),)
        if isinstance(obj, pa.Array):
            batch = pa.RecordBatch.from_arrays([obj], names=["values"])
            return _array_from_ipc, (_ipc(batch.schema, [batch]),)
        return NotImplemented


def _holds_more(obj: pa.RecordBatch | pa.Table | pa.Array, total: int) -> bool:
    """Whether the buffers under ``obj`` (``total`` bytes) are much larger than its own rows
    (a slice)."""
    return bool(total > 2 * obj.nbytes + 4096)


def _ipc(schema: pa.Schema, batches: list[pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _table_from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def _batch_from_ipc(data: bytes) -> pa.RecordBatch:
    table = _table_from_ipc(data)
    batches = table.to_batches()
    if len(batches) == 1:
        return batches[0]
    return pa.RecordBatch.from_arrays(
        [pa.array([], f.type) for f in table.schema], schema=table.schema
    )


def _array_from_ipc(data: bytes) -> pa.Array:
    column: pa.Array = _batch_from_ipc(data).column(0)
    return column
