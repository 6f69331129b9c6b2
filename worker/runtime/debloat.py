"""Buffer debloating: in-flight data of a channel bounded by time, not by count (Flink's
FLIP-183, on the producer's side of a channel). A pure core: events in, a budget out.

Why: a channel holds up to ``buffers_per_channel`` batches at the consumer plus the
producer's output queue. Batches are sized by the producer (a source batch of 65,536 rows), so
the time the consumer needs to drain what is queued ahead of a barrier depends on how fast it
is: milliseconds for a vectorised count, seconds for a Python function per record. Aligned
checkpoints wait for that drain on every channel, and unaligned ones persist all of it.

What: the producer of each channel measures the throughput of its consumer on that channel
from the credits it gets back (a credit returns when the consumer's gate takes one data frame,
so the rows of the oldest frames still outstanding were consumed at that moment), smoothed over
sample periods. From it, :meth:`ChannelDebloater.budget` derives

* ``max_rows``: the rows the channel may hold, queued at the producer or handed over and not yet
  taken by the consumer: ``throughput x target``. The producer hands a frame over only while
  the outstanding rows stay within it (at least one frame always goes), and ``send`` waits
  while queued plus outstanding rows exceed it: the *credits* actually used shrink to what
  the consumer drains in the target time;
* ``max_frame_rows`` (with ``split_frames``): ``max_rows / FRAMES_PER_BUDGET``: larger batches
  are split (zero-copy slices), so a barrier never waits behind one huge batch;
* ``max_poll_rows``: what a source polls at most per output channel: the frame size when
  splitting, else ``POLL_BUDGETS x max_rows``. Without it a source's batch (65,536 rows) is
  one frame whatever its consumer's speed: seconds of work for a consumer that takes 20 to 50
  microseconds per row (Nexmark q16: 1.2 s), all of which a barrier behind it waits for. Only
  the poll is sized, never an operator's output, so a consumer whose cost is per batch gets a
  frame of ``POLL_BUDGETS x target`` of its work at the least: its frames settle where one
  takes that long (they shrink only while a frame's fixed cost exceeds it).

Flink measures on the consumer side and resizes its network buffers (in bytes); here batches
are Arrow record batches whose size the producer chooses, so the producer adapts them, from
the same signal (the consumer's throughput) and to the same goal (``target`` of buffered
data). A period in which the consumer took nothing (idle, blocked while aligning, or stuck in
user code) says nothing about its throughput and is not sampled: the budget keeps its value,
so a stalled consumer is not starved once it goes on.

Stability: with the budget binding, the consumer still gets ``target / credit round trip``
times its measured throughput, so the measurement can only grow back to the consumer's real
speed; it never locks in a lower one as long as ``target`` is well above the round trip of a
credit (milliseconds).

Everything is in rows: a consumer's cost is per row for record functions, and rows are what
splitting controls. Time is injected (``now_ns``, monotonic nanoseconds).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

DEFAULT_TARGET_MS = 100
"""Queued data per channel drains within this time (Flink's buffer-debloat target is 1 s;
here the checkpoint target is 250 ms at the 99th percentile, alignment included)."""

DEFAULT_PERIOD_MS = 50
"""Throughput sample period."""

DEFAULT_SAMPLES = 5
"""Samples averaged (exponential moving average over about this many periods)."""

DEFAULT_MIN_FRAME_ROWS = 1024
"""Batches are never split below this many rows (per-batch costs would dominate)."""

FRAMES_PER_BUDGET = 4
"""A frame is at most a quarter of the budget: the frame a consumer is processing when the
barrier arrives adds at most a quarter of the target to the drain time."""

POLL_BUDGETS = 2
"""Without splitting, a source polls at most this many budgets per output channel: a frame is
then at most twice the target of its consumer's work (200 ms by default), large enough that
per-batch costs stay small beside the rows' and that a fast consumer's frames stay whole
source batches (at a million rows per second a budget is 100,000 rows)."""


@dataclass(frozen=True)
class DebloatSettings:
    """Buffer debloating of one channel (producer side)."""

    target_ms: int = DEFAULT_TARGET_MS
    """Drain time of the data a channel holds; 0 turns debloating off (the count bounds
    ``buffers_per_channel`` and ``output_queue`` alone apply)."""
    period_ms: int = DEFAULT_PERIOD_MS
    """Throughput sample period."""
    samples: int = DEFAULT_SAMPLES
    """Periods averaged (exponential moving average, ``alpha = 2 / (samples + 1)``)."""
    min_frame_rows: int = DEFAULT_MIN_FRAME_ROWS
    """The smallest frame splitting makes; the budget never goes below two of them."""
    split_frames: bool = False
    """Also split batches to ``max_rows / FRAMES_PER_BUDGET`` (and size source polls to it).
    Off by default: a consumer whose cost is per batch rather than per row (a sink writing
    each batch, a keyed function called once per key and batch) then gets less done per
    second with smaller batches, its measured throughput falls, the frames shrink further,
    and the throughput collapses to the minimum frame size (measured: a 10 ms-per-batch
    consumer went from 512-row to 17-row frames). With splitting off, only the number of
    frames in flight adapts, which cannot collapse: a frame always goes when the channel holds
    nothing."""

    def __post_init__(self) -> None:
        if self.target_ms < 0:
            raise ValueError(f"target_ms must be >= 0, got {self.target_ms}")
        if self.period_ms < 1:
            raise ValueError(f"period_ms must be >= 1, got {self.period_ms}")
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        if self.min_frame_rows < 1:
            raise ValueError(f"min_frame_rows must be >= 1, got {self.min_frame_rows}")

    @property
    def enabled(self) -> bool:
        return self.target_ms > 0


DEBLOAT_OFF = DebloatSettings(target_ms=0)


@dataclass(frozen=True)
class Budget:
    """What the channel may hold (``max_rows``), its largest frame, and the most a source
    polls for it; None: no bound."""

    max_rows: int | None
    max_frame_rows: int | None
    max_poll_rows: int | None = None


UNBOUNDED = Budget(None, None)


class ChannelDebloater:
    """The throughput of one channel's consumer and the budget derived from it.

    Events: :meth:`on_handed_over` (a data frame of ``rows`` went to the consumer) and
    :meth:`on_credit` (``n`` credits came back: the ``n`` oldest outstanding frames were taken).
    :meth:`budget` is the current bound: the smallest (two minimum frames) until the first
    sample, so a job that starts does not queue its whole credit ahead of its first barrier;
    ``UNBOUNDED`` when off.
    """

    def __init__(self, settings: DebloatSettings) -> None:
        self.settings = settings
        self._alpha = 2.0 / (settings.samples + 1)
        self._outstanding: deque[int] = deque()
        self._outstanding_rows = 0
        self._period_start_ns: int | None = None
        self._period_rows = 0
        self._rate: float | None = None  # rows/s, smoothed
        self._budget = self._initial()

    # --- queries ---------------------------------------------------------------------------

    @property
    def outstanding_rows(self) -> int:
        """Rows handed over and not yet taken by the consumer."""
        return self._outstanding_rows

    @property
    def rate(self) -> float | None:
        """The consumer's smoothed throughput on this channel, rows/s (None: not measured)."""
        return self._rate

    def budget(self) -> Budget:
        return self._budget

    def may_hand_over(self, rows: int) -> bool:
        """Whether a frame of ``rows`` may go now (credit aside): within the budget, or the
        channel holds nothing (one frame always goes, so a frame above the budget moves)."""
        limit = self._budget.max_rows
        return limit is None or not self._outstanding or self._outstanding_rows + rows <= limit

    def check_invariants(self) -> None:
        assert self._outstanding_rows == sum(self._outstanding) >= 0
        b = self._budget
        if not self.settings.enabled:
            assert b == UNBOUNDED
        elif self._rate is None:
            assert b == self._initial()
        else:
            assert b.max_rows is not None
            assert b.max_rows >= 2 * self.settings.min_frame_rows
            if self.settings.split_frames:
                assert b.max_frame_rows is not None
                assert self.settings.min_frame_rows <= b.max_frame_rows <= b.max_rows
                assert b.max_poll_rows == b.max_frame_rows
            else:
                assert b.max_frame_rows is None
                assert b.max_poll_rows == POLL_BUDGETS * b.max_rows

    # --- events ----------------------------------------------------------------------------

    def on_handed_over(self, rows: int, now_ns: int) -> None:
        if rows < 0:
            raise ValueError(f"negative rows {rows}")
        if self._period_start_ns is None:
            self._period_start_ns = now_ns
        self._outstanding.append(rows)
        self._outstanding_rows += rows

    def on_credit(self, n: int, now_ns: int) -> Budget | None:
        """``n`` credits came back. Returns the new budget when a sample changed it."""
        if n < 0:
            raise ValueError(f"negative credit {n}")
        outstanding = self._outstanding
        for _ in range(n):
            if not outstanding:
                # the initial credits (and grants of buffers that never held a frame)
                break
            rows = outstanding.popleft()
            self._outstanding_rows -= rows
            self._period_rows += rows
        return self._sample(now_ns)

    def on_tick(self, now_ns: int) -> Budget | None:
        """Close a sample period without a credit (harmless to call at any time)."""
        return self._sample(now_ns)

    # --- internals -------------------------------------------------------------------------

    def _sample(self, now_ns: int) -> Budget | None:
        start = self._period_start_ns
        if start is None:
            self._period_start_ns = now_ns
            return None
        elapsed_ns = now_ns - start
        if elapsed_ns < self.settings.period_ms * 1_000_000:
            return None
        rows, self._period_rows = self._period_rows, 0
        self._period_start_ns = now_ns
        if rows == 0:
            return None  # idle, blocked or stuck: no information about its throughput
        sample = rows * 1e9 / elapsed_ns
        rate = self._rate
        self._rate = sample if rate is None else rate + self._alpha * (sample - rate)
        if not self.settings.enabled:
            return None
        budget = self._derive(self._rate)
        if budget == self._budget:
            return None
        self._budget = budget
        return budget

    def _initial(self) -> Budget:
        return self._derive(0.0) if self.settings.enabled else UNBOUNDED

    def _derive(self, rate: float) -> Budget:
        s = self.settings
        max_rows = max(2 * s.min_frame_rows, math.ceil(rate * s.target_ms / 1000.0))
        if not s.split_frames:
            return Budget(max_rows, None, POLL_BUDGETS * max_rows)
        frame = max(s.min_frame_rows, max_rows // FRAMES_PER_BUDGET)
        return Budget(max_rows, frame, frame)
