"""The driver's preflight: the executors' Python must import the driver's Snapflow, or the job
is refused before anything is submitted, with a message naming PYSPARK_PYTHON and both
versions (instead of a stage that fails over and over).

The mismatch is real: a second local SparkSession, in a child process, whose executors run a
Python that sees another installed Snapflow distribution (version 9.9.9) first on its path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from kit.processes import child_env

from snapflow.spark_bridge.preflight import check_executors, snapflow_version

pytestmark = pytest.mark.spark


def test_executors_with_the_drivers_snapflow_pass(spark: Any) -> None:
    check_executors(spark.sparkContext, 2)  # the session's executors run this very Python


DRIVER = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    from snapflow.errors import FailedPreconditionError
    from snapflow.spark_bridge import Pipeline, submit
    from snapflow.worker.connectors.split_sources import GeneratorSource
    from snapflow.worker.connectors.debug_sinks import CollectSink

    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.pyspark.python", sys.argv[1])
        .getOrCreate()
    )
    p = Pipeline("preflight")
    p.source(GeneratorSource(total_records=10), name="events").sink(CollectSink())
    try:
        submit(p, spark)
    except FailedPreconditionError as e:
        print("REFUSED", e)
    else:
        print("SUBMITTED")
    spark.stop()
    """
)


def test_executors_with_another_snapflow_refuse_the_job_before_it_is_submitted(
    tmp_path: Path,
) -> None:
    # Another Snapflow "installed" for the executors: a distribution's metadata first on their
    # path, as a different install in their site-packages would be.
    other = tmp_path / "other-site"
    dist = other / "snapflow-9.9.9.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: snapflow\nVersion: 9.9.9\n")
    python = tmp_path / "executor-python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{other}:$PYTHONPATH" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    env = child_env(PYSPARK_PYTHON=str(python))
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, str(python)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    refused = [line for line in result.stdout.splitlines() if line.startswith("REFUSED")]
    assert refused, result.stdout[-2000:] + result.stderr[-2000:]
    message = refused[0]
    assert f"the driver's snapflow {snapflow_version()}" in message
    assert "has snapflow 9.9.9" in message
    assert f"PYSPARK_PYTHON={python}" in message
    assert os.fspath(python) in message
