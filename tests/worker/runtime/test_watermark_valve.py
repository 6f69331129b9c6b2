"""The watermark valve: minimum over an input's channels, then over the inputs; ended channels
never hold the others back; idle channels and inputs (Flink's ``WatermarkStatus``) neither.
Exact sequences, invariants after every step."""

from __future__ import annotations

import random

import pytest

from snapflow.event_time import MAX_WATERMARK, MIN_WATERMARK
from snapflow.worker.runtime.input_channel import InputChannel
from snapflow.worker.runtime.input_gate import InputGate
from snapflow.worker.runtime.watermark_valve import WatermarkValve


def test_one_input_advances_with_its_slowest_channel() -> None:
    valve = WatermarkValve([0, 0])
    assert valve.on_watermark(0, 10) is None  # channel 1 has none yet
    assert valve.on_watermark(1, 5) == 5
    assert valve.on_watermark(1, 4) is None  # a channel's watermark only rises
    assert valve.on_watermark(1, 20) == 10
    valve.check_invariants()
    assert valve.on_channel_ended(0) == 20
    assert valve.on_channel_ended(1) == MAX_WATERMARK
    valve.check_invariants()


def test_two_inputs_take_the_minimum_of_their_minimums() -> None:
    valve = WatermarkValve([0, 1, 1])
    assert valve.on_watermark(0, 100) is None
    assert valve.on_watermark(1, 30) is None  # input 1's channel 2 has none yet
    assert valve.on_watermark(2, 50) == 30
    assert (valve.input_watermark(0), valve.input_watermark(1)) == (100, 30)
    assert valve.on_watermark(1, 200) == 50
    assert valve.on_channel_ended(2) == 100  # input 1 at 200 now; input 0 holds at 100
    valve.check_invariants()


def test_an_input_that_ended_does_not_hold_the_other_back() -> None:
    valve = WatermarkValve([0, 1])
    assert valve.on_watermark(1, 7) is None
    assert valve.on_channel_ended(0) == 7


def test_inputs_are_numbered_without_gaps() -> None:
    with pytest.raises(ValueError, match="without gaps"):
        WatermarkValve([0, 2])


def test_the_gate_numbers_inputs_and_refuses_a_bad_mapping() -> None:
    gate = InputGate([InputChannel(1) for _ in range(3)], input_of=[0, 1, 0])
    assert (gate.num_inputs, gate.channels_of(0), gate.channels_of(1)) == (2, [0, 2], [1])
    assert InputGate([InputChannel(1)]).num_inputs == 1
    with pytest.raises(ValueError, match="names 1 channels, the gate has 2"):
        InputGate([InputChannel(1), InputChannel(1)], input_of=[0])
    with pytest.raises(ValueError, match="without gaps"):
        InputGate([InputChannel(1), InputChannel(1)], input_of=[1, 1])


# --- idleness (Flink's StatusWatermarkValve) -----------------------------------------------


class Valve:
    """A valve whose invariants are checked after every step; every watermark it returns must
    rise, and none may come while the task was and stays idle."""

    def __init__(self, input_of: list[int]) -> None:
        self.v = WatermarkValve(input_of)
        self.last = MIN_WATERMARK
        self.v.check_invariants()

    def _step(self, was_idle: bool, out: int | None) -> int | None:
        self.v.check_invariants()
        if out is not None:
            assert out > self.last
            assert not (was_idle and self.v.idle), "a watermark while the task is idle"
            self.last = out
        return out

    def wm(self, channel: int, ts: int) -> int | None:
        was = self.v.idle
        return self._step(was, self.v.on_watermark(channel, ts))

    def status(self, channel: int, idle: bool) -> int | None:
        was = self.v.idle
        return self._step(was, self.v.on_status(channel, idle))

    def end(self, channel: int) -> int | None:
        was = self.v.idle
        return self._step(was, self.v.on_channel_ended(channel))


def test_an_idle_channel_does_not_hold_its_input_back() -> None:
    v = Valve([0, 0])
    assert v.wm(0, 10) is None  # channel 1 has none yet
    assert v.status(1, idle=True) == 10
    assert not v.v.idle and not v.v.is_input_idle(0)
    assert v.wm(0, 20) == 20


def test_watermarks_on_an_idle_channel_are_ignored() -> None:
    v = Valve([0, 0])
    assert v.status(1, idle=True) is None
    assert v.wm(1, 50) is None
    assert v.wm(0, 10) == 10  # channel 1's 50 was not taken
    assert v.status(1, idle=False) is None
    assert v.wm(0, 30) == 30  # channel 1 (at MIN) is behind: not aligned, holds nothing


def test_a_channel_active_again_behind_is_aligned_only_once_it_caught_up() -> None:
    v = Valve([0, 0])
    assert v.wm(0, 10) is None
    assert v.wm(1, 5) == 5
    assert v.status(1, idle=True) == 10
    assert v.wm(0, 20) == 20
    assert v.status(1, idle=False) is None  # at 5, behind 20: never moves the watermark back
    assert v.wm(1, 15) is None  # still behind
    assert v.wm(0, 25) == 25
    assert v.wm(1, 30) is None  # caught up: aligned again, at 30
    assert v.wm(0, 40) == 30  # and holds its input back again
    assert v.wm(1, 45) == 40


