"""How a pipeline file picks up the options of ``snapflow run``: the submission context.

A pipeline file builds its :class:`snapflow.spark_bridge.pipeline.Pipeline` and calls
``pipeline.execute()`` (the counterpart of PyFlink's ``env.execute()``)::

    def main() -> None:
        p = Pipeline("word-count")
        ...
        p.execute()

    if __name__ == "__main__":
        main()

Run with ``python PIPELINE.py``, ``execute()`` uses the file's own settings, a SparkSession
already active in the process or else a local one (``local[N]``, ``N`` = the pipeline's task
slots), and an embedded coordinator. Run with ``snapflow run PIPELINE.py``, the CLI runs the
file in its own process (``runpy``, as ``__main__``) inside :func:`submission`, and
``execute()`` applies the command line's options: the coordinator, the Spark master, the
default parallelism, a restore path and checkpoint overrides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from snapflow.checkpoint_config import CheckpointConfig, parse_checkpoint_mode
from snapflow.checkpointing import CheckpointMode
from snapflow.errors import InvalidArgumentError
from snapflow.spark_bridge.driver import run
from snapflow.spark_bridge.run_options import JobDefinition, JobResult

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class Executable(JobDefinition, Protocol):
    """What :func:`execute` needs of a pipeline (:class:`snapflow.spark_bridge.pipeline.Pipeline`
    is one; typed structurally so that the builder can import this module)."""

    checkpoint_config: CheckpointConfig


__all__ = ["SubmitContext", "current", "execute", "spark_session", "submission"]


@dataclass
class SubmitContext:
    """The options of one ``snapflow run`` (all optional; None: the pipeline file decides).

    ``coordinator``: ``host:port`` of a running coordinator (None: an embedded one).
    ``spark_master``: master URL of the SparkSession ``execute()`` creates when none is active.
    ``spark_conf``: extra Spark settings of that session.
    ``parallelism``: the default parallelism of pipelines built without ``parallelism=``.
    ``restore``: a savepoint or retained checkpoint directory the first job starts from.
    ``allow_non_restored_state``: drop restored state of operators the program no longer has.
    ``checkpoint_interval_ms``: overrides the program's interval (0: periodic checkpoints off).
    ``checkpoint_mode``: overrides the program's mode (aligned, unaligned, at_least_once).
    ``job_id``: the id of the first job (``--detach`` picks it before the file runs).
    ``results``: what each ``execute()`` returned, in order (read by the CLI).
    ``spark_session_created``: the session ``execute()`` created (the CLI stops it).
    """

    coordinator: str | None = None
    spark_master: str | None = None
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    parallelism: int | None = None
    restore: str | None = None
    allow_non_restored_state: bool = False
    checkpoint_interval_ms: int | None = None
    checkpoint_mode: str | None = None
    job_id: str | None = None
    results: list[JobResult] = field(default_factory=list)
    executions: int = 0
    spark_session_created: Any = None


_lock = threading.Lock()
_current: SubmitContext | None = None


def current() -> SubmitContext | None:
    """The context of the ``snapflow run`` this process is in, or None."""
    return _current


@contextlib.contextmanager
def submission(ctx: SubmitContext) -> Iterator[SubmitContext]:
    """Make ``ctx`` the current context while the pipeline file runs."""
    global _current
    with _lock:
        if _current is not None:
            raise InvalidArgumentError("a snapflow run submission is already active here")
        _current = ctx
    try:
        yield ctx
    finally:
        with _lock:
            _current = None


def default_parallelism() -> int | None:
    ctx = _current
    return ctx.parallelism if ctx is not None else None


def spark_session(app_name: str = "snapflow", slots: int = 2) -> SparkSession:
    """The SparkSession a pipeline file should use, e.g. to read a DataFrame while it builds
    the pipeline: the active one, else a new one on ``snapflow run --spark-master`` (with its
    ``--conf``), else on ``local[slots]`` (a barrier stage needs all its tasks at once)."""
    from pyspark.sql import SparkSession

    from snapflow.spark_bridge.session import session_builder

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    ctx = _current
    master = (ctx.spark_master if ctx else None) or f"local[{max(slots, 1)}]"
    conf = dict(ctx.spark_conf) if ctx else {}
    session = session_builder(master, app_name, conf).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    if ctx is not None:
        ctx.spark_session_created = session
    return session


def execute(pipeline: Executable, spark: SparkSession | None = None, **options: Any) -> JobResult:
    """Run ``pipeline`` until it ends with the current submission's options (see the module
    docstring); ``spark``: the session to use (default: the active one, else a new one on the
    submission's master, else ``local[N]``); ``options``: see
    :class:`snapflow.spark_bridge.run_options.RunOptions`. Raises JobFailedError if the job failed."""
    ctx = _current
    restore: str | None = None
    allow = False
    if ctx is not None:
        config = pipeline.checkpoint_config
        if ctx.checkpoint_interval_ms is not None:
            config = dataclasses.replace(config, interval_ms=ctx.checkpoint_interval_ms)
        if ctx.checkpoint_mode is not None:
            mode = parse_checkpoint_mode(ctx.checkpoint_mode)
            aligned_timeout = config.aligned_checkpoint_timeout_ms
            if mode is not CheckpointMode.ALIGNED:
                aligned_timeout = 0
            config = dataclasses.replace(
                config, mode=mode, aligned_checkpoint_timeout_ms=aligned_timeout
            )
        pipeline.checkpoint_config = config
        with _lock:
            first = ctx.executions == 0
            ctx.executions += 1
        if first:  # the restore path and a chosen job id belong to the first job of the file
            restore, allow = ctx.restore, ctx.allow_non_restored_state
            if ctx.job_id is not None:
                options.setdefault("job_id", ctx.job_id)
    session = spark if spark is not None else spark_session(pipeline.name, pipeline.slots)
    result = run(
        pipeline,
        session,
        coordinator_address=ctx.coordinator if ctx else None,
        restore_from=restore,
        allow_non_restored_state=allow,
        **options,
    )
    if ctx is not None:
        ctx.results.append(result)
    return result
