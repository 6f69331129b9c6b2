"""``snapflow demo``'s check: the demo's query computed by a batch Spark job over the same bids,
to compare the streaming job's committed output with.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

from snapflow.cli.demo_config import DemoConfig

# Spark is imported where used: this module is imported by ``snapflow.cli.demo``, which the
# ``snapflow`` parser imports (tests/cli/test_light_cli.py).
if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from snapflow.cli.nexmark import WindowRow

__all__ = ["BatchCheck"]


class BatchCheck:
    """The query as a batch Spark job over the same bids, in a background thread."""

    def __init__(self, spark: SparkSession, config: DemoConfig, slots: int) -> None:
        self._spark = spark
        self._config = config
        total = spark.sparkContext.defaultParallelism
        self._partitions = max(1, min(2, total - slots))  # leave the job's slots free
        self._result: Counter[WindowRow] | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.duration_s = 0.0

    def start(self) -> None:
        if self._thread is not None:
            return
        from pyspark import InheritableThread

        self._thread = InheritableThread(target=self._run, name="snapflow-demo-check", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from snapflow.cli.nexmark import batch_window_stats, bids_dataframe

        started = time.monotonic()
        c = self._config
        sc = self._spark.sparkContext
        sc.setJobGroup("snapflow-demo-batch-check", "snapflow demo: the batch Spark check")
        try:
            bids = bids_dataframe(self._spark, c.source(), c.parallelism, self._partitions)
            self._result = batch_window_stats(bids, c.window_ms)
        except BaseException as e:
            self._error = e
        finally:
            self.duration_s = time.monotonic() - started

    def result(self) -> Counter[WindowRow]:
        if self._thread is None:
            self.start()
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result
