"""Snapflow's public API: everything a pipeline file imports, from one place.

::

    from snapflow import FileSource, Pipeline, TransactionalFileSink

    p = Pipeline("word-count")
    p.source(FileSource("in", "csv", schema=LINES), name="lines").sink(TransactionalFileSink("out"))
    p.execute()

The names live in the layers above this foundation package (the Spark bridge, the user API, the
connectors), which move as the code grows; this table is the stable surface. Each name is
imported from its home module on first access (PEP 562), so ``import snapflow`` and the
foundation modules stay light: the coordinator and the CLI import no Spark, Arrow or state
backend through this package. Everything else (the runtime, the coordinator, the wire) is
internal and may change.
"""

from __future__ import annotations

import difflib
import importlib
from typing import TYPE_CHECKING, Any

#: Each public name -> its home module: the one table. A new name goes here, in ``__all__`` and
#: in the ``TYPE_CHECKING`` imports below (which mypy and IDEs read);
#: ``tests/project/test_public_api.py`` checks that the three agree, and
#: ``tests/project/test_layering.py`` that this package names upper layers nowhere else.
_PUBLIC: dict[str, str] = {
    # -- building and running a pipeline
    "Pipeline": "snapflow.spark_bridge.pipeline",
    "Stream": "snapflow.spark_bridge.streams",
    "KeyedStream": "snapflow.spark_bridge.streams",
    "spark_session": "snapflow.spark_bridge.submission",
    "JobHandle": "snapflow.spark_bridge.driver",
    "JobResult": "snapflow.spark_bridge.run_options",
    "JobStatus": "snapflow.spark_bridge.restart",
    # -- restart strategies
    "RestartStrategy": "snapflow.spark_bridge.restart",
    "NoRestart": "snapflow.spark_bridge.restart",
    "FixedDelay": "snapflow.spark_bridge.restart",
    "ExponentialBackoff": "snapflow.spark_bridge.restart",
    # -- checkpoint settings (what ``Pipeline.checkpointing`` and ``state_backend`` build)
    "CheckpointConfig": "snapflow.checkpoint_config",
    "CheckpointMode": "snapflow.checkpointing",
    "StateBackendOptions": "snapflow.state_backend_options",
    # -- sources
    "SplitSource": "snapflow.worker.connectors.split_sources",
    "GeneratorSource": "snapflow.worker.connectors.split_sources",
    "SequenceSource": "snapflow.worker.connectors.split_sources",
    "FileSource": "snapflow.worker.connectors.file_sources",
    "DataFrameSource": "snapflow.worker.connectors.file_sources",
    "source_from_dataframe": "snapflow.worker.connectors.file_sources",
    "SocketTextSource": "snapflow.worker.connectors.socket_source",
    "KafkaSource": "snapflow.worker.connectors.kafka_source",
    "KafkaStart": "snapflow.worker.connectors.kafka_positions",
    "KafkaStop": "snapflow.worker.connectors.kafka_positions",
    "KafkaValueFormat": "snapflow.worker.connectors.kafka_records",
    "NexmarkSource": "snapflow.worker.connectors.nexmark_source",
    "NexmarkConfig": "snapflow.worker.connectors.nexmark_model",
    "nexmark_events": "snapflow.worker.connectors.nexmark_model",
    "nexmark_pipeline": "snapflow.spark_bridge.nexmark_jobs",
    "nexmark_main": "snapflow.spark_bridge.nexmark_jobs",
    # -- sinks, and reading what they committed
    "TwoPhaseCommitSink": "snapflow.worker.connectors.two_phase_commit",
    "TransactionalFileSink": "snapflow.worker.connectors.file_sink",
    "read_committed": "snapflow.worker.connectors.file_sink",
    "TransactionalParquetSink": "snapflow.worker.connectors.parquet_sink",
    "read_committed_parquet": "snapflow.worker.connectors.parquet_sink",
    "RedisSink": "snapflow.worker.connectors.redis_sink",
    "KafkaSink": "snapflow.worker.connectors.kafka_sink",
    "KafkaSerializer": "snapflow.worker.connectors.kafka_sink_encoding",
    "KafkaPartitioner": "snapflow.worker.connectors.kafka_sink_settings",
    "DeliveryGuarantee": "snapflow.worker.connectors.kafka_sink_settings",
    "PrintSink": "snapflow.worker.connectors.debug_sinks",
    "CollectSink": "snapflow.worker.connectors.debug_sinks",
    # -- user functions and their contexts
    "RichFunction": "snapflow.worker.api.functions",
    "RuntimeContext": "snapflow.worker.api.functions",
    "AggregateFunction": "snapflow.worker.api.functions",
    "KeyedProcessFunction": "snapflow.worker.api.functions",
    "KeyedContext": "snapflow.worker.api.functions",
    "KeyedBatchFunction": "snapflow.worker.api.functions",
    "KeyedBatchContext": "snapflow.worker.api.functions",
    "to_pandas": "snapflow.worker.api.pandas_batches",
    "from_pandas": "snapflow.worker.api.pandas_batches",
    # -- two inputs: co-process functions (connect) and the broadcast state pattern
    "CoProcessFunction": "snapflow.worker.api.co_functions",
    "CoContext": "snapflow.worker.api.co_functions",
    "KeyedCoProcessFunction": "snapflow.worker.api.co_functions",
    "KeyedCoContext": "snapflow.worker.api.co_functions",
    "CoBatchFunction": "snapflow.worker.api.co_functions",
    "CoBatchContext": "snapflow.worker.api.co_functions",
    "KeyedCoBatchFunction": "snapflow.worker.api.co_functions",
    "KeyedCoBatchContext": "snapflow.worker.api.co_functions",
    "BroadcastProcessFunction": "snapflow.worker.api.broadcast_functions",
    "ReadOnlyBroadcastContext": "snapflow.worker.api.broadcast_functions",
    "BroadcastContext": "snapflow.worker.api.broadcast_functions",
    "KeyedBroadcastProcessFunction": "snapflow.worker.api.broadcast_functions",
    "ReadOnlyKeyedBroadcastContext": "snapflow.worker.api.broadcast_functions",
    "KeyedBroadcastContext": "snapflow.worker.api.broadcast_functions",
    "MapStateDescriptor": "snapflow.worker.api.broadcast_functions",
    # -- joins of two keyed streams
    "IntervalJoin": "snapflow.spark_bridge.streams",
    "IntervalJoined": "snapflow.spark_bridge.streams",
    "ProcessJoinFunction": "snapflow.worker.api.join_functions",
    "JoinContext": "snapflow.worker.api.join_functions",
    "BatchJoinFunction": "snapflow.worker.api.join_functions",
    "BatchJoinContext": "snapflow.worker.api.join_functions",
    # -- windows: assigners, window functions, the windowed and joined streams
    "WindowAssigner": "snapflow.worker.api.window_assigners",
    "TimeWindow": "snapflow.worker.api.window_assigners",
    "TumblingEventTimeWindows": "snapflow.worker.api.window_assigners",
    "SlidingEventTimeWindows": "snapflow.worker.api.window_assigners",
    "EventTimeSessionWindows": "snapflow.worker.api.window_assigners",
    "TumblingProcessingTimeWindows": "snapflow.worker.api.window_assigners",
    "SlidingProcessingTimeWindows": "snapflow.worker.api.window_assigners",
    "ProcessingTimeSessionWindows": "snapflow.worker.api.window_assigners",
    "ProcessWindowFunction": "snapflow.worker.api.window_functions",
    "CoGroupFunction": "snapflow.worker.api.window_functions",
    "JoinFunction": "snapflow.worker.api.window_functions",
    "WindowContext": "snapflow.worker.api.window_functions",
    "WindowedStream": "snapflow.spark_bridge.streams",
    "JoinedStreams": "snapflow.spark_bridge.streams",
    "CoGroupedStreams": "snapflow.spark_bridge.streams",
    # -- custom operators
    "Operator": "snapflow.worker.runtime.operator",
    "SourceOperator": "snapflow.worker.runtime.operator",
    "OperatorContext": "snapflow.worker.runtime.operator",
    "ConnectedStreams": "snapflow.spark_bridge.streams",
    "KeyedConnectedStreams": "snapflow.spark_bridge.streams",
    "BroadcastStream": "snapflow.spark_bridge.streams",
    "OutputTag": "snapflow.worker.runtime.operator",
    # -- errors users catch
    "SnapflowError": "snapflow.errors",
    "InvalidArgumentError": "snapflow.errors",
    "FailedPreconditionError": "snapflow.errors",
    "JobFailedError": "snapflow.spark_bridge.run_options",
}

