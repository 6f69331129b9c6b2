"""Barrier handling on an input gate: pure state machines (Flink's SingleCheckpointBarrierHandler
and CheckpointBarrierTracker).

The task feeds in the control events it takes from its input channels (barriers, cancel
markers, end of partition) and ticks of its clock; *actions* come out as frozen dataclasses that
the task executes in the order given, before it takes the next frame from any channel. There is
no I/O, no clock and no thread in here: time is passed in as ``now_ms``, wall-clock epoch
milliseconds comparable to ``Barrier.timestamp_ms`` (the coordinator's trigger time), because the
aligned-checkpoint timeout is measured from the barrier's creation, as in Flink.

Channels are numbered ``0 .. num_channels - 1``. A number outside that range is a bug in the
caller and raises ``ValueError``; an event on a channel that has already ended is ignored.
Checkpoint ids are valid from 0 (Flink's handlers start below every id, at -1; the coordinator
hands out ids from 1); a negative id raises ``ValueError``.

Where these handlers differ from Flink on purpose: ``docs/flink-differences.md``.

Handlers
--------
``create_barrier_handler(mode, num_channels)`` picks the handler from the job's mode:
``AT_LEAST_ONCE`` -> ``AtLeastOnceBarrierTracker`` (for all of the job's barriers, savepoints
included); ``ALIGNED`` or ``UNALIGNED`` -> ``SingleCheckpointBarrierHandler``, which decides per
checkpoint from the options of the checkpoint's first barrier:

* ``mode=UNALIGNED``: unaligned.
* ``mode=ALIGNED`` with ``aligned_checkpoint_timeout_ms > 0``, not a savepoint: aligned with
  timeout.
* otherwise aligned. **A savepoint never times out to unaligned**, whatever its
  ``aligned_checkpoint_timeout_ms``. (The coordinator always sends savepoints ``ALIGNED``; a
  barrier that says ``UNALIGNED`` is handled unaligned whatever its kind, because the channel
  layer has already delivered it as a priority frame, ahead of data it overtook, which an
  aligned snapshot would lose.)

``BarrierOptions``, ``CheckpointMode`` and ``CheckpointKind`` are the shared checkpoint
vocabulary of ``snapflow.checkpointing``.

An ``AT_LEAST_ONCE`` barrier on a ``SingleCheckpointBarrierHandler`` and an ``UNALIGNED``
barrier on an ``AtLeastOnceBarrierTracker`` raise ``ValueError``: the job's mode is fixed and
either would silently weaken the guarantee.

Behaviours of ``SingleCheckpointBarrierHandler`` (at most one checkpoint in progress)
-------------------------------------------------------------------------------------
1. Aligned: the first barrier of checkpoint n blocks its channel (``BlockChannel``); every later
   barrier n blocks its channel too, until every *open* channel has delivered barrier n. The
   barrier that completes the alignment does not block: it yields ``TriggerSnapshot(n,
   unaligned=False, alignment_duration_ms=now - first barrier arrival)``, then
   ``UnblockChannels`` (if any channel is blocked), then ``CheckpointCompleteOnInput(n)``. On a
   single-channel gate that is the first barrier itself (alignment 0).
2. A newer barrier m > n during checkpoint n aborts n (``AbortCheckpoint(n, SUBSUMED)``),
   unblocks, and starts m with that barrier. A barrier older than the current checkpoint, a
   barrier of a checkpoint that already completed on this input or was aborted, and a second
   barrier n on the same channel are ignored: no action, the channel is not blocked.
3. A cancel marker for the current checkpoint aborts it (``AbortCheckpoint(n,
   CANCELED_BY_MARKER)``) and unblocks. A marker for a newer checkpoint m aborts the current one
   as ``SUBSUMED`` (if any), then yields ``AbortCheckpoint(m, CANCELED_BY_MARKER)`` and marks m
   aborted, so that m's later barriers are ignored. Markers for older, completed or already
   aborted checkpoints are ignored.
4. End of partition closes a channel; alignment waits only for open channels. If the closed
   channel was the last one missing, the checkpoint completes now (aligned: the snapshot is
   triggered now; unaligned: ``StopPersistingChannel`` for that channel, then
   ``CheckpointCompleteOnInput``). A blocked channel that ends is simply closed (no unblock
   action: it will never be read again). Once every channel has ended no action is produced any
   more (a checkpoint that was waiting only for the ended channels completed at the last end of
   partition).
5. Unaligned: the first barrier n yields ``TriggerSnapshot(n, unaligned=True)`` at once (alignment
   0), ``PersistOvertakenData(c, n)`` for its channel c, then ``StartPersistingChannel(d, n)`` for
   every other open channel d, in channel order. Each later barrier n on channel d yields
   ``PersistOvertakenData(d, n)`` (if the barrier is unaligned) and ``StopPersistingChannel(d,
   n)``; once every open channel has delivered barrier n (or ended),
   ``CheckpointCompleteOnInput(n)``. Channels are never blocked in unaligned mode.
6. Aligned with timeout: aligned, with a deadline ``barrier.timestamp_ms +
   aligned_checkpoint_timeout_ms`` (``next_deadline_ms()``). The deadline is checked when a
   barrier of the checkpoint arrives and in ``on_timer``; when ``now_ms >= deadline`` (at the
   deadline itself, so that a timer set for ``next_deadline_ms()`` acts) and the alignment is
   still incomplete, the checkpoint switches to unaligned. Besides ``on_timer``, every barrier of
   the checkpoint and every end of partition checks the deadline (as Flink's
   ``barrierReceived`` and ``endOfPartitionReceived`` do), so the switch never depends on a timer
   having run. The switch: ``SwitchToUnaligned(n)``, ``TriggerSnapshot(n,
   unaligned=True, alignment_duration_ms=now - first barrier arrival)`` (its ``options`` have
   ``mode=UNALIGNED``, so the barrier forwarded downstream is unaligned, like Flink's
   ``asUnaligned()``), ``StartPersistingChannel`` for every open channel still missing barrier n,
   then ``UnblockChannels`` for the blocked channels. A barrier (or end of partition) that
   completes the alignment wins over the deadline (an aligned snapshot, no channel state), as in
   Flink, which checks ``allBarriersReceived`` before ``isTimedOut``. A barrier of a pending aligned
   checkpoint that arrives with ``mode=UNALIGNED`` (an upstream task timed out and forwarded it
   unaligned) switches it at once, even when it is the last one, as in Flink: ``SwitchToUnaligned``,
   ``TriggerSnapshot``, ``PersistOvertakenData`` for its channel, ``StartPersistingChannel`` for
   the channels still missing, ``UnblockChannels``, and ``CheckpointCompleteOnInput`` if nothing
   is missing.

   Data queued behind the barrier on a blocked channel is **not** channel state: it was sent
   after barrier n, so it belongs to the next checkpoint; the operator state taken now already
   reflects everything the blocked channels sent before their barrier. After the switch the task
   simply processes it. Persisting it as state of n would replay it after a restore on top of the
   upstream re-sending it: duplicates. Only channels that have not delivered barrier n carry
   channel state of n.

Behaviours of ``AtLeastOnceBarrierTracker`` (Flink's CheckpointBarrierTracker)
------------------------------------------------------------------------------
7. Never blocks, never persists. Barriers are counted per checkpoint id; several checkpoints can
   be tracked at once (at most ``max_pending``, default 50). When barrier n has arrived on every
   open channel: ``TriggerSnapshot(n, unaligned=False)`` then ``CheckpointCompleteOnInput(n)``;
   tracked checkpoints older than n are dropped silently, as in Flink (the coordinator subsumes
   them when n completes). End of partition can complete several tracked checkpoints at once:
   as in Flink, only the newest of them is triggered (unless it was aborted) and every older
   one is dropped silently. A barrier of an id that is neither tracked nor newer than every id
   seen so far is ignored (already completed, dropped or evicted). A cancel marker
   for m first aborts every tracked checkpoint older than m not aborted yet, in ascending order,
   and forgets them; then it yields ``AbortCheckpoint(m, CANCELED_BY_MARKER)`` once (if m is
   tracked or newer than every id seen; a marker of an older, untracked id aborts only the
   older tracked ones), as Flink's ``processCancellationBarrier`` does. m stays tracked as
   aborted, so its later barriers and markers are only counted (once they arrived on every
   open channel the entry is dropped). When a new id would exceed ``max_pending`` the oldest
   tracked id is evicted: ``AbortCheckpoint(oldest, TOO_MANY_PENDING)`` unless it was already
   aborted (Flink evicts silently; here the task declines it so that the coordinator aborts it
   at once, uncounted, instead of letting it expire: see ``docs/flink-differences.md``).

Contract with the task (what it must do for each action)
--------------------------------------------------------
Every checkpoint id that shows up in an action ends with exactly one ``CheckpointCompleteOnInput``
or ``AbortCheckpoint``; ``CheckpointCompleteOnInput(n)`` always follows ``TriggerSnapshot(n)``.

* ``BlockChannel(c)``: take no more frames from channel c, priority frames included (they stay
  queued; credit-based flow control bounds them) until an ``UnblockChannels`` names c.
  ``blocked_channels()`` is the set.
* ``UnblockChannels(cs)``: resume taking frames from these channels; their queued data is
  processed normally (it belongs to the next checkpoint).
* ``TriggerSnapshot(n, ...)``: take the synchronous part of the operator snapshot for n, then
  emit a barrier for n with ``options`` on every output and start the asynchronous part. If
  ``unaligned``, the barrier overtakes the output data still queued on each output, and that
  overtaken data is written as output channel state of n; input channel state of n follows via
  the persisting actions. Report ``alignment_duration_ms``, ``start_delay_ms`` (first barrier
  arrival minus barrier creation) and ``unaligned`` in the ack's metrics.
* ``StartPersistingChannel(c, n)`` ... ``StopPersistingChannel(c, n)``: in between, every data
  batch the task takes from channel c is first written as input channel state of n, then
  processed as normal. Data already queued on c when persisting starts counts too: it is written
  when it is taken. The task may keep its own set from these actions or ask
  ``must_persist(c)`` (the checkpoint id, or None) before processing each batch taken from c;
  the two always agree. Data never changes the handler's state, so there is no ``on_data``.
  ``StopPersistingChannel`` means c's input channel state of n is complete (its barrier
  arrived, or the channel ended).
* ``PersistOvertakenData(c, n)``: an unaligned barrier is a priority frame (see
  ``snapflow.worker.runtime.frames.is_priority``): the channel hands it over ahead of the data still queued in
  that input channel, data that was sent *before* the barrier. That data (possibly none) is
  input channel state of n: write it now. It stays queued and is processed as normal when its
  turn comes (without being written again for n: c no longer persists for n).
* ``SwitchToUnaligned(n)``: informational (log, metrics: checkpoint n timed out while aligning
  and continues unaligned); the ``TriggerSnapshot`` that follows it does the work.
* ``CheckpointCompleteOnInput(n)``: every barrier of n is in; for unaligned checkpoints the input
  channel state of n is complete, so the snapshot of n can be finished and acknowledged.
* ``AbortCheckpoint(n, reason)``: stop everything for n (persisting included) and discard what
  was written for it; emit a cancel marker for n on every output; decline n to the coordinator
  with ``reason.decline_reason`` (``SUBSUMED`` and ``TOO_MANY_PENDING`` -> ``SUBSUMED``,
  ``CANCELED_BY_MARKER`` -> ``ALIGNMENT_CANCELED``).

Timers: after every call, ``next_deadline_ms()`` says when ``on_timer`` next has something to do
(None: nothing); calling ``on_timer`` earlier or more often is harmless.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace

from snapflow.checkpointing import BarrierOptions, CheckpointMode, DeclineReason

DEFAULT_MAX_PENDING_CHECKPOINTS = 50
"""How many checkpoint ids the at-least-once tracker follows at once (Flink tracks 50)."""


class BarrierAbortReason(enum.Enum):
    """Why the barrier handler gave up on a checkpoint (the task declines it)."""

    SUBSUMED = "subsumed"
    """A newer checkpoint's barrier (or cancel marker) superseded it."""
    CANCELED_BY_MARKER = "canceled_by_marker"
    """A cancel marker for it arrived on an input channel."""
    TOO_MANY_PENDING = "too_many_pending"
    """At least once: more checkpoints were in flight than the tracker follows."""

    @property
    def decline_reason(self) -> DeclineReason:
        """What the task tells the coordinator: none of these counts as a checkpoint failure."""
        if self is BarrierAbortReason.CANCELED_BY_MARKER:
            return DeclineReason.ALIGNMENT_CANCELED
        return DeclineReason.SUBSUMED


