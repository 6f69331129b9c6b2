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

The streams (:mod:`snapflow.spark_bridge.streams`) build the job graph
(:mod:`snapflow.spark_bridge.stream_graph`): the vertices, their operator chains and the edges
between them; :meth:`Pipeline.job_graph` translates it to a ``snapflow.v1.JobGraph``.

* Operators are shipped cloudpickled (``pyspark.cloudpickle``). Functions defined in a module
  the executors cannot import must be pickled by value:
  ``cloudpickle.register_pickle_by_value(module)`` (functions of ``__main__`` are already).
* Renaming a source or reordering operators changes the derived ids (restoring a savepoint
  then needs ``allow_non_restored_state=True`` and loses that state).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from snapflow import limits
from snapflow.checkpoint_config import CheckpointConfig, parse_checkpoint_mode
from snapflow.checkpointing import CheckpointMode
from snapflow.errors import ConfigError, InvalidArgumentError, InvalidFieldError
from snapflow.spark_bridge.driver import JobHandle, run, submit
from snapflow.spark_bridge.restart import DEFAULT_RESTART_STRATEGY, RestartStrategy
from snapflow.spark_bridge.run_options import JobResult
from snapflow.spark_bridge.stream_graph import OpNode, StreamGraph, check_int, check_name
from snapflow.spark_bridge.streams import Stream
from snapflow.spark_bridge.submission import default_parallelism
from snapflow.spark_bridge.submission import execute as execute_pipeline
from snapflow.state_backend_options import StateBackendOptions, parse_state_backend
from snapflow.storage_location import check_storage_location
from snapflow.v1 import common_pb2 as pb
from snapflow.worker.runtime.operator import SourceOperator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Pipeline"]

DEFAULT_INTERVAL_MS = 1000
"""A pipeline checkpoints every second unless ``checkpointing()`` says otherwise (a job
submitted through the API without an interval has none)."""


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
        self.name = check_name("pipeline name", name)
        self.max_parallelism = check_int(
            "max_parallelism", max_parallelism, 1, limits.MAX_PARALLELISM
        )
        if parallelism is None:
            parallelism = default_parallelism() or 1
        self.parallelism = check_int("parallelism", parallelism, 1, self.max_parallelism)
        self.checkpoint_config = CheckpointConfig(interval_ms=DEFAULT_INTERVAL_MS)
        """The job's checkpointing, as :meth:`checkpointing` and :meth:`state_backend` set it."""
        self.restart: RestartStrategy = DEFAULT_RESTART_STRATEGY
        self.graph = StreamGraph(self.name, self.parallelism, self.max_parallelism)
        """The job graph the streams build."""

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, vertices={len(self.graph.vertices)}, parallelism={self.parallelism})"

    # --- building -------------------------------------------------------------------------

    def source(
        self, source: SourceOperator, *, name: str | None = None, parallelism: int | None = None
    ) -> Stream:
        """A new source vertex reading ``source`` (e.g. :class:`snapflow.worker.connectors.split_sources.GeneratorSource`)."""
        if not isinstance(source, SourceOperator):
            raise InvalidArgumentError(
                f"source needs a snapflow.worker.runtime.operator.SourceOperator (e.g. GeneratorSource), got {source!r:.100}"
            )
        label = check_name("source name", name) if name is not None else "source"
        vertex = self.graph.new_vertex(
            label, self.graph.check_parallelism(parallelism), is_source=True, key_field=None
        )
        vertex.operators.append(OpNode(f"{vertex.vertex_id}.0-source", label, "source", source))
        schema = getattr(source, "output_schema", None)
        return Stream(self.graph, vertex, 1, schema if isinstance(schema, pa.Schema) else None)

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
        inline_state_threshold_bytes: int = limits.DEFAULT_INLINE_STATE_THRESHOLD_BYTES,
    ) -> Pipeline:
        """The job's checkpointing: a :class:`snapflow.checkpoint_config.CheckpointConfig`,
        whose fields document each setting; the state backend set by :meth:`state_backend`
        is kept. ``interval_ms=0``: no periodic checkpoints (a bounded job still ends with a
        final checkpoint, which commits the sinks; a failure then restarts the job from its
        beginning or its restore point). ``mode``: ``"aligned"``, ``"unaligned"`` or
        ``"at_least_once"``. ``tolerable_failures=None``: unlimited. ``storage``: a path
        (relative ones are made absolute here) or a ``file://`` or ``s3://`` URI every executor
        sees (empty: the coordinator's root). ``inline_state_threshold_bytes``: a subtask's
        snapshot up to this size goes inside the checkpoint's metadata instead of files (Flink's
        ``state.storage.fs.memory-threshold``; 0: always files). Returns the pipeline."""
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
            inline_state_threshold_bytes=inline_state_threshold_bytes,
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
        return max((v.parallelism for v in self.graph.vertices), default=0)

    def validate(self) -> None:
        """Raise InvalidArgumentError unless the pipeline is a runnable job: its graph, and
        every operator's :meth:`~snapflow.worker.runtime.operator.Operator.check_job` of the
        job's checkpointing (e.g. an exactly-once Kafka sink's transaction timeout)."""
        self.graph.validate()
        for vertex in self.graph.vertices:
            for node in vertex.operators:
                node.operator.check_job(self.checkpoint_config)

    def job_graph(self) -> pb.JobGraph:
        """The ``snapflow.v1.JobGraph`` of this pipeline (operators cloudpickled), once
        :meth:`validate` accepts it: the driver submits nothing else."""
        self.validate()
        return self.graph.to_pb()

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
