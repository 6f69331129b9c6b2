"""Run by ``test_spark_stage_retries.py`` in a child process: a keyed count whose first
deployment loses a task, on a local SparkSession of its own with
``spark.stage.maxConsecutiveAttempts`` from the command line (one JVM holds one session, and the
test session's is 1). Prints one JSON line per run: what the driver and the coordinator saw.

Usage: ``python stage_retry_job.py MAX_ATTEMPTS WORK_DIR HOW [HOW ...]``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from snapflow.spark_bridge import FixedDelay, Pipeline
from snapflow.spark_bridge.session import local_session
from snapflow.worker.api.fault_injection import FailAt
from snapflow.worker.connectors.file_sink import TransactionalFileSink
from snapflow.worker.connectors.split_sources import GeneratorSource

RECORDS = 120_000
KEYS = 200
PARALLELISM = 2


def source() -> GeneratorSource:
    return GeneratorSource(
        total_records=RECORDS, rate_per_s=80_000, num_keys=KEYS, batch_size=2048, seed=5
    )


def main() -> None:
    max_attempts, work = sys.argv[1], Path(sys.argv[2])
    spark = local_session(
        f"local[{PARALLELISM}]",
        "snapflow-stage-retries",
        conf={"spark.stage.maxConsecutiveAttempts": max_attempts},
    )
    try:
        for how in sys.argv[3:]:
            p = Pipeline(f"stage-retry-{how}", parallelism=PARALLELISM, max_parallelism=64)
            crash = FailAt(how=how, after_records=20_000, after_checkpoints=1)  # type: ignore[arg-type]
            (
                p.source(source(), name="events")
                .transform(crash, name="crash-once")
                .key_by("key")
                .count()
                .sink(TransactionalFileSink(str(work / how / "out")))
            )
            p.checkpointing(interval_ms=150, storage=str(work / how / "cp"))
            p.restart_strategy(FixedDelay(attempts=3, delay_s=0.2))
            result = p.run(spark, timeout_s=120.0)
            # Every Spark job the driver ran for this pipeline, and each stage's last attempt
            # number (> 0: Spark re-ran the stage itself).
            tracker = spark.sparkContext.statusTracker()
            jobs = [
                tracker.getJobInfo(j)
                for j in tracker.getJobIdsForGroup(f"snapflow-{result.job_id}")
            ]
            stages = [tracker.getStageInfo(s) for j in jobs if j for s in j.stageIds]
            print(
                json.dumps(
                    {
                        "how": how,
                        "state": result.state.value,
                        "restarts": result.restarts,
                        "driver_stage_submissions": result.stage_attempts,
                        "spark_jobs": len(jobs),
                        "spark_stage_attempts": sorted(i.currentAttemptId for i in stages if i),
                        "slots": sorted(str(s["status"]) for s in result.slot_summaries),
                        "checkpoints": result.checkpoints_completed,
                    }
                ),
                flush=True,
            )
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
