"""The SparkSession Snapflow jobs expect: one builder for the demo, the benchmarks and the tests.

:func:`session_builder` configures a ``SparkSession.Builder``; :func:`local_session` builds and
starts a local session with it. What they set, and why:

* ``PYSPARK_PYTHON`` (and, on a local master, ``PYSPARK_DRIVER_PYTHON``) = this interpreter:
  the Python workers must import the same Snapflow and pyarrow as the driver. On a cluster an
  existing ``PYSPARK_PYTHON`` is kept (the executors' Python may live elsewhere);
* no Spark UI and no console progress bars (a port and terminal noise nobody reads here);
* on a local master the driver binds 127.0.0.1 (``SPARK_LOCAL_IP`` too), so nothing listens on
  other interfaces;
* ``spark.stage.maxConsecutiveAttempts=1``: no Spark-side stage re-attempts (see the comment at
  the setting; Spark never re-attempts a failed barrier ResultStage anyway).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def is_local_master(master: str) -> bool:
    """Whether ``master`` runs Spark inside this machine's driver (``local``, ``local[...]``)."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def session_builder(
    master: str, app_name: str, conf: Mapping[str, str] | None = None
) -> SparkSession.Builder:
    """A builder for ``master`` with Snapflow's settings; ``conf`` adds or overrides settings."""
    local = is_local_master(master)
    if local:
        for var in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
            os.environ[var] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # A deployment is a barrier ResultStage, which Spark's DAGScheduler never re-attempts
        # whatever this setting (tests/spark_bridge/test_spark_stage_retries.py): its failure
        # always comes back to the driver loop, which restores under the restart strategy. At 1
        # Spark re-attempts no other stage either (a barrier ShuffleMapStage, a stage after a
        # fetch failure), so every failure goes through that loop.
        .config("spark.stage.maxConsecutiveAttempts", "1")
    )
    if local:
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder


def local_session(
    master: str = "local[4]",
    app_name: str = "snapflow",
    conf: Mapping[str, str] | None = None,
    log_level: str = "ERROR",
) -> SparkSession:
    """A started local SparkSession configured by :func:`session_builder` (the caller stops
    it); Spark's own log is cut down to ``log_level``."""
    session = session_builder(master, app_name, conf).getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    return session
