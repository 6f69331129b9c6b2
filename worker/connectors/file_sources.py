"""File sources: the files of a directory, and a Spark DataFrame (or table) staged as files.

* :class:`FileSource` -- bounded and replayable. The files of a directory (csv, jsonl, parquet
  or Arrow IPC), one split per file, read with the :class:`snapflow.worker.connectors.split_sources.SplitSource`
  machinery: the position of a split is ``(file index, row offset)`` in operator list state,
  so a restore resumes at exactly the next row, and on a rescale the splits are redistributed
  (every file keeps being read by exactly one subtask: no row lost or duplicated).
* :class:`DataFrameSource` -- a Spark DataFrame (or table) as a bounded, partitioned,
  replayable source: :meth:`DataFrameSource.from_dataframe` materialises it *on the driver*,
  at pipeline construction, into Parquet files in a staging directory (one file per Spark
  partition = one split) and reads them as a :class:`FileSource`. :func:`source_from_dataframe`
  adds it to a :class:`snapflow.spark_bridge.pipeline.Pipeline` in one call.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.event_time import MAX_WATERMARK, MIN_WATERMARK
from snapflow.worker.connectors.split_sources import SplitSource, _Split
from snapflow.worker.runtime.operator import OperatorContext, SourceOperator
from snapflow.worker.runtime.watermarks import BoundedOutOfOrdernessWatermarks
from snapflow.worker.state.operator_state import OperatorListState

FILE_FORMATS = ("csv", "jsonl", "parquet", "arrow")


def list_data_files(directory: str | os.PathLike[str]) -> list[str]:
    """The data files directly in ``directory`` (not recursive), sorted by name: regular files
    whose name starts with neither ``.`` nor ``_`` (skips Spark's ``_SUCCESS`` and ``.crc``)."""
    root = os.fspath(directory)
    try:
        names = os.listdir(root)
    except FileNotFoundError as exc:
        raise InvalidArgumentError(f"source directory {root!r} does not exist") from exc
    return sorted(
        n for n in names if not n.startswith((".", "_")) and os.path.isfile(os.path.join(root, n))
    )


class FileSource(SplitSource):
    """The rows of the files in ``directory``, bounded and replayable by position.

    * **Files.** On a fresh start each subtask lists ``directory`` in ``open`` (see
      :func:`list_data_files`; sorted by name) -- unless ``files`` (names relative to
      ``directory``) fixes the list at construction, which is what :class:`DataFrameSource`
      does. The directory must not change while the subtasks start: they must all see the same
      list (pass ``files`` to rule that out). Files added later are never read; a restore never
      lists the directory again: it reads exactly the files recorded in the checkpoint.
    * **Splits.** File ``i`` of the ``n`` listed is split ``i``, owned on a fresh start by
      subtask ``i % parallelism``. A subtask reads its files one after the other (in file
      order), ``min(max_records, batch_size)`` rows per batch. A file is loaded (whole) when the
      subtask starts reading it; one file is held in memory at a time.
    * **Position.** ``(file index, row offset, row count, watermark state, file name)`` of every
      owned split is operator list state; after a restore a subtask resumes every split at
      exactly its row offset, and a rescale redistributes the splits (SplitSource's machinery).
      A file recorded in a checkpoint must still exist (unchanged) when the job restores.
    * **Schema.** ``schema`` (a ``pyarrow.Schema``) selects and casts the columns of every
      file (csv: the column types; jsonl: the explicit schema). Without it, the schema of the
      first listed file is used for all (pass a schema when csv/json type inference could
      differ between files).
    * **Event time.** ``timestamp_field`` (int64 milliseconds): the watermark is the bounded
      out-of-orderness watermark (``max_out_of_orderness_ms``) of the unfinished files, so it
      stays behind until the last file of the subtask is being read; ``MAX_WATERMARK`` once
      done. Without it: ``MIN_WATERMARK`` until finished.
    * ``rate_per_s``: total rate over the subtasks (as for :class:`snapflow.worker.connectors.split_sources.GeneratorSource`).
    """

    _runtime_fields = (*SplitSource._runtime_fields, "_names", "_schema", "_cache", "_first_name")

    def __init__(
        self,
        directory: str | os.PathLike[str],
        format: str = "csv",
        schema: pa.Schema | None = None,
        batch_size: int = 65536,
        *,
        files: Sequence[str] | None = None,
        timestamp_field: str | None = None,
        max_out_of_orderness_ms: int = 0,
        rate_per_s: float | None = None,
    ) -> None:
        super().__init__(
            batch_size=batch_size,
            rate_per_s=rate_per_s,
            max_out_of_orderness_ms=max_out_of_orderness_ms,
        )
        if format not in FILE_FORMATS:
            raise InvalidArgumentError(f"format must be one of {FILE_FORMATS}, got {format!r}")
        if schema is not None and not isinstance(schema, pa.Schema):
            raise InvalidArgumentError(f"schema must be a pyarrow.Schema or None, got {schema!r}")
        if files is not None:
            files = list(files)
            if not all(isinstance(f, str) and f for f in files):
                raise InvalidArgumentError("files must be non-empty file names (strings)")
        self.directory = os.fspath(directory)
        self.format = format
        self.schema = schema
        self.files = files
        self.timestamp_field = timestamp_field

    @property
    def bounded(self) -> bool:
        return True

    # --- life cycle -------------------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        SourceOperator.open(self, ctx)
        self._position_state: OperatorListState[Any] = ctx.operator_state.get_list_state(
            ctx.state_name("files")
        )
        self._marker_state: OperatorListState[Any] = ctx.operator_state.get_union_list_state(
            ctx.state_name("num-files")
        )
        markers = self._marker_state.get()
        self._names: dict[int, str] = {}
        self._splits: list[_Split] = []
        if ctx.is_restored and markers:
            self._num_splits = int(markers[0][0])
            self._first_name: str | None = markers[0][1]
            for entry in self._position_state.get():
                if not (isinstance(entry, tuple) and len(entry) == 5):
                    raise StateError(f"{self.name}: malformed file position {entry!r:.100}")
                index, offset, rows, wm_state, name = entry
                self._add_split(index, offset, rows, wm_state, name)
        else:
            names = list(self.files) if self.files is not None else list_data_files(self.directory)
            self._num_splits = len(names)
            self._first_name = names[0] if names else None
            for index in range(ctx.subtask_index, len(names), ctx.parallelism):
                self._add_split(index, 0, None, None, names[index])
        self._splits.sort(key=lambda sp: sp.split_id)
        self._schema: pa.Schema | None = self.schema
        self._cache: tuple[int, pa.Table] | None = None
        self._rr = 0
        self._rate = (
            None if self.rate_per_s is None else float(self.rate_per_s) / max(1, ctx.parallelism)
        )
        self._rate_start = self.clock()
        self._rate_emitted = 0

    def _add_split(
        self, index: int, offset: int, rows: int | None, wm_state: Any, name: str
    ) -> None:
        wm = BoundedOutOfOrdernessWatermarks(self.max_out_of_orderness_ms)
        wm.restore(wm_state)
        # end_index None: the row count is not known until the file is loaded
        self._splits.append(_Split(index, offset, rows, wm))
        self._names[index] = name

    def snapshot_state(self, checkpoint_id: int) -> None:
        self._position_state.update(
            [(*sp.entry(), self._names[sp.split_id]) for sp in self._splits]
        )
        self._marker_state.update([(self._num_splits, self._first_name)])

    def close(self) -> None:
        self._cache = None

    @property
    def positions(self) -> list[tuple[str, int, int | None]]:
        """``(file name, next row, row count or None if not loaded yet)`` of the owned files."""
        return [(self._names[sp.split_id], sp.next_index, sp.end_index) for sp in self._splits]

    # --- reading ----------------------------------------------------------------------------

    def poll_batch(self, max_records: int) -> pa.RecordBatch | None:
        self._context()
        for split in self._splits:
            if split.end_index is None:
                split.end_index = self._table(split.split_id).num_rows
            if not split.finished:
                break
        self._rr = 0  # files one after the other: always the first unfinished split
        return super().poll_batch(max_records)

    def _path(self, index: int) -> str:
        return os.path.join(self.directory, self._names[index])

    def _read(self, path: str) -> pa.Table:
        schema = self.schema
        try:
            if self.format in ("csv", "jsonl") and os.path.getsize(path) == 0:
                return (schema or pa.schema([])).empty_table()  # pyarrow rejects empty text
            if self.format == "csv":
                convert = (
                    pa_csv.ConvertOptions(column_types=schema, include_columns=schema.names)
                    if schema is not None
                    else None
                )
                return pa_csv.read_csv(path, convert_options=convert)
            if self.format == "jsonl":
                parse = (
                    pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
                    if schema is not None
                    else None
                )
                return pa_json.read_json(path, parse_options=parse)
            if self.format == "parquet":
                return pq.read_table(path)
            with pa.memory_map(path) as source:
                try:
                    return pa.ipc.open_file(source).read_all()
                except pa.ArrowInvalid:
                    source.seek(0)
                    return pa.ipc.open_stream(source).read_all()
        except FileNotFoundError as exc:
            raise StateError(
                f"{self.name}: file {path!r} of the source is gone (a restored file source "
                "needs every file recorded in the checkpoint)"
            ) from exc

    def _target_schema(self) -> pa.Schema:
        if self._schema is None:
            if self._first_name is None:
                raise StateError(f"{self.name}: no files, so no schema")
            first = os.path.join(self.directory, self._first_name)
            if self.format == "parquet":
                self._schema = pq.read_schema(first)
            else:
                self._schema = self._read(first).schema
        return self._schema

    def _table(self, index: int) -> pa.Table:
        if self._cache is not None and self._cache[0] == index:
            return self._cache[1]
        self._cache = None  # release the previous file first
        table = self._read(self._path(index))
        schema = self._target_schema()
        if table.num_rows == 0:
            table = schema.empty_table()
        elif table.schema != schema:
            try:
                table = table.select(schema.names).cast(schema)
            except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise StateError(
                    f"{self.name}: file {self._names[index]!r} does not fit the schema "
                    f"{schema}: {exc}"
                ) from exc
        self._cache = (index, table)
        return table

    def _generate(self, split_id: int, start: int, n: int) -> pa.RecordBatch:
        if n == 0:
            return pa.RecordBatch.from_pylist([], schema=self._target_schema())
        table = self._table(split_id).slice(start, n).combine_chunks()
        batches = table.to_batches()
        if len(batches) == 1:
            return batches[0]
        return pa.RecordBatch.from_pylist([], schema=table.schema)  # a table of 0 chunks

    def _event_times(self, batch: pa.RecordBatch) -> pa.Array | None:
        if self.timestamp_field is None:
            return None
        return batch.column(self.timestamp_field)

    def current_watermark(self) -> int:
        wm = super().current_watermark()
        if self.timestamp_field is None and wm != MAX_WATERMARK:
            return MIN_WATERMARK
        return wm

    def __repr__(self) -> str:
        return f"FileSource({self.directory!r}, format={self.format!r})"


class DataFrameSource(FileSource):
    """A Spark DataFrame (or table) as a bounded, partitioned, replayable source.

    Build it with :meth:`from_dataframe` (or :meth:`from_table`) on the driver, while the
    pipeline is constructed: the DataFrame is written once (``df.write.parquet``) into
    ``staging_dir``, which must not exist yet; every Spark partition becomes one Parquet file,
    i.e. one split (``partitions`` repartitions first). The file list is fixed right then, so
    all subtasks and every restore read exactly the same snapshot of the data, whatever happens
    to the DataFrame's inputs later. ``staging_dir`` must be readable by the workers (a shared
    file system on a cluster) and is never deleted by Snapflow: it must outlive every
    checkpoint that may be restored. Reading is :class:`FileSource` (format ``parquet``).
    """

    @classmethod
    def from_dataframe(
        cls,
        df: Any,
        staging_dir: str | os.PathLike[str],
        *,
        partitions: int | None = None,
        batch_size: int = 65536,
        timestamp_field: str | None = None,
        max_out_of_orderness_ms: int = 0,
        rate_per_s: float | None = None,
    ) -> DataFrameSource:
        staging = os.fspath(staging_dir)
        if os.path.exists(staging) and os.listdir(staging):
            raise InvalidArgumentError(
                f"staging_dir {staging!r} is not empty: it must be a new directory"
            )
        if partitions is not None:
            if not isinstance(partitions, int) or partitions < 1:
                raise InvalidArgumentError(
                    f"partitions must be an integer >= 1, got {partitions!r}"
                )
            df = df.repartition(partitions)
        df.write.mode("overwrite").parquet(staging)
        files = list_data_files(staging)
        schema = pq.read_schema(os.path.join(staging, files[0])) if files else None
        return cls(
            staging,
            "parquet",
            schema,
            batch_size,
            files=files,
            timestamp_field=timestamp_field,
            max_out_of_orderness_ms=max_out_of_orderness_ms,
            rate_per_s=rate_per_s,
        )

    @classmethod
    def from_table(
        cls, spark: Any, table: str, staging_dir: str | os.PathLike[str], **kwargs: Any
    ) -> DataFrameSource:
        """:meth:`from_dataframe` of ``spark.table(table)``."""
        return cls.from_dataframe(spark.table(table), staging_dir, **kwargs)

    def __repr__(self) -> str:
        return f"DataFrameSource({self.directory!r}, files={len(self.files or [])})"


def source_from_dataframe(
    pipeline: Any,
    df: Any,
    staging_dir: str | os.PathLike[str],
    *,
    name: str | None = None,
    parallelism: int | None = None,
    **kwargs: Any,
) -> Any:
    """``pipeline.source(DataFrameSource.from_dataframe(df, staging_dir, **kwargs), ...)``: a
    new source vertex (a :class:`snapflow.spark_bridge.pipeline.Stream`) reading the DataFrame."""
    source = DataFrameSource.from_dataframe(df, staging_dir, **kwargs)
    return pipeline.source(source, name=name, parallelism=parallelism)