def test_a_channel_active_again_ahead_is_aligned_at_once() -> None:
    v = Valve([0, 0])
    assert v.wm(1, 50) is None
    assert v.wm(0, 10) == 10
    assert v.status(1, idle=True) is None  # it was not the one holding the input
    assert v.status(1, idle=False) is None  # 50 >= 10: aligned at once
    assert v.wm(0, 60) == 50


def test_the_last_channel_going_idle_flushes_its_input_then_the_task_idles() -> None:
    v = Valve([0, 0])
    assert v.wm(0, 10) is None
    assert v.wm(1, 20) == 10
    assert v.status(1, idle=True) is None  # 20 was not holding anything
    assert not v.v.idle
    # Channel 0 held the watermark and now nothing can: the highest watermark goes out, then
    # the task is idle (the loop forwards it in that order).
    assert v.status(0, idle=True) == 20
    assert v.v.idle and v.v.is_input_idle(0)
    assert v.wm(0, 30) is None  # idle: ignored
    assert v.status(0, idle=False) is None
    assert not v.v.idle
    assert v.wm(0, 30) == 30


def test_the_task_is_idle_only_when_every_input_is() -> None:
    v = Valve([0, 1])
    assert v.status(0, idle=True) is None
    assert v.v.is_input_idle(0) and not v.v.idle
    assert v.wm(1, 50) == 50  # an idle input does not hold the other back
    assert v.status(1, idle=True) is None
    assert v.v.idle
    assert v.status(0, idle=False) is None
    assert not v.v.idle
    assert v.wm(0, 40) is None  # active again behind the task's 50: never back
    assert v.wm(0, 60) == 60


def test_an_input_active_again_behind_holds_the_task_until_it_caught_up() -> None:
    """Across inputs (Flink's combined watermark of a two-input operator) an input that comes
    back behind holds the task's watermark where it is; within an input (Flink's valve) a
    channel that comes back behind does not (see the channel test above)."""
    v = Valve([0, 1])
    assert v.wm(0, 10) is None
    assert v.status(1, idle=True) == 10
    assert v.wm(0, 30) == 30
    assert v.status(1, idle=False) is None
    assert v.wm(0, 50) is None  # input 1 is back, at MIN: the task stays at 30
    assert v.wm(1, 20) is None
    assert v.wm(1, 40) == 40
    assert v.wm(1, 70) == 50


def test_an_input_going_idle_lets_the_others_advance_at_once() -> None:
    v = Valve([0, 1, 1])
    assert v.wm(0, 100) is None
    assert v.wm(1, 10) is None
    assert v.wm(2, 20) == 10
    assert v.status(2, idle=True) is None
    assert v.status(1, idle=True) == 100  # input 1 flushed to 20, then idle: input 0 alone
    assert not v.v.idle
    assert v.v.input_watermark(1) == 20


def test_an_ended_channel_counts_as_active_at_the_maximum_watermark() -> None:
    v = Valve([0, 1])
    assert v.status(0, idle=True) is None
    assert v.status(1, idle=True) is None
    assert v.v.idle
    assert v.end(0) == MAX_WATERMARK  # active again (first), then the maximum watermark
    assert not v.v.idle
    assert v.status(0, idle=True) is None  # nothing more comes from an ended channel
    assert not v.v.is_channel_idle(0)


def test_repeated_statuses_change_nothing() -> None:
    v = Valve([0, 0])
    assert v.status(0, idle=False) is None
    assert v.wm(0, 5) is None
    assert v.status(1, idle=True) == 5
    assert v.status(1, idle=True) is None
    assert v.v.is_channel_idle(1) and not v.v.is_channel_idle(0)


@pytest.mark.parametrize("seed", range(20))
def test_random_events_keep_the_invariants(seed: int) -> None:
    """Random watermarks, statuses and ends on three inputs. Without idleness the valve is the
    plain minimum over every channel."""
    rng = random.Random(seed)
    input_of = [0, 0, 1, 2, 2, 2]
    v = Valve(input_of)
    plain = Valve(input_of)
    latest = [MIN_WATERMARK] * len(input_of)
    ended: set[int] = set()
    for _ in range(300):
        c = rng.randrange(len(input_of))
        roll = rng.random()
        if roll < 0.75:
            ts = rng.randrange(0, 1_000)
            v.wm(c, ts)
            if c not in ended:
                latest[c] = max(latest[c], ts)
            plain.wm(c, ts)
        elif roll < 0.97:
            v.status(c, idle=rng.random() < 0.5)
        elif c not in ended:
            ended.add(c)
            latest[c] = MAX_WATERMARK
            v.end(c)
            plain.end(c)
        assert plain.v.current == min(latest)
    assert v.v.current <= max(latest)
