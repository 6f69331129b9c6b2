"""Running a Nexmark query of ``examples/nexmark`` both ways: as a Snapflow job (exactly-once
files, read after the commit) and as batch Spark SQL over the same generated events; and
comparing the two (the tests of tests/nexmark and ``make bench BENCH=nexmark``)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle

from snapflow import (
    JobResult,
    NexmarkConfig,
    NexmarkSource,
    NoRestart,
    Pipeline,
    TransactionalFileSink,
    read_committed,
)
from snapflow.state_backend_options import HEAP
from snapflow.worker.connectors.committed_files import open_committed
from snapflow.worker.connectors.file_sink import committed_files
from snapflow.worker.connectors.nexmark_model import SCHEMAS, generate, kind_count

QUERIES_DIR = Path(__file__).resolve().parents[2] / "examples" / "nexmark"
VIEW_COLUMNS = {
    "person": "id, name, emailAddress, creditCard, city, state, "
    "timestamp_millis(dateTime) AS dateTime, extra",
    "auction": "id, itemName, description, initialBid, reserve, "
    "timestamp_millis(dateTime) AS dateTime, timestamp_millis(expires) AS expires, seller, "
    "category, extra",
    "bid": "auction, bidder, price, channel, url, timestamp_millis(dateTime) AS dateTime, extra",
}


def query_names() -> list[str]:
    """Every query of examples/nexmark, in numeric order."""
    return sorted((p.stem for p in QUERIES_DIR.glob("q*.py")), key=lambda q: int(q[1:]))


def load_query(name: str) -> ModuleType:
    """The query file ``examples/nexmark/<name>.py`` as a module (loaded once)."""
    module_name = f"nexmark_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, QUERIES_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)  # the executors cannot import the file
    return module


@dataclass
class StreamingRun:
    result: JobResult
    directory: Path  # the sink's

    @property
    def output(self) -> pa.Table:
        """Every committed row."""
        return read_committed(self.directory)


def run_streaming(
    spark: Any,
    query: ModuleType,
    num_events: int,
    base: Path,
    config: NexmarkConfig,
    *,
    parallelism: int = 2,
    interval_ms: int = 1000,
    block_epochs: int = 1024,
    timeout_s: float = 240.0,
    coordinator_address: str | None = None,
    state_backend: str = HEAP,
    compression: str | None = None,
) -> StreamingRun:
    """The query as a Snapflow job over the first ``num_events`` events: sources of its input
    kinds -> ``query(...)`` -> ``TransactionalFileSink`` (files compressed with
    ``compression``), aligned checkpoints every ``interval_ms``, keyed state in
    ``state_backend`` (``"heap"`` or ``"rocksdb"``)."""
    out = base / "out"
    p = Pipeline(f"nexmark-{query.NAME}", parallelism=parallelism)
    inputs = {
        kind: p.source(
            NexmarkSource(kind, num_events, config=config, block_epochs=block_epochs), name=kind
        )
        for kind in query.INPUTS
    }
    query.query(**inputs).sink(TransactionalFileSink(str(out), compression=compression))
    p.checkpointing(interval_ms=interval_ms, storage=base / "cp")
    p.state_backend(state_backend)
    p.restart_strategy(NoRestart())  # a failure is a finding here, not something to ride out
    result = p.run(spark, timeout_s=timeout_s, coordinator_address=coordinator_address)
    return StreamingRun(result, out)


@contextlib.contextmanager
def _batch_settings(spark: Any) -> Iterator[None]:
    """UTC, and no broadcast joins: Spark underestimates the generated views (a range mapped
    in Arrow), so it would broadcast a side of hundreds of MB (an auction view at 14 M events
    filled the driver's heap); a sort-merge join is sized by the data."""
    settings = {"spark.sql.session.timeZone": "UTC", "spark.sql.autoBroadcastJoinThreshold": "-1"}
    before = {k: spark.conf.get(k) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            spark.conf.set(k, v)


_SPARK_TYPES = {pa.int64(): "long", pa.string(): "string"}


def events_dataframe(spark: Any, config: NexmarkConfig, kind: str, num_events: int) -> Any:
    """The events of ``kind`` among the first ``num_events`` as a Spark DataFrame, generated
    on the executors by the same vectorised model (chunks of ``CHUNK`` records, ``mapInArrow``),
    so that no event crosses from this process into the JVM."""
    count = kind_count(config, kind, num_events)
    chunks = max(1, -(-count // CHUNK))
    schema = SCHEMAS[kind]
    ddl = ", ".join(f"`{f.name}` {_SPARK_TYPES[f.type]}" for f in schema)

    def generate_chunks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for chunk in b.column(0).to_pylist():
                lo, hi = chunk * CHUNK, min(count, (chunk + 1) * CHUNK)
                yield generate(config, kind, np.arange(lo, hi, dtype=np.int64))

    partitions = min(chunks, spark.sparkContext.defaultParallelism)
    return spark.range(0, chunks, numPartitions=partitions).mapInArrow(generate_chunks, ddl)


CHUNK = 1 << 16


def run_batch(spark: Any, query: ModuleType, num_events: int, config: NexmarkConfig) -> pa.Table:
    """``query.SPARK_SQL`` over the first ``num_events`` events (views ``person``, ``auction``,
    ``bid`` with TIMESTAMP ``dateTime``), in UTC."""
    with _batch_settings(spark):
        _views(spark, query, num_events, config)
        table: pa.Table = spark.sql(query.SPARK_SQL).toArrow()
    return table


def _views(spark: Any, query: ModuleType, num_events: int, config: NexmarkConfig) -> None:
    for kind in query.INPUTS:
        raw = events_dataframe(spark, config, kind, num_events)
        raw.createOrReplaceTempView(f"nexmark_{kind}_raw")
        spark.sql(
            f"CREATE OR REPLACE TEMP VIEW {kind} AS "
            f"SELECT {VIEW_COLUMNS[kind]} FROM nexmark_{kind}_raw"
        )


def final_result(query: ModuleType, output: pa.Table) -> pa.Table:
    """What a streaming output says in the end: the rows themselves (an append-only result),
    or per ``RESULT_KEY`` the rows of the highest ``VERSION`` (an updating result)."""
    key = getattr(query, "RESULT_KEY", None)
    version = getattr(query, "VERSION", None)
    if key is None or version is None or output.num_rows == 0:
        return output
    latest = output.group_by(list(key), use_threads=False).aggregate([(version, "max")])
    joined = output.join(latest, list(key), join_type="inner", use_threads=False)
    return joined.filter(pc.equal(joined[version], joined[f"{version}_max"])).drop_columns(
        [f"{version}_max"]
    )


def _rows(table: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    rows = [tuple(r[c] for c in columns) for r in table.select(columns).to_pylist()]
    return sorted(rows, key=lambda r: tuple((v is None, v) for v in r))


@dataclass
class Comparison:
    matches: bool
    streaming_rows: int
    batch_rows: int
    detail: str


def compare(query: ModuleType, streaming: pa.Table, batch: pa.Table) -> Comparison:
    """The final streaming result against the batch one, as multisets of rows over
    ``query.COMPARE`` (default: the batch result's columns)."""
    final = final_result(query, streaming)
    columns = list(getattr(query, "COMPARE", None) or batch.column_names)
    missing = [c for c in columns if c not in final.column_names]
    if missing and final.num_rows:
        return Comparison(False, final.num_rows, batch.num_rows, f"missing columns {missing}")
    a = _rows(final, columns) if final.num_rows else []
    b = _rows(batch, columns)
    if a == b:
        return Comparison(True, len(a), len(b), "")
    sa, sb = set(a), set(b)
    detail = (
        f"streaming {len(a)} rows, batch {len(b)}; only streaming e.g. "
        f"{sorted(sa - sb, key=repr)[:3]}, only batch e.g. {sorted(sb - sa, key=repr)[:3]}"
    )
    return Comparison(False, len(a), len(b), detail[:2000])


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_decimal(t) or pa.types.is_floating(t)


def fingerprint_output(query: ModuleType, run: StreamingRun) -> dict[str, Any]:
    """A checksum of the final streaming result, read one committed file at a time: the row
    count and, per column, the sum, minimum and maximum (numbers; decimals and floating-point
    numbers in thousandths) or the total length, minimum and maximum (strings)."""
    if getattr(query, "RESULT_KEY", None) is not None:
        return _fingerprint_tables(query, [final_result(query, run.output)])
    return _fingerprint_tables(query, _committed_tables(run.directory))


def _committed_tables(directory: Path) -> Iterator[pa.Table]:
    for path in committed_files(directory):
        with open_committed(path) as f:
            yield pa.ipc.open_file(f).read_all()


def _fingerprint_tables(query: ModuleType, tables: Iterable[pa.Table]) -> dict[str, Any]:
    acc: dict[str, Any] = {"rows": 0}
    for table in tables:
        acc["rows"] += table.num_rows
        for name in table.column_names:
            column = table[name]
            if _is_number(column.type):
                if pa.types.is_decimal(column.type):
                    wide = column.cast(pa.decimal128(30, column.type.scale))
                    column = pc.multiply(wide, pa.scalar(Decimal(1000), pa.decimal128(4, 0)))
                    column = column.cast(pa.int64())
                if pa.types.is_floating(column.type):  # thousandths, rounded half up (Spark's)
                    x = np.floor(column.to_numpy() * 1000 + 0.5).astype(np.int64)
                else:
                    x = column.to_numpy().astype(np.int64)
                total = int((x >> 32).sum()) * (1 << 32) + int((x & 0xFFFFFFFF).sum())
                values = (total, int(x.min()), int(x.max())) if len(x) else (0, None, None)
            else:
                lengths = pc.sum(pc.utf8_length(column)).as_py() or 0
                bounds = pc.min_max(column).as_py()
                values = (lengths, bounds["min"], bounds["max"])
            old = acc.get(name)
            if old is None or old[1] is None:
                acc[name] = values
            elif values[1] is not None:
                acc[name] = (old[0] + values[0], min(old[1], values[1]), max(old[2], values[2]))
    return acc


def fingerprint_batch(
    spark: Any, query: ModuleType, num_events: int, config: NexmarkConfig
) -> dict[str, Any]:
    """The checksum of :func:`fingerprint_output` of ``query.SPARK_SQL``, computed by Spark
    (no result row leaves the JVM)."""
    with _batch_settings(spark):
        _views(spark, query, num_events, config)
        result = spark.sql(query.SPARK_SQL)
        exprs = ["count(*) AS rows"]
        for field in result.schema.fields:
            c, kind = f"`{field.name}`", field.dataType.typeName()
            if kind == "decimal":
                value = f"CAST({c} * 1000 AS BIGINT)"
            elif kind in ("double", "float"):
                value = f"CAST(round({c} * 1000) AS BIGINT)"
            elif kind in ("long", "integer"):
                value = c
            else:
                exprs.append(f"sum(length({c})), min({c}), max({c})")
                continue
            exprs.append(f"sum(CAST({value} AS DECIMAL(38, 0))), min({value}), max({value})")
        result.createOrReplaceTempView("nexmark_result")
        row = spark.sql(f"SELECT {', '.join(exprs)} FROM nexmark_result").collect()[0]
    values = list(row)
    acc: dict[str, Any] = {"rows": int(values[0])}
    for i, field in enumerate(result.schema.fields):
        total, low, high = values[1 + 3 * i : 4 + 3 * i]
        acc[field.name] = (int(total or 0), low, high)
    return acc


def compare_fingerprints(
    query: ModuleType, streaming: dict[str, Any], batch: dict[str, Any]
) -> Comparison:
    """Equal over the row count and ``query.COMPARE`` (default: the batch result's columns),
    as :func:`compare`: a streaming result may carry more (e.g. an updating result's
    version), and a query whose SQL picks either of tied rows compares what ties decide."""
    columns = ["rows", *(getattr(query, "COMPARE", None) or [k for k in batch if k != "rows"])]
    batch = {k: batch.get(k) for k in columns}
    same = {k: streaming.get(k) for k in columns} == batch
    detail = "" if same else f"streaming {streaming} != batch {batch}"[:2000]
    return Comparison(same, int(streaming["rows"]), int(batch["rows"]), detail)
