"""The watermark valve: minimum over an input's channels, then over the inputs; ended channels
never hold the others back. Exact sequences, invariants after every step."""

from __future__ import annotations

import pytest

from snapflow.event_time import MAX_WATERMARK
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
