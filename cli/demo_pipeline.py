"""``snapflow demo``'s job: the NexMark bid pipeline and the task kill it injects once.

Spark, the Spark bridge and the worker are imported where used: this module is imported by
``snapflow.cli.demo``, which the ``snapflow`` parser imports (tests/cli/test_light_cli.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from snapflow.cli.demo_config import DemoConfig

if TYPE_CHECKING:
    from snapflow.spark_bridge import Pipeline
    from snapflow.worker.api.fault_injection import FailAt

__all__ = ["build_pipeline", "kill_operator", "read_kill"]


def kill_operator(config: DemoConfig) -> FailAt:
    """The demo's failure: in deployment 1, subtask 0, once a checkpoint completed and
    ``kill_after`` seconds passed, write ``kill.json`` and kill the Python worker
    (``os._exit(1)``), as a crashed executor process would. The marker makes it kill once."""
    from snapflow.worker.api.fault_injection import FailAt

    return FailAt(
        how="exit",
        subtask=0,
        attempts=(1,),
        after_checkpoints=1,
        after_s=config.kill_after,
        marker=config.kill_file,
    )


def build_pipeline(config: DemoConfig) -> Pipeline:
    """bids -> [kill once] -> key_by(auction) -> tumbling event-time window stats -> file sink."""
    from snapflow.cli.nexmark import WINDOW_STATS_SCHEMA, PriceStatsWindow
    from snapflow.spark_bridge import FixedDelay, Pipeline
    from snapflow.worker.connectors.file_sink import TransactionalFileSink

    p = Pipeline("nexmark-bid-stats", parallelism=config.parallelism, max_parallelism=128)
    bids = p.source(config.source(), name="bids")
    if config.failure:
        bids = bids.transform(kill_operator(config), name="kill-once")
    window = PriceStatsWindow(config.window_ms)
    (
        bids.key_by("auction")
        .process(
            window,
            on_timer=window.on_timer,
            output_schema=WINDOW_STATS_SCHEMA,
            name=f"bid-stats-{config.window_ms // 1000}s"
            if config.window_ms % 1000 == 0
            else "bid-stats",
        )
        .sink(TransactionalFileSink(config.out_dir), name="window-stats")
    )
    p.checkpointing(interval_ms=config.interval_ms, mode=config.mode, storage=config.checkpoint_dir)
    p.restart_strategy(FixedDelay(attempts=3, delay_s=0.5))
    return p


def read_kill(config: DemoConfig) -> dict[str, Any] | None:
    """What the kill operator wrote when it killed its worker (None: no kill yet)."""
    from snapflow.worker.api.fault_injection import read_marker

    if not config.failure:
        return None
    return read_marker(config.kill_file)  # written atomically: whole or absent