@dataclass(frozen=True)
class Barrier:
    checkpoint_id: int
    timestamp_ms: int
    """When the coordinator triggered the checkpoint (wall clock, epoch ms)."""
    options: BarrierOptions = field(default_factory=BarrierOptions)


# --- actions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockChannel:
    channel: int


@dataclass(frozen=True)
class UnblockChannels:
    channels: tuple[int, ...]
    """Ascending, never empty."""


@dataclass(frozen=True)
class TriggerSnapshot:
    checkpoint_id: int
    timestamp_ms: int
    options: BarrierOptions
    """Forward the barrier downstream with these options."""
    unaligned: bool
    alignment_duration_ms: int
    start_delay_ms: int


@dataclass(frozen=True)
class StartPersistingChannel:
    channel: int
    checkpoint_id: int


@dataclass(frozen=True)
class PersistOvertakenData:
    """The data the unaligned barrier just taken from ``channel`` overtook is channel state."""

    channel: int
    checkpoint_id: int


@dataclass(frozen=True)
class StopPersistingChannel:
    channel: int
    checkpoint_id: int


@dataclass(frozen=True)
class SwitchToUnaligned:
    checkpoint_id: int


@dataclass(frozen=True)
class AbortCheckpoint:
    checkpoint_id: int
    reason: BarrierAbortReason


