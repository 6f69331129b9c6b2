"""Spark's own retries cannot duplicate a deployment (issue 8).

A Snapflow deployment is one barrier *ResultStage*. Spark's DAGScheduler aborts a failed barrier
ResultStage outright ("Could not recover from a failed barrier ResultStage"): only barrier
ShuffleMapStages are re-attempted, under ``spark.stage.maxConsecutiveAttempts``. So whatever that
setting is, a failure comes back to the Snapflow driver loop, which resubmits once; Spark never
re-runs the stage's tasks behind the coordinator's back.

Proved here with the setting at Spark's default (4), in a child process with its own local
SparkSession (one JVM hosts one session; at 1, the test session's value, the same is checked by
``test_spark_bridge.py::test_killed_task_resubmits_the_stage_without_loss_or_duplicates``): a task killed
(``os._exit``) or failing (an exception) in the first deployment, then per run: the driver
submitted 2 stages, Spark ran each stage once (attempt 0 only), the coordinator saw exactly 2
deployments (1 restart), and the committed output is exactly once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kit.processes import child_env
from kit.workers import check_exactly_once, expected_counts

from snapflow.worker.connectors.file_sink import read_committed

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

JOB = Path(__file__).with_name("stage_retry_job.py")
CHILD_TIMEOUT_S = 180.0


def _job_module() -> Any:
    spec = importlib.util.spec_from_file_location("stage_retry_job", JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_child(max_attempts: str, work: Path) -> list[dict[str, Any]]:
    log = work / "child.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(JOB), max_attempts, str(work), "exit", "raise"],
            stdout=subprocess.PIPE,
            stderr=err,
            env=child_env(),
            start_new_session=True,  # its own group: the JVM it starts goes with it on timeout
        )
        try:
            out, _ = proc.communicate(timeout=CHILD_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    tail = log.read_text(errors="replace")[-3000:]
    assert proc.returncode == 0, tail
    runs = [json.loads(line) for line in out.decode().splitlines() if line.startswith('{"how"')]
    assert [r["how"] for r in runs] == ["exit", "raise"], tail
    return runs


def test_a_failed_deployment_is_redeployed_once_with_spark_stage_retries_on(
    tmp_path: Path,
) -> None:
    job = _job_module()
    for run in _run_child("4", tmp_path):
        assert run["state"] == "FINISHED", run
        assert run["restarts"] == 1, run  # the coordinator saw exactly 2 deployments
        assert run["driver_stage_submissions"] == 2, run
        assert run["spark_jobs"] == 2, run
        assert run["spark_stage_attempts"] == [0, 0], run  # Spark never re-ran a stage itself
        assert run["slots"] == ["finished", "finished"], run
        committed = read_committed(tmp_path / run["how"] / "out")
        check_exactly_once(committed, expected_counts(job.source(), job.PARALLELISM))
