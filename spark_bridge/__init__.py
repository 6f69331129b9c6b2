"""The PySpark face of Snapflow: build a pipeline, run it as one barrier-mode Spark stage.

Users import these names from :mod:`snapflow` (the public API, with the sources, sinks and
functions), not from here::

    from snapflow import FixedDelay, GeneratorSource, Pipeline, TransactionalFileSink

    p = Pipeline("counts", parallelism=2)
    (p.source(GeneratorSource(total_records=100_000), name="events")
       .key_by("key").count()
       .sink(TransactionalFileSink("/tmp/out")))
    p.checkpointing(interval_ms=500).restart_strategy(FixedDelay(attempts=3, delay_s=1))
    result = p.run(spark)

See :mod:`snapflow.spark_bridge.pipeline` (the builder), :mod:`snapflow.spark_bridge.streams` (the
stream types), :mod:`snapflow.spark_bridge.driver` (the driver loop),
:mod:`snapflow.spark_bridge.run_options` (a run's options and result) and
:mod:`spark_bridge.restart` (restart strategies, the driver's decisions).
"""

from snapflow.spark_bridge.driver import JobHandle, run, submit
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
    ConnectedStreams,
    KeyedConnectedStreams,
    KeyedStream,
    Stream,
)
from snapflow.spark_bridge.submission import execute, spark_session

__all__ = [
    "BroadcastStream",
    "ConnectedStreams",
    "ExponentialBackoff",
    "FixedDelay",
    "JobFailedError",
    "JobHandle",
    "JobResult",
    "JobStatus",
    "KeyedConnectedStreams",
    "KeyedStream",
    "NoRestart",
    "Pipeline",
    "RestartStrategy",
    "Stream",
    "execute",
    "run",
    "spark_session",
    "submit",
]
