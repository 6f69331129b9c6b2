"""The pipeline builder: a PySpark user's way to write a Snapflow job.

::

    p = Pipeline("bids", parallelism=2, max_parallelism=128)
    (p.source(GeneratorSource(total_records=1_000_000), name="bids")
       .filter(lambda row: row["value"] > 10)        # chained into the source's vertex
       .key_by("key")                                # a new vertex behind a HASH edge
       .count()                                      # a keyed running count
       .sink(TransactionalFileSink("/data/out")))    # chained: exactly-once Arrow files
    p.checkpointing(interval_ms=1000, mode="aligned")
    p.restart_strategy(FixedDelay(attempts=3, delay_s=1))
    result = p.run(spark)                            # blocks; a JobResult

Translation to a ``snapflow.v1.JobGraph`` (:meth:`Pipeline.job_graph`):

* ``source()`` starts a *source vertex*; ``map``/``filter``/``flat_map`` (row functions over
  ``dict`` rows), ``map_batches``/``filter_batches``/``flat_map_batches`` (functions over
  ``pyarrow.RecordBatch``), ``transform`` (any :class:`snapflow.worker.runtime.operator.Operator`) and ``sink``
  are chained into the current vertex (Flink's operator chaining: FORWARD, same task).
* ``key_by(field)`` starts a new vertex behind a HASH edge on ``field`` (by key group); the
  :class:`KeyedStream` it returns offers the keyed operations (``count``, ``reduce``,
  ``window``, ``process``, ``aggregate``), which are the head of that vertex.
  ``rebalance()`` starts a new vertex behind a round-robin edge.
* Vertex and operator ids are derived from the program's structure: the creation order of
  vertices, source names, key fields and the position and kind of each chained operator
  (Flink's ``uid``, implicit). The same program gives the same ids, so restoring a savepoint
  into it, at another parallelism too, maps every operator's state back to its operator;
  renaming a source or reordering operators changes them (restore then needs
  ``allow_non_restored_state=True`` and loses that state).
* Operators are shipped cloudpickled (``pyspark.cloudpickle``). Functions defined in a module
  the executors cannot import must be pickled by value:
  ``cloudpickle.register_pickle_by_value(module)`` (functions of ``__main__`` are already).

A stream is consumed once: after ``s.map(f)``, ``s`` itself cannot be used again (branching
inside a chain is not supported); several ``key_by``/``rebalance`` edges may leave the same
stream, though (fan-out to several vertices).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark import cloudpickle

from snapflow import limits, wire
from snapflow.checkpoint_config import CheckpointConfig, parse_checkpoint_mode
from snapflow.checkpointing import CheckpointMode
from snapflow.errors import ConfigError, InvalidArgumentError, InvalidFieldError
from snapflow.jobgraph import PartitionerKind
from snapflow.spark_bridge.driver import JobHandle, run, submit
from snapflow.spark_bridge.restart import DEFAULT_RESTART_STRATEGY, RestartStrategy
from snapflow.spark_bridge.run_options import JobResult
from snapflow.spark_bridge.submission import default_parallelism
from snapflow.spark_bridge.submission import execute as execute_pipeline
from snapflow.state_backend_options import StateBackendOptions, parse_state_backend
from snapflow.storage_location import check_storage_location
from snapflow.v1 import common_pb2 as pb
from snapflow.worker.api.functions import (
    AggregateFunction,
    KeyedBatchFunction,
    KeyedProcessFunction,
)
from snapflow.worker.api.keyed_operators import (
    Aggregate,
    KeyedBatchProcess,
    KeyedCount,
    KeyedProcess,
    KeyedReduce,
    RowsFn,
    TimerFn,
    keyed_process_function,
)
from snapflow.worker.api.operators import (
    Filter,
    FilterBatches,
    FlatMap,
    FlatMapBatches,
    Map,
    MapBatches,
)
from snapflow.worker.api.pandas_batches import from_pandas, to_pandas
from snapflow.worker.api.windows import WindowAggregate, WindowAssigner
from snapflow.worker.runtime.operator import Operator, SourceOperator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["KeyedStream", "Pipeline", "Stream"]

DEFAULT_INTERVAL_MS = 1000
"""A pipeline checkpoints every second unless ``checkpointing()`` says otherwise (a job
submitted through the API without an interval has none)."""


def _check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise InvalidArgumentError(f"{name} must be {bound}, got {value}")
    return value


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgumentError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _check_fn(what: str, fn: object) -> None:
    if not callable(fn):
        raise InvalidArgumentError(f"{what} needs a callable, got {fn!r:.100}")


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "op"


# ---------------------------------------------------------------------------------------------
# Checkpoint settings
# ---------------------------------------------------------------------------------------------


def _storage_uri(storage: object) -> str:
    """A user's checkpoint storage as the job's config carries it: a relative path made
    absolute here (against the driver's working directory), a URI checked and normalised (a
    ``file://`` URI to its path, ``s3://`` without ``.``/``..`` segments)."""
    if isinstance(storage, os.PathLike):
        storage = os.fspath(storage)
    if not isinstance(storage, str):
        raise InvalidFieldError("storage", f"storage must be a path or a URI, got {storage!r:.80}")
    if storage and "://" not in storage:
        return os.path.abspath(storage)
    if storage:
        try:
            return check_storage_location(storage, what="storage")
        except ConfigError as e:
            raise InvalidFieldError("storage", str(e)) from None
    return storage


# ---------------------------------------------------------------------------------------------
# The graph under construction
# ---------------------------------------------------------------------------------------------


@dataclass
class _Op:
    operator_id: str
    name: str
    kind: str
    operator: Operator


@dataclass
class _Vertex:
    vertex_id: str
    label: str
    parallelism: int
    is_source: bool
    key_field: str | None = None
    operators: list[_Op] = field(default_factory=list)
    out_edges: int = 0
    sunk: bool = False

    def describe(self) -> str:
        return f"vertex {self.vertex_id!r}"


@dataclass(frozen=True)
class _Edge:
    source: str
    target: str
    partitioner: PartitionerKind
    key_field: str = ""


class Stream:
    """The output of the last operator of a vertex's chain. Chain more operators onto it,
    start a new vertex behind an edge (``key_by``, ``rebalance``), or end it with ``sink``."""

    def __init__(self, pipeline: Pipeline, vertex: _Vertex, position: int) -> None:
        self._pipeline = pipeline
        self._vertex = vertex
        self._position = position

    def __repr__(self) -> str:
        ops = " -> ".join(o.name for o in self._vertex.operators[: self._position])
        return f"Stream({self._vertex.vertex_id}: {ops})"

    @property
    def parallelism(self) -> int:
        return self._vertex.parallelism

    # --- chaining -------------------------------------------------------------------------

    def _check_open(self, what: str) -> None:
        v = self._vertex
        if v.sunk:
            raise InvalidArgumentError(f"{what}: {v.describe()} already ends in a sink")
        if self._position != len(v.operators):
            raise InvalidArgumentError(
                f"{what}: this stream was already consumed by "
                f"{v.operators[self._position].name!r}; a stream is consumed once (branching "
                f"inside a chain is not supported: use key_by() or rebalance() to fan out)"
            )

    def _chain(self, operator: Operator, kind: str, name: str | None) -> Stream:
        self._check_open(kind)
        if v_edges := self._vertex.out_edges:
            raise InvalidArgumentError(
                f"{kind}: {self._vertex.describe()} already feeds {v_edges} edge(s); operators "
                f"cannot be chained after key_by()/rebalance() left it"
            )
        label = _check_name("name", name) if name is not None else kind
        v = self._vertex
        index = len(v.operators)
        v.operators.append(_Op(f"{v.vertex_id}.{index}-{_slug(kind)}", label, kind, operator))
        return Stream(self._pipeline, v, index + 1)

    def map(
        self,
        fn: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
    ) -> Stream:
        """``fn(row: dict) -> dict`` for every row."""
        _check_fn("map", fn)
        return self._chain(Map(fn, output_schema), "map", name)

    def filter(self, fn: Callable[[dict[str, Any]], Any], *, name: str | None = None) -> Stream:
        """Keep the rows for which ``fn(row: dict)`` is truthy."""
        _check_fn("filter", fn)
        return self._chain(Filter(fn), "filter", name)

    def flat_map(
        self,
        fn: Callable[[dict[str, Any]], Iterable[dict[str, Any]] | None],
        *,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
    ) -> Stream:
        """``fn(row: dict) -> iterable of dicts`` (None: nothing)."""
        _check_fn("flat_map", fn)
        return self._chain(FlatMap(fn, output_schema), "flat_map", name)

    def map_batches(
        self, fn: Callable[[pa.RecordBatch], pa.RecordBatch], *, name: str | None = None
    ) -> Stream:
        """``fn(batch: pyarrow.RecordBatch) -> RecordBatch`` (vectorised; a Table is accepted)."""
        _check_fn("map_batches", fn)
        return self._chain(MapBatches(fn), "map_batches", name)

    def filter_batches(
        self, fn: Callable[[pa.RecordBatch], Any], *, name: str | None = None
    ) -> Stream:
        """Keep the rows where ``fn(batch)`` (a boolean array) is true."""
        _check_fn("filter_batches", fn)
        return self._chain(FilterBatches(fn), "filter_batches", name)

    def flat_map_batches(
        self,
        fn: Callable[[pa.RecordBatch], Iterable[pa.RecordBatch] | None],
        *,
        name: str | None = None,
    ) -> Stream:
        """``fn(batch) -> iterable of RecordBatch``."""
        _check_fn("flat_map_batches", fn)
        return self._chain(FlatMapBatches(fn), "flat_map_batches", name)

    def map_pandas(
        self,
        fn: Callable[[Any], Any],
        *,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
    ) -> Stream:
        """``fn(df: pandas.DataFrame) -> DataFrame`` per batch (needs pandas, an optional
        extra: ``pip install 'snapflow[pandas]'``). ``output_schema`` fixes the output types
        (recommended: pandas infers them per batch)."""
        _check_fn("map_pandas", fn)
        return self._chain(MapBatches(_PandasFn(fn, output_schema)), "map_pandas", name)

    def transform(self, operator: Operator, *, name: str | None = None) -> Stream:
        """Chain any :class:`snapflow.worker.runtime.operator.Operator` (Flink's ``transform``)."""
        if not isinstance(operator, Operator) or isinstance(operator, SourceOperator):
            raise InvalidArgumentError(
                f"transform needs a snapflow.worker.runtime.operator.Operator that is not a source, got {operator!r:.100}"
            )
        return self._chain(operator, type(operator).__name__, name)

    def sink(self, operator: Operator, *, name: str | None = None) -> Pipeline:
        """End the stream in ``operator`` (e.g. :class:`snapflow.worker.connectors.file_sink.TransactionalFileSink`),
        chained into this vertex. Returns the pipeline."""
        if not isinstance(operator, Operator) or isinstance(operator, SourceOperator):
            raise InvalidArgumentError(
                f"sink needs a snapflow.worker.runtime.operator.Operator (e.g. TransactionalFileSink), got {operator!r:.100}"
            )
        self._chain(operator, "sink", name or type(operator).__name__)
        self._vertex.sunk = True
        return self._pipeline

    # --- new vertices ---------------------------------------------------------------------

    def _edge(
        self, what: str, partitioner: PartitionerKind, key_field: str, parallelism: int | None
    ) -> _Vertex:
        self._check_open(what)
        p = self._pipeline
        par = p._check_parallelism(parallelism)
        label = f"{what}({key_field})" if key_field else what
        target = p._new_vertex(label, par, is_source=False, key_field=key_field or None)
        p._edges.append(_Edge(self._vertex.vertex_id, target.vertex_id, partitioner, key_field))
        self._vertex.out_edges += 1
        return target

    def key_by(self, key_field: str, *, parallelism: int | None = None) -> KeyedStream:
        """Partition by ``key_field`` (a HASH edge by key group) into a new, keyed vertex."""
        _check_name("key_by field", key_field)
        target = self._edge("key_by", PartitionerKind.HASH, key_field, parallelism)
        return KeyedStream(self._pipeline, target, key_field)

    def rebalance(self, *, parallelism: int | None = None) -> Stream:
        """Round-robin into a new vertex (e.g. to change the parallelism)."""
        target = self._edge("rebalance", PartitionerKind.REBALANCE, "", parallelism)
        return Stream(self._pipeline, target, 0)


class KeyedStream:
    """A stream partitioned by ``key_field``: the keyed operation to run on it is the head of
    the keyed vertex. Every keyed operation keeps its state per key (in key groups) and
    returns a :class:`Stream` (chain more operators onto it, or sink it)."""

    def __init__(self, pipeline: Pipeline, vertex: _Vertex, key_field: str) -> None:
        self._stream = Stream(pipeline, vertex, 0)
        self.key_field = key_field

    def __repr__(self) -> str:
        return f"KeyedStream({self._stream._vertex.vertex_id}, key_field={self.key_field!r})"

    def count(
        self, *, count_field: str = "count", output: str = "updates", name: str | None = None
    ) -> Stream:
        """A running count per key: rows ``(key, count_field)`` with the new totals of the keys
        each batch updated (``output="final"``: the totals once, at the end of the input)."""
        _check_name("count_field", count_field)
        return self._stream._chain(KeyedCount(self.key_field, output, count_field), "count", name)

    def reduce(
        self,
        value_field: str,
        agg: str | Callable[[Any, Any], Any] = "sum",
        *,
        name: str | None = None,
    ) -> Stream:
        """A running reduction of ``value_field`` per key: ``"sum"``, ``"min"``, ``"max"`` or
        ``fn(a, b) -> c``; rows ``(key, value_field)``."""
        _check_name("value_field", value_field)
        return self._stream._chain(KeyedReduce(self.key_field, value_field, agg), "reduce", name)

    def window(
        self,
        assigner: WindowAssigner,
        time_field: str,
        value_field: str | None = None,
        agg: str = "sum",
        *,
        allowed_lateness_ms: int = 0,
        output_field: str = "value",
        name: str | None = None,
    ) -> Stream:
        """Event-time windows (``TumblingEventTimeWindows``, ``SlidingEventTimeWindows``) with
        ``agg`` (``"sum"``, ``"count"``, ``"min"``, ``"max"``) of ``value_field``; rows
        ``(key, window_start, window_end, output_field)`` when a window fires."""
        _check_name("time_field", time_field)
        op = WindowAggregate(
            self.key_field,
            time_field,
            value_field,
            assigner,
            agg,
            allowed_lateness_ms=allowed_lateness_ms,
            output_field=output_field,
        )
        return self._stream._chain(op, "window", name)

    def process(
        self,
        fn: RowsFn,
        *,
        on_timer: TimerFn | None = None,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
    ) -> Stream:
        """Flink's ``KeyedProcessFunction``: ``fn(key, rows, ctx)`` per distinct key of a batch,
        with keyed state and event-time timers on ``ctx`` (:class:`snapflow.worker.api.functions.KeyedContext`)."""
        _check_fn("process", fn)
        if on_timer is not None:
            _check_fn("process on_timer", on_timer)
        op = KeyedProcess(self.key_field, fn, on_timer, output_schema)
        return self._stream._chain(op, "process", name)

    def process_function(
        self,
        function: KeyedProcessFunction,
        *,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
    ) -> Stream:
        """Record at a time with a :class:`snapflow.worker.api.functions.KeyedProcessFunction`
        (Flink's ``process(KeyedProcessFunction)``): ``process_element(row, ctx)`` per row,
        ``on_timer(timestamp, ctx)`` per fired event-time timer, ``open(ctx)``/``close()``."""
        if not isinstance(function, KeyedProcessFunction):
            raise InvalidArgumentError(
                f"process_function needs a snapflow.worker.api.functions.KeyedProcessFunction, got {function!r:.100}"
            )
        op = keyed_process_function(self.key_field, function, output_schema)
        return self._stream._chain(op, "process", name)

    def process_batches(self, function: KeyedBatchFunction, *, name: str | None = None) -> Stream:
        """Vectorised keyed processing with a :class:`snapflow.worker.api.functions.KeyedBatchFunction`:
        ``process_batch(batch, ctx)`` per input batch with the bulk state API
        (``get_many``/``update_many``), ``on_timers(timers, ctx)`` with the due timers as one batch."""
        if not isinstance(function, KeyedBatchFunction):
            raise InvalidArgumentError(
                f"process_batches needs a snapflow.worker.api.functions.KeyedBatchFunction, got {function!r:.100}"
            )
        return self._stream._chain(
            KeyedBatchProcess(self.key_field, function), "process_batches", name
        )

    def aggregate(
        self,
        function: AggregateFunction,
        *,
        value_field: str | None = None,
        output_field: str = "result",
        result_type: pa.DataType | None = None,
        name: str | None = None,
    ) -> Stream:
        """A running aggregation per key with an :class:`snapflow.worker.api.functions.AggregateFunction`."""
        op = Aggregate(self.key_field, function, value_field, output_field, result_type)
        return self._stream._chain(op, "aggregate", name)


class _PandasFn:
    """A pandas function as a batch function: the conversions at the edge."""

    def __init__(self, fn: Callable[[Any], Any], schema: pa.Schema | None) -> None:
        self.fn = fn
        self.schema = schema

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        out = self.fn(to_pandas(batch))
        return None if out is None else from_pandas(out, self.schema)


# ---------------------------------------------------------------------------------------------
# Pipeline
# ---------------------------------------------------------------------------------------------


class Pipeline:
    """A job under construction: sources, operators, edges, sinks, checkpointing, restarts."""

    def __init__(
        self, name: str, *, parallelism: int | None = None, max_parallelism: int = 128
    ) -> None:
        """``parallelism``: of every vertex that sets none; None: ``snapflow run
        --parallelism`` when the file runs under it, else 1 (the program's value wins over the
        command line's, as an explicit ``env.setParallelism`` does over ``flink run -p``)."""
        self.name = _check_name("pipeline name", name)
        self.max_parallelism = _check_int(
            "max_parallelism", max_parallelism, 1, limits.MAX_PARALLELISM
        )
        if parallelism is None:
            parallelism = default_parallelism() or 1
        self.parallelism = _check_int("parallelism", parallelism, 1, self.max_parallelism)
        self.checkpoint_config = CheckpointConfig(interval_ms=DEFAULT_INTERVAL_MS)
        """The job's checkpointing, as :meth:`checkpointing` and :meth:`state_backend` set it."""
        self.restart: RestartStrategy = DEFAULT_RESTART_STRATEGY
        self._vertices: list[_Vertex] = []
        self._edges: list[_Edge] = []

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, vertices={len(self._vertices)}, parallelism={self.parallelism})"

    def _check_parallelism(self, parallelism: int | None) -> int:
        if parallelism is None:
            return self.parallelism
        return _check_int("parallelism", parallelism, 1, self.max_parallelism)

    def _new_vertex(
        self, label: str, parallelism: int, *, is_source: bool, key_field: str | None
    ) -> _Vertex:
        vertex = _Vertex(
            vertex_id=f"v{len(self._vertices)}-{_slug(label)}",
            label=label,
            parallelism=parallelism,
            is_source=is_source,
            key_field=key_field,
        )
        self._vertices.append(vertex)
        return vertex

    # --- building -------------------------------------------------------------------------

    def source(
        self, source: SourceOperator, *, name: str | None = None, parallelism: int | None = None
    ) -> Stream:
        """A new source vertex reading ``source`` (e.g. :class:`snapflow.worker.connectors.split_sources.GeneratorSource`)."""
        if not isinstance(source, SourceOperator):
            raise InvalidArgumentError(
                f"source needs a snapflow.worker.runtime.operator.SourceOperator (e.g. GeneratorSource), got {source!r:.100}"
            )
        label = _check_name("source name", name) if name is not None else "source"
        vertex = self._new_vertex(
            label, self._check_parallelism(parallelism), is_source=True, key_field=None
        )
        vertex.operators.append(_Op(f"{vertex.vertex_id}.0-source", label, "source", source))
        return Stream(self, vertex, 1)

    def checkpointing(
        self,
        interval_ms: int = DEFAULT_INTERVAL_MS,
        mode: str | CheckpointMode = "aligned",
        *,
        timeout_ms: int = 600_000,
        aligned_checkpoint_timeout_ms: int = 0,
        min_pause_ms: int = 0,
        max_concurrent: int = 1,
        tolerable_failures: int | None = 0,
        retained: int = 1,
        storage: str | os.PathLike[str] = "",
    ) -> Pipeline:
        """The job's checkpointing: a :class:`snapflow.checkpoint_config.CheckpointConfig`,
        whose fields document each setting; the state backend set by :meth:`state_backend`
        is kept. ``interval_ms=0``: no periodic checkpoints (a bounded job still ends with a
        final checkpoint, which commits the sinks; a failure then restarts the job from its
        beginning or its restore point). ``mode``: ``"aligned"``, ``"unaligned"`` or
        ``"at_least_once"``. ``tolerable_failures=None``: unlimited. ``storage``: a path
        (relative ones are made absolute here) or a ``file://`` or ``s3://`` URI every executor
        sees (empty: the coordinator's root). Returns the pipeline."""
        current = self.checkpoint_config
        self.checkpoint_config = CheckpointConfig(
            interval_ms=interval_ms,
            mode=parse_checkpoint_mode(mode),
            timeout_ms=timeout_ms,
            aligned_checkpoint_timeout_ms=aligned_checkpoint_timeout_ms,
            min_pause_ms=min_pause_ms,
            max_concurrent=max_concurrent,
            tolerable_failures=tolerable_failures,
            retained=retained,
            storage_uri=_storage_uri(storage),
            state_backend=current.state_backend,
            state_backend_options=current.state_backend_options,
        )
        return self

    def state_backend(self, kind: str, **tuning: Any) -> Pipeline:
        """The keyed state backend of the job's tasks: ``"heap"`` (the default: Python dicts,
        full snapshots) or ``"rocksdb"`` (RocksDB on the executors' local disk: state larger
        than memory, incremental checkpoints; docs/storage.md). A savepoint of either restores
        into the other. ``tuning``: rocksdb sizing, the fields of
        :class:`snapflow.state_backend_options.StateBackendOptions` (``memory_budget_bytes``,
        ``cache_entries``, ``compaction_style``, ``compaction_trigger``,
        ``max_size_amplification_percent``, ``upload_threads``, ``local_recovery``); they
        travel in the job's config to every task, and those not given keep the worker's
        defaults. Returns the pipeline."""
        name = parse_state_backend(kind)
        choices = StateBackendOptions.field_names()
        unknown = sorted(set(tuning) - set(choices))
        if unknown:
            raise InvalidArgumentError(
                f"state_backend: unknown setting(s) {', '.join(unknown)}; choose from "
                f"{', '.join(choices)}"
            )
        self.checkpoint_config = dataclasses.replace(
            self.checkpoint_config,
            state_backend=name,
            state_backend_options=StateBackendOptions(**tuning),
        )
        return self

    def restart_strategy(self, strategy: RestartStrategy) -> Pipeline:
        """How the driver restarts the job after a failure (default
        ``DEFAULT_RESTART_STRATEGY``: exponential back-off 1 s .. 60 s, multiplier 1.5, no
        limit on the number of restarts)."""
        if not isinstance(strategy, RestartStrategy):
            raise InvalidArgumentError(
                f"restart_strategy needs FixedDelay, ExponentialBackoff or NoRestart, got {strategy!r:.100}"
            )
        self.restart = strategy
        return self

    # --- translation ----------------------------------------------------------------------

    @property
    def slots(self) -> int:
        """Spark tasks (slots) of the barrier stage: the largest vertex parallelism."""
        return max((v.parallelism for v in self._vertices), default=0)

    def validate(self) -> None:
        """Raise InvalidArgumentError unless the pipeline is a runnable job."""
        if not any(v.is_source for v in self._vertices):
            raise InvalidArgumentError(f"pipeline {self.name!r} has no source: call source() first")
        for v in self._vertices:
            if not v.operators:
                what = f"key_by({v.key_field!r})" if v.key_field else v.label + "()"
                follow = (
                    "a keyed operation (count, reduce, window, process, aggregate)"
                    if v.key_field
                    else "an operator or a sink"
                )
                raise InvalidArgumentError(
                    f"{what} in pipeline {self.name!r} is not followed by {follow}"
                )
            if not v.sunk and not v.out_edges:
                last = v.operators[-1].name
                raise InvalidArgumentError(
                    f"the stream ending in {last!r} ({v.describe()}) has no sink: end it with .sink(...)"
                )

    def job_graph(self) -> pb.JobGraph:
        """The ``snapflow.v1.JobGraph`` of this pipeline (operators cloudpickled)."""
        self.validate()
        vertices = []
        for v in self._vertices:
            ops = []
            for o in v.operators:
                try:
                    payload = cloudpickle.dumps(o.operator)
                except Exception as e:
                    raise InvalidArgumentError(
                        f"operator {o.name!r} ({v.describe()}) cannot be pickled: {type(e).__name__}: {e}"
                    ) from e
                ops.append(
                    pb.OperatorSpec(
                        operator_id=o.operator_id, name=o.name, kind=o.kind, payload=payload
                    )
                )
            vertices.append(
                pb.JobVertex(
                    vertex_id=v.vertex_id,
                    name=" -> ".join(o.name for o in v.operators),
                    parallelism=v.parallelism,
                    max_parallelism=self.max_parallelism,
                    operators=ops,
                    is_source=v.is_source,
                )
            )
        edges = [
            pb.JobEdge(
                source_vertex_id=e.source,
                target_vertex_id=e.target,
                partitioner=wire.PARTITIONER_KIND.to_pb(e.partitioner),
                key_field=e.key_field,
            )
            for e in self._edges
        ]
        return pb.JobGraph(name=self.name, vertices=vertices, edges=edges)

    # --- running --------------------------------------------------------------------------

    def run(
        self,
        spark: SparkSession,
        *,
        restore_from: str | os.PathLike[str] | None = None,
        coordinator_address: str | None = None,
        **options: Any,
    ) -> JobResult:
        """Run the job on ``spark`` until it ends; see :func:`snapflow.spark_bridge.driver.run`."""
        return run(
            self,
            spark,
            coordinator_address=coordinator_address,
            restore_from=restore_from,
            **options,
        )

    def execute(self, spark: SparkSession | None = None, **options: Any) -> JobResult:
        """Run the job until it ends, with the options of ``snapflow run`` when the file runs
        under it (coordinator, Spark master, restore path, checkpoint overrides), else on the
        active SparkSession or a local one and an embedded coordinator: the entry point of a
        pipeline file (PyFlink's ``env.execute()``). See :mod:`snapflow.spark_bridge.submission`."""
        return execute_pipeline(self, spark, **options)

    def run_async(
        self,
        spark: SparkSession,
        *,
        restore_from: str | os.PathLike[str] | None = None,
        coordinator_address: str | None = None,
        **options: Any,
    ) -> JobHandle:
        """Submit the job and run it in a background thread; returns its :class:`JobHandle`
        (cancel, stop with a savepoint, wait for the result)."""
        return submit(
            self,
            spark,
            coordinator_address=coordinator_address,
            restore_from=restore_from,
            **options,
        )