@dataclass(frozen=True)
class CheckpointCompleteOnInput:
    checkpoint_id: int


Action = (
    BlockChannel
    | UnblockChannels
    | TriggerSnapshot
    | StartPersistingChannel
    | PersistOvertakenData
    | StopPersistingChannel
    | SwitchToUnaligned
    | AbortCheckpoint
    | CheckpointCompleteOnInput
)


# --- the common interface ----------------------------------------------------------------


class BarrierHandler(ABC):
    """The barrier handler of one input gate. Not thread-safe: the task serialises calls."""

    def __init__(self, num_channels: int) -> None:
        if num_channels < 1:
            raise ValueError(f"an input gate needs at least one channel, not {num_channels}")
        self.num_channels = num_channels
        self._open: set[int] = set(range(num_channels))

    # --- events ----------------------------------------------------------------------------

    @abstractmethod
    def on_barrier(self, channel: int, barrier: Barrier, now_ms: int) -> list[Action]:
        """A checkpoint barrier was taken from ``channel``."""

    @abstractmethod
    def on_cancel_marker(self, channel: int, checkpoint_id: int, now_ms: int) -> list[Action]:
        """A cancel-checkpoint marker was taken from ``channel``."""

    @abstractmethod
    def on_end_of_partition(self, channel: int, now_ms: int) -> list[Action]:
        """``channel`` ended: it delivers nothing more."""

    def on_timer(self, now_ms: int) -> list[Action]:
        """The clock reached ``next_deadline_ms()`` (or any other time: then a no-op)."""
        return []

    # --- queries ---------------------------------------------------------------------------

    def next_deadline_ms(self) -> int | None:
        """When ``on_timer`` next has something to do; None: nothing scheduled."""
        return None

    def blocked_channels(self) -> frozenset[int]:
        """Channels the task must not take frames from."""
        return frozenset()

    def must_persist(self, channel: int) -> int | None:
        """The checkpoint whose input channel state data taken from ``channel`` now belongs to."""
        self._check_channel(channel)
        return None

    def open_channels(self) -> frozenset[int]:
        return frozenset(self._open)

    @staticmethod
    def _check_id(checkpoint_id: int) -> None:
        if checkpoint_id < 0:
            raise ValueError(f"checkpoint id {checkpoint_id} is negative")

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (tests call it after each step)."""

    # --- helpers ---------------------------------------------------------------------------

    def _check_channel(self, channel: int) -> None:
        if not 0 <= channel < self.num_channels:
            raise ValueError(f"channel {channel} is not in 0..{self.num_channels - 1}")

    def _close(self, channel: int) -> bool:
        """Close an open channel; False if it was already closed."""
        self._check_channel(channel)
        if channel not in self._open:
            return False
        self._open.remove(channel)
        return True


def _start_delay_ms(barrier: Barrier, first_arrival_ms: int) -> int:
    return max(0, first_arrival_ms - barrier.timestamp_ms)


def _overtaken(channel: int, barrier: Barrier) -> list[Action]:
    """An unaligned barrier counted for an unaligned checkpoint: what it overtook is state."""
    if not barrier.options.is_unaligned:
        return []
    return [PersistOvertakenData(channel, barrier.checkpoint_id)]


# --- exactly once: aligned, unaligned, aligned with timeout -------------------------------


@dataclass
class _Alignment:
    """The checkpoint in progress on a SingleCheckpointBarrierHandler."""

    barrier: Barrier
    first_arrival_ms: int
    arrived: set[int]
    """Channels that delivered its barrier (closed ones included)."""
    unaligned: bool
    """The snapshot has been triggered unaligned (from the start, or after a switch)."""
    deadline_ms: int | None
    """Aligned with timeout, not switched yet: when to switch to unaligned."""

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id


class SingleCheckpointBarrierHandler(BarrierHandler):
    """Exactly once: aligned, unaligned or aligned with timeout, decided per checkpoint."""

    def __init__(self, num_channels: int) -> None:
        super().__init__(num_channels)
        self._current_id = -1
        """The highest checkpoint id started or aborted by a marker (-1: none, so id 0 is valid
        as in Flink)."""
        self._last_ended_id = -1
        """The highest checkpoint id completed on this input or aborted."""
        self._pending: _Alignment | None = None
        self._blocked: set[int] = set()
        self._persisting: set[int] = set()
        """Channels persisting as channel state of the pending (unaligned) checkpoint."""

    # --- queries ---------------------------------------------------------------------------

    def pending_checkpoint_id(self) -> int | None:
        """The checkpoint whose barriers are being collected, if any."""
        return self._pending.checkpoint_id if self._pending is not None else None

    def next_deadline_ms(self) -> int | None:
        return self._pending.deadline_ms if self._pending is not None else None

    def blocked_channels(self) -> frozenset[int]:
        return frozenset(self._blocked)

    def must_persist(self, channel: int) -> int | None:
        self._check_channel(channel)
        if self._pending is not None and channel in self._persisting:
            return self._pending.checkpoint_id
        return None

    def check_invariants(self) -> None:
        assert self._blocked <= self._open, "a closed channel is blocked"
        assert self._persisting <= self._open, "a closed channel is persisted"
        assert not (self._blocked & self._persisting), "a channel is blocked and persisted"
        assert -1 <= self._last_ended_id <= self._current_id
        p = self._pending
        if p is None:
            assert not self._blocked, "blocked without a checkpoint in progress"
            assert not self._persisting, "persisting without a checkpoint in progress"
            return
        assert p.checkpoint_id == self._current_id > self._last_ended_id
        assert p.arrived, "a checkpoint in progress without any barrier"
        assert p.arrived <= set(range(self.num_channels))
        assert not self._open <= p.arrived, "every barrier is in but the checkpoint is pending"
        if p.unaligned:
            assert not self._blocked, "a channel is blocked during an unaligned checkpoint"
            assert p.deadline_ms is None
            assert self._persisting == self._open - p.arrived, "persisted channels inconsistent"
        else:
            assert not p.barrier.options.is_unaligned
            assert not self._persisting, "persisting during an aligned checkpoint"
            assert self._blocked == p.arrived & self._open, "blocked channels inconsistent"
            assert (p.deadline_ms is not None) == p.barrier.options.is_timeoutable

    # --- events ----------------------------------------------------------------------------

    def on_barrier(self, channel: int, barrier: Barrier, now_ms: int) -> list[Action]:
        self._check_channel(channel)
        if barrier.options.mode is CheckpointMode.AT_LEAST_ONCE:
            raise ValueError(
                "an AT_LEAST_ONCE barrier reached an exactly-once input gate; an at-least-once "
                "job uses AtLeastOnceBarrierTracker (create_barrier_handler)"
            )
        self._check_id(barrier.checkpoint_id)
        if channel not in self._open:
            return []
        cid = barrier.checkpoint_id
        if cid < self._current_id or (cid == self._current_id and self._pending is None):
            return []  # older, completed or aborted
        if cid > self._current_id:
            actions = self._abort_pending(BarrierAbortReason.SUBSUMED)
            self._current_id = cid
            return actions + self._start(channel, barrier, now_ms)
        p = self._pending
        assert p is not None
        if channel in p.arrived:
            return []  # a second barrier on the same channel
        p.arrived.add(channel)
        if p.unaligned:
            self._persisting.remove(channel)
            return [
                *_overtaken(channel, barrier),
                StopPersistingChannel(channel, cid),
                *self._complete_if_all_arrived(),
            ]
        if barrier.options.is_unaligned:
            # An upstream timed out and sent the barrier unaligned: it may have overtaken data
            # on this channel, which only an unaligned checkpoint can hold (Flink switches too).
            return self._switch_to_unaligned(now_ms, channel, barrier)
        if self._open <= p.arrived:
            return self._finish_aligned(now_ms)
        if self._timed_out(p, now_ms):
            return self._switch_to_unaligned(now_ms)
        self._blocked.add(channel)
        return [BlockChannel(channel)]

    def on_cancel_marker(self, channel: int, checkpoint_id: int, now_ms: int) -> list[Action]:
        self._check_channel(channel)
        self._check_id(checkpoint_id)
        if channel not in self._open:
            return []
        if checkpoint_id > self._current_id:
            actions = self._abort_pending(BarrierAbortReason.SUBSUMED)
            self._current_id = self._last_ended_id = checkpoint_id
            return [*actions, AbortCheckpoint(checkpoint_id, BarrierAbortReason.CANCELED_BY_MARKER)]
        if checkpoint_id == self._current_id:
            return self._abort_pending(BarrierAbortReason.CANCELED_BY_MARKER)
        return []

    def on_end_of_partition(self, channel: int, now_ms: int) -> list[Action]:
        if not self._close(channel):
            return []
        self._blocked.discard(channel)
        p = self._pending
        if p is None:
            return []
        actions: list[Action] = []
        if channel in self._persisting:
            self._persisting.remove(channel)
            actions.append(StopPersistingChannel(channel, p.checkpoint_id))
        if p.unaligned:
            return actions + self._complete_if_all_arrived()
        if self._open <= p.arrived:
            return self._finish_aligned(now_ms)
        if self._timed_out(p, now_ms):
            return self._switch_to_unaligned(now_ms)
        return actions

    def on_timer(self, now_ms: int) -> list[Action]:
        p = self._pending
        if p is None or not self._timed_out(p, now_ms):
            return []
        return self._switch_to_unaligned(now_ms)

    # --- transitions -----------------------------------------------------------------------

    @staticmethod
    def _timed_out(p: _Alignment, now_ms: int) -> bool:
        return p.deadline_ms is not None and now_ms >= p.deadline_ms

    def _start(self, channel: int, barrier: Barrier, now_ms: int) -> list[Action]:
        options = barrier.options
        cid = barrier.checkpoint_id
        deadline = barrier.timestamp_ms + options.aligned_checkpoint_timeout_ms
        p = _Alignment(
            barrier=barrier,
            first_arrival_ms=now_ms,
            arrived={channel},
            unaligned=options.is_unaligned,
            deadline_ms=deadline if options.is_timeoutable else None,
        )
        self._pending = p
        if p.unaligned:
            actions: list[Action] = [
                TriggerSnapshot(
                    cid,
                    barrier.timestamp_ms,
                    options,
                    unaligned=True,
                    alignment_duration_ms=0,
                    start_delay_ms=_start_delay_ms(barrier, now_ms),
                ),
                *_overtaken(channel, barrier),
                *self._start_persisting_missing(),
            ]
            return actions + self._complete_if_all_arrived()
        if self._open <= p.arrived:
            return self._finish_aligned(now_ms)
        if self._timed_out(p, now_ms):
            return self._switch_to_unaligned(now_ms)
        self._blocked.add(channel)
        return [BlockChannel(channel)]

    def _start_persisting_missing(self) -> list[Action]:
        p = self._pending
        assert p is not None
        missing = sorted(self._open - p.arrived)
        self._persisting.update(missing)
        return [StartPersistingChannel(c, p.checkpoint_id) for c in missing]

    def _unblock_all(self) -> list[Action]:
        if not self._blocked:
            return []
        channels = tuple(sorted(self._blocked))
        self._blocked.clear()
        return [UnblockChannels(channels)]

    def _end_pending(self) -> _Alignment:
        p = self._pending
        assert p is not None
        self._pending = None
        self._persisting.clear()
        self._last_ended_id = max(self._last_ended_id, p.checkpoint_id)
        return p

    def _finish_aligned(self, now_ms: int) -> list[Action]:
        p = self._pending
        assert p is not None and not p.unaligned
        trigger = TriggerSnapshot(
            p.checkpoint_id,
            p.barrier.timestamp_ms,
            p.barrier.options,
            unaligned=False,
            alignment_duration_ms=max(0, now_ms - p.first_arrival_ms),
            start_delay_ms=_start_delay_ms(p.barrier, p.first_arrival_ms),
        )
        actions: list[Action] = [trigger, *self._unblock_all()]
        self._end_pending()
        return [*actions, CheckpointCompleteOnInput(p.checkpoint_id)]

    def _switch_to_unaligned(
        self, now_ms: int, channel: int | None = None, barrier: Barrier | None = None
    ) -> list[Action]:
        """Trigger the pending aligned checkpoint now, unaligned.

        ``channel`` and ``barrier``: the barrier just taken, when it caused the switch.
        """
        p = self._pending
        assert p is not None and not p.unaligned
        p.unaligned = True
        p.deadline_ms = None
        options = replace(p.barrier.options, mode=CheckpointMode.UNALIGNED)
        trigger = TriggerSnapshot(
            p.checkpoint_id,
            p.barrier.timestamp_ms,
            options,
            unaligned=True,
            alignment_duration_ms=max(0, now_ms - p.first_arrival_ms),
            start_delay_ms=_start_delay_ms(p.barrier, p.first_arrival_ms),
        )
        overtaken = (
            _overtaken(channel, barrier) if channel is not None and barrier is not None else []
        )
        return [
            SwitchToUnaligned(p.checkpoint_id),
            trigger,
            *overtaken,
            *self._start_persisting_missing(),
            *self._unblock_all(),
            *self._complete_if_all_arrived(),
        ]

    def _complete_if_all_arrived(self) -> list[Action]:
        p = self._pending
        assert p is not None and p.unaligned
        if not self._open <= p.arrived:
            return []
        self._end_pending()
        return [CheckpointCompleteOnInput(p.checkpoint_id)]

    def _abort_pending(self, reason: BarrierAbortReason) -> list[Action]:
        if self._pending is None:
            return []
        abort = AbortCheckpoint(self._pending.checkpoint_id, reason)
        unblock = self._unblock_all()
        self._end_pending()
        return [abort, *unblock]


# --- at least once -----------------------------------------------------------------------


@dataclass
class _Tracked:
    """A checkpoint id followed by the AtLeastOnceBarrierTracker."""

    checkpoint_id: int
    barrier: Barrier | None
    """None when first seen through a cancel marker (then it is aborted)."""
    first_arrival_ms: int
    arrived: set[int] = field(default_factory=set)
    """Channels that delivered its barrier or cancel marker."""
    aborted: bool = False


class AtLeastOnceBarrierTracker(BarrierHandler):
    """At least once: count barriers per checkpoint, never block."""

    def __init__(
        self, num_channels: int, max_pending: int = DEFAULT_MAX_PENDING_CHECKPOINTS
    ) -> None:
        super().__init__(num_channels)
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, not {max_pending}")
        self.max_pending = max_pending
        self._pending: dict[int, _Tracked] = {}  # ascending ids (insertion order)
        self._latest_id = -1  # below every valid id, as in Flink

    def pending_checkpoint_ids(self) -> tuple[int, ...]:
        """Tracked checkpoints (aborted ones included), ascending."""
        return tuple(self._pending)

    def check_invariants(self) -> None:
        ids = list(self._pending)
        assert ids == sorted(set(ids)), "tracked ids not ascending"
        assert len(ids) <= self.max_pending, "too many tracked checkpoints"
        assert all(0 <= i <= self._latest_id for i in ids)
        for cid, t in self._pending.items():
            assert cid == t.checkpoint_id
            assert t.arrived, "a tracked checkpoint without any barrier or marker"
            assert t.arrived <= set(range(self.num_channels))
            assert not self._open <= t.arrived, "a complete checkpoint is still tracked"
            assert t.aborted or (t.barrier is not None and t.barrier.checkpoint_id == cid)

    def on_barrier(self, channel: int, barrier: Barrier, now_ms: int) -> list[Action]:
        self._check_channel(channel)
        if barrier.options.is_unaligned:
            raise ValueError(
                "an UNALIGNED barrier reached an at-least-once input gate: it may have overtaken "
                "data that an at-least-once snapshot would miss"
            )
        self._check_id(barrier.checkpoint_id)
        if channel not in self._open:
            return []
        cid = barrier.checkpoint_id
        t = self._pending.get(cid)
        if t is None:
            if cid <= self._latest_id:
                return []  # completed, dropped or evicted
            t = self._track(_Tracked(cid, barrier, now_ms))
        elif channel in t.arrived:
            return []
        t.arrived.add(channel)
        return self._settle(now_ms) + self._evict()

    def on_cancel_marker(self, channel: int, checkpoint_id: int, now_ms: int) -> list[Action]:
        self._check_channel(channel)
        self._check_id(checkpoint_id)
        if channel not in self._open:
            return []
        actions: list[Action] = []
        # Older tracked checkpoints cannot complete any more: abort them now, ascending.
        for older in [cid for cid in self._pending if cid < checkpoint_id]:
            if not self._pending.pop(older).aborted:
                actions.append(AbortCheckpoint(older, BarrierAbortReason.CANCELED_BY_MARKER))
        t = self._pending.get(checkpoint_id)
        if t is None:
            if checkpoint_id <= self._latest_id:
                return actions  # a trailing marker: completed, dropped or evicted already
            t = self._track(_Tracked(checkpoint_id, None, now_ms))
        if not t.aborted:
            t.aborted = True
            actions.append(AbortCheckpoint(checkpoint_id, BarrierAbortReason.CANCELED_BY_MARKER))
        t.arrived.add(channel)
        return actions + self._settle(now_ms) + self._evict()

    def on_end_of_partition(self, channel: int, now_ms: int) -> list[Action]:
        if not self._close(channel):
            return []
        return self._settle(now_ms)

    def _track(self, t: _Tracked) -> _Tracked:
        self._latest_id = t.checkpoint_id
        self._pending[t.checkpoint_id] = t
        return t

    def _settle(self, now_ms: int) -> list[Action]:
        """Trigger the newest checkpoint whose barriers all arrived (unless aborted) and drop
        every older one silently, complete or not: Flink's ``processBarrier`` and
        ``checkAlignmentOnEndOfPartitionIfEnabled`` (an end of partition can complete several
        at once; only the newest triggers)."""
        complete = [cid for cid, t in self._pending.items() if self._open <= t.arrived]
        if not complete:
            return []
        newest = complete[-1]
        for cid in [i for i in self._pending if i < newest]:
            del self._pending[cid]
        t = self._pending.pop(newest)
        if t.aborted:
            return []
        assert t.barrier is not None
        trigger = TriggerSnapshot(
            newest,
            t.barrier.timestamp_ms,
            t.barrier.options,
            unaligned=False,
            alignment_duration_ms=max(0, now_ms - t.first_arrival_ms),
            start_delay_ms=_start_delay_ms(t.barrier, t.first_arrival_ms),
        )
        return [trigger, CheckpointCompleteOnInput(newest)]

    def _evict(self) -> list[Action]:
        actions: list[Action] = []
        while len(self._pending) > self.max_pending:
            oldest = next(iter(self._pending))
            t = self._pending.pop(oldest)
            if not t.aborted:
                actions.append(AbortCheckpoint(oldest, BarrierAbortReason.TOO_MANY_PENDING))
        return actions


def create_barrier_handler(
    mode: CheckpointMode,
    num_channels: int,
    max_pending: int = DEFAULT_MAX_PENDING_CHECKPOINTS,
) -> BarrierHandler:
    """The barrier handler of an input gate for a job whose checkpointing mode is ``mode``."""
    if mode is CheckpointMode.AT_LEAST_ONCE:
        return AtLeastOnceBarrierTracker(num_channels, max_pending)
    return SingleCheckpointBarrierHandler(num_channels)
