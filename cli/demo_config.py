"""``snapflow demo``'s configuration: the flags' presets and parsing, :class:`DemoConfig` (what a
run does) and :class:`DemoSummary` (what it found).

Light on purpose: the ``snapflow`` parser imports this for the demo's flags
(tests/cli/test_light_cli.py), so no Spark, Spark bridge or worker here.
"""

from __future__ import annotations

import argparse
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from snapflow.cli.nexmark import BidSource, WindowRow

__all__ = [
    "DEFAULT_SIZE",
    "MODES",
    "SIZES",
    "DemoConfig",
    "DemoSummary",
    "config_from_args",
    "parse_size",
]

# --records presets: (records, total rate per second). "medium", the default, takes about 15 s
# of streaming (plus Spark's start-up and the batch check) on two cores.
SIZES: dict[str, tuple[int, int]] = {
    "small": (60_000, 15_000),
    "medium": (240_000, 20_000),
    "large": (2_000_000, 50_000),
}
DEFAULT_SIZE = "medium"
MODES = ("aligned", "unaligned", "at_least_once")


def parse_size(value: str) -> int:
    """``--records``: a preset (small, medium, large) or a count (``250000``, ``250_000``,
    ``250k``, ``2m``)."""
    text = str(value).strip().lower().replace("_", "").replace(",", "")
    if text in SIZES:
        return SIZES[text][0]
    m = re.fullmatch(r"(\d+)([km]?)", text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a number of records or one of {', '.join(SIZES)}"
        )
    n = int(m[1]) * {"": 1, "k": 1_000, "m": 1_000_000}[m[2]]
    if n < 1:
        raise argparse.ArgumentTypeError(f"--records must be at least 1, got {value!r}")
    return n


def _preset_rate(records: int) -> int:
    """The default rate of a size: that of the preset with the most records <= it."""
    rate = SIZES["small"][1]
    for n, r in sorted(SIZES.values()):
        if records >= n:
            rate = r
    return rate


@dataclass(frozen=True)
class DemoConfig:
    """What the Spark demo runs (``snapflow demo`` flags)."""

    records: int = SIZES[DEFAULT_SIZE][0]
    rate_per_s: float | None = SIZES[DEFAULT_SIZE][1]
    """Total rate of the source; None: as fast as possible."""
    parallelism: int = 2
    mode: str = "aligned"
    interval_ms: int = 1000
    window_ms: int = 10_000
    kill_after_s: float | None = None
    """When to kill a task (after a checkpoint completed); None: 40 % into the run."""
    failure: bool = True
    data_dir: str = "./data/demo"
    coordinator: str | None = None
    """host:port of a coordinator service; None: the embedded default."""
    spark_master: str = "local[4]"
    spark_conf: tuple[tuple[str, str], ...] = ()
    verbose: bool = False
    seed: int = 7

    @property
    def kill_after(self) -> float:
        if self.kill_after_s is not None:
            return self.kill_after_s
        if not self.rate_per_s:
            return 1.0
        return max(1.0, round(0.4 * self.records / self.rate_per_s, 1))

    def source(self) -> BidSource:
        from snapflow.cli.nexmark import BidSource

        return BidSource(
            total_records=self.records,
            rate_per_s=self.rate_per_s,
            seed=self.seed,
            batch_size=4096,
        )

    @property
    def out_dir(self) -> str:
        return os.path.join(os.path.abspath(self.data_dir), "out")

    @property
    def checkpoint_dir(self) -> str:
        return os.path.join(os.path.abspath(self.data_dir), "checkpoints")

    @property
    def kill_file(self) -> str:
        return os.path.join(os.path.abspath(self.data_dir), "kill.json")


@dataclass
class DemoSummary:
    """What a Spark demo run did and found."""

    records: int
    job_id: str = ""
    state: str = ""
    failure: str = ""
    checkpoints_completed: int = 0
    restarts: int = 0
    restored_from: int = 0
    killed_at_s: float | None = None
    """Seconds after the submission when the task was killed (None: no kill)."""
    killed_what: str = ""
    recovery_s: float | None = None
    """From the kill to the first checkpoint completed after the restart."""
    running_again_s: float | None = None
    """From the failure noticed by the driver to every task running again (JobResult)."""
    committed_rows: int = 0
    expected_rows: int = 0
    missing: Counter[WindowRow] = field(default_factory=Counter)
    """Rows of the batch result missing from the committed output."""
    extra: Counter[WindowRow] = field(default_factory=Counter)
    """Committed rows not in the batch result (or committed more often)."""
    spark_start_s: float = 0.0
    """Creating the SparkSession (0 when the caller gave one)."""
    job_s: float = 0.0
    check_s: float = 0.0
    """After the job: reading the committed output and waiting for the batch result."""
    batch_s: float = 0.0
    """The batch Spark job (run alongside the streaming job)."""
    total_s: float = 0.0

    @property
    def exactly_once(self) -> bool:
        return (
            self.state == "FINISHED"
            and not self.missing
            and not self.extra
            and self.committed_rows == self.expected_rows
        )


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    records = args.records if isinstance(args.records, int) else parse_size(args.records)
    if args.rate is None:
        rate: float | None = float(_preset_rate(records))
    else:
        rate = float(args.rate) if args.rate > 0 else None
    conf = []
    for item in args.conf or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--conf takes KEY=VALUE, got {item!r}")
        conf.append((key.strip(), value))
    return DemoConfig(
        records=records,
        rate_per_s=rate,
        parallelism=args.parallelism,
        mode=args.mode,
        interval_ms=args.interval_ms,
        window_ms=args.window_ms,
        kill_after_s=args.kill_after_s,
        failure=not args.no_failure,
        data_dir=args.storage_root,
        coordinator=args.coordinator,
        spark_master=args.spark_master,
        spark_conf=tuple(conf),
        verbose=args.verbose,
    )