#: The same names, spelled out for tools that read ``__all__`` without running it (pyright,
#: IDEs, ``from snapflow import *``).
__all__ = [
    "AggregateFunction",
    "BatchJoinContext",
    "BatchJoinFunction",
    "BroadcastContext",
    "BroadcastProcessFunction",
    "BroadcastStream",
    "CheckpointConfig",
    "CheckpointMode",
    "CoBatchContext",
    "CoBatchFunction",
    "CoContext",
    "CoGroupFunction",
    "CoGroupedStreams",
    "CoProcessFunction",
    "CollectSink",
    "ConnectedStreams",
    "DataFrameSource",
    "DeliveryGuarantee",
    "EventTimeSessionWindows",
    "ExponentialBackoff",
    "FailedPreconditionError",
    "FileSource",
    "FixedDelay",
    "GeneratorSource",
    "IntervalJoin",
    "IntervalJoined",
    "InvalidArgumentError",
    "JobFailedError",
    "JobHandle",
    "JobResult",
    "JobStatus",
    "JoinContext",
    "JoinFunction",
    "JoinedStreams",
    "KafkaPartitioner",
    "KafkaSerializer",
    "KafkaSink",
    "KafkaSource",
    "KafkaStart",
    "KafkaStop",
    "KafkaValueFormat",
    "KeyedBatchContext",
    "KeyedBatchFunction",
    "KeyedBroadcastContext",
    "KeyedBroadcastProcessFunction",
    "KeyedCoBatchContext",
    "KeyedCoBatchFunction",
    "KeyedCoContext",
    "KeyedCoProcessFunction",
    "KeyedConnectedStreams",
    "KeyedContext",
    "KeyedProcessFunction",
    "KeyedStream",
    "MapStateDescriptor",
    "NexmarkConfig",
    "NexmarkSource",
    "NoRestart",
    "Operator",
    "OperatorContext",
    "OutputTag",
    "Pipeline",
    "PrintSink",
    "ProcessJoinFunction",
    "ProcessWindowFunction",
    "ProcessingTimeSessionWindows",
    "ReadOnlyBroadcastContext",
    "ReadOnlyKeyedBroadcastContext",
    "RedisSink",
    "RestartStrategy",
    "RichFunction",
    "RuntimeContext",
    "SequenceSource",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "SnapflowError",
    "SocketTextSource",
    "SourceOperator",
    "SplitSource",
    "StateBackendOptions",
    "Stream",
    "TimeWindow",
    "TransactionalFileSink",
    "TransactionalParquetSink",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "TwoPhaseCommitSink",
    "WindowAssigner",
    "WindowContext",
    "WindowedStream",
    "from_pandas",
    "nexmark_events",
    "nexmark_main",
    "nexmark_pipeline",
    "read_committed",
    "read_committed_parquet",
    "source_from_dataframe",
    "spark_session",
    "to_pandas",
]

if TYPE_CHECKING:
    from snapflow.checkpoint_config import CheckpointConfig
    from snapflow.checkpointing import CheckpointMode
    from snapflow.errors import FailedPreconditionError, InvalidArgumentError, SnapflowError
    from snapflow.spark_bridge.driver import JobHandle
    from snapflow.spark_bridge.nexmark_jobs import nexmark_main, nexmark_pipeline
    from snapflow.spark_bridge.pipeline import Pipeline
    from snapflow.spark_bridge.restart import (
        ExponentialBackoff,
        FixedDelay,
        JobStatus,
        NoRestart,
        RestartStrategy,
    )
    from snapflow.spark_bridge.run_options import JobFailedError, JobResult
    from snapflow.spark_bridge.streams import (
        BroadcastStream,
        CoGroupedStreams,
        ConnectedStreams,
        IntervalJoin,
        IntervalJoined,
        JoinedStreams,
        KeyedConnectedStreams,
        KeyedStream,
        Stream,
        WindowedStream,
    )
    from snapflow.spark_bridge.submission import spark_session
    from snapflow.state_backend_options import StateBackendOptions
    from snapflow.worker.api.broadcast_functions import (
        BroadcastContext,
        BroadcastProcessFunction,
        KeyedBroadcastContext,
        KeyedBroadcastProcessFunction,
        MapStateDescriptor,
        ReadOnlyBroadcastContext,
        ReadOnlyKeyedBroadcastContext,
    )
    from snapflow.worker.api.co_functions import (
        CoBatchContext,
        CoBatchFunction,
        CoContext,
        CoProcessFunction,
        KeyedCoBatchContext,
        KeyedCoBatchFunction,
        KeyedCoContext,
        KeyedCoProcessFunction,
    )
    from snapflow.worker.api.functions import (
        AggregateFunction,
        KeyedBatchContext,
        KeyedBatchFunction,
        KeyedContext,
        KeyedProcessFunction,
        RichFunction,
        RuntimeContext,
    )
    from snapflow.worker.api.join_functions import (
        BatchJoinContext,
        BatchJoinFunction,
        JoinContext,
        ProcessJoinFunction,
    )
    from snapflow.worker.api.pandas_batches import from_pandas, to_pandas
    from snapflow.worker.api.window_assigners import (
        EventTimeSessionWindows,
        ProcessingTimeSessionWindows,
        SlidingEventTimeWindows,
        SlidingProcessingTimeWindows,
        TimeWindow,
        TumblingEventTimeWindows,
        TumblingProcessingTimeWindows,
        WindowAssigner,
    )
    from snapflow.worker.api.window_functions import (
        CoGroupFunction,
        JoinFunction,
        ProcessWindowFunction,
        WindowContext,
    )
    from snapflow.worker.connectors.debug_sinks import CollectSink, PrintSink
    from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
    from snapflow.worker.connectors.file_sources import (
        DataFrameSource,
        FileSource,
        source_from_dataframe,
    )
    from snapflow.worker.connectors.kafka_positions import KafkaStart, KafkaStop
    from snapflow.worker.connectors.kafka_records import KafkaValueFormat
    from snapflow.worker.connectors.kafka_sink import KafkaSink
    from snapflow.worker.connectors.kafka_sink_encoding import KafkaSerializer
    from snapflow.worker.connectors.kafka_sink_settings import DeliveryGuarantee, KafkaPartitioner
    from snapflow.worker.connectors.kafka_source import KafkaSource
    from snapflow.worker.connectors.nexmark_model import NexmarkConfig, nexmark_events
    from snapflow.worker.connectors.nexmark_source import NexmarkSource
    from snapflow.worker.connectors.parquet_sink import (
        TransactionalParquetSink,
        read_committed_parquet,
    )
    from snapflow.worker.connectors.redis_sink import RedisSink
    from snapflow.worker.connectors.socket_source import SocketTextSource
    from snapflow.worker.connectors.split_sources import (
        GeneratorSource,
        SequenceSource,
        SplitSource,
    )
    from snapflow.worker.connectors.two_phase_commit import TwoPhaseCommitSink
    from snapflow.worker.runtime.operator import (
        Operator,
        OperatorContext,
        OutputTag,
        SourceOperator,
    )


# Hidden from type checkers, which read the names from the imports above: an unknown name
# (a typo) is then their error too, not an ``Any``.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        """Import a public name's home module on first access and cache the name here."""
        home = _PUBLIC.get(name)
        if home is None:
            # Also reached by ``from snapflow import <submodule>`` before the submodule is
            # imported: the import system then imports it, so this must stay an AttributeError.
            close = difflib.get_close_matches(name, _PUBLIC, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise AttributeError(
                f"module 'snapflow' has no attribute {name!r}{hint} (the public names are in "
                f"snapflow.__all__; other modules are internal: import them by their full path)"
            )
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
