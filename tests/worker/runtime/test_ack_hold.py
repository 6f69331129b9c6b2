"""``AckHold`` (worker/runtime/ack_hold.py), the pure hold rule of an agent's acks, as exact
sequences: what each ack, decline, subtask end and deadline lets go. The acks are strings
naming subtask and checkpoint (``"src1"``: the source's ack of checkpoint 1)."""

from __future__ import annotations

from snapflow.worker.runtime.ack_hold import AckHold

JOB = "j" * 32
OTHER_JOB = "k" * 32
SRC = ("src", 0, 1)
MAP = ("map", 0, 1)
SINK = ("sink", 0, 1)


def hold(*subtasks: tuple[str, int, int], job: str = JOB, max_hold_s: float = 3.0) -> AckHold[str]:
    h: AckHold[str] = AckHold(max_hold_s)
    for s in subtasks:
        h.start(job, s)
    return h


def test_the_first_ack_waits_and_the_second_sends_both_in_one_group() -> None:
    h = hold(SRC, SINK)
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == []
    assert h.held == 1
    assert h.ack(JOB, SINK, 1, "sink1", now=0.04) == ["src1", "sink1"]
    assert h.held == 0
    assert h.next_deadline() is None


def test_the_group_waits_for_every_running_peer() -> None:
    h = hold(SRC, MAP, SINK)
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == []
    assert h.ack(JOB, MAP, 1, "map1", now=0.01) == []
    assert h.ack(JOB, SINK, 1, "sink1", now=0.02) == ["src1", "map1", "sink1"]


def test_a_decline_of_the_awaited_peer_releases_the_held_ack() -> None:
    h = hold(SRC, SINK)
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == []
    assert h.decline(JOB, SINK, 1) == ["src1"]
    assert h.held == 0


def test_a_decline_of_a_later_checkpoint_releases_the_earlier_ones_too() -> None:
    h = hold(SRC, SINK)
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == []
    assert h.ack(JOB, SRC, 2, "src2", now=0.1) == []
    assert h.decline(JOB, SINK, 2) == ["src1", "src2"]


def test_a_peer_that_ends_releases_what_waited_for_it() -> None:
    h = hold(SRC, SINK)
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == []
    assert h.end(JOB, SINK) == ["src1"]
    # and it is not waited for any more
    assert h.ack(JOB, SRC, 2, "src2", now=0.1) == ["src2"]


def test_an_ended_peer_is_never_waited_for() -> None:
    h = hold(SRC, SINK)
    assert h.end(JOB, SINK) == []
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == ["src1"]


def test_the_end_of_one_of_two_awaited_peers_keeps_the_group_waiting_for_the_other() -> None:
    h = hold(SRC, MAP, SINK)
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == []
    assert h.end(JOB, MAP) == []
    assert h.ack(JOB, SINK, 1, "sink1", now=0.02) == ["src1", "sink1"]


def test_the_held_ack_of_a_subtask_that_ended_still_goes_with_its_group() -> None:
    h = hold(SRC, SINK)
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == []
    assert h.end(JOB, SRC) == []  # its own ack waits for the sink still
    assert h.ack(JOB, SINK, 1, "sink1", now=0.02) == ["src1", "sink1"]


def test_different_checkpoints_are_held_and_released_independently() -> None:
    h = hold(SRC, SINK)
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == []
    assert h.ack(JOB, SRC, 2, "src2", now=0.1) == []
    assert h.held == 2
    assert h.ack(JOB, SINK, 1, "sink1", now=0.15) == ["src1", "sink1"]
    assert h.held == 1
    assert h.ack(JOB, SINK, 2, "sink2", now=0.2) == ["src2", "sink2"]


def test_a_peer_that_acks_a_later_checkpoint_first_is_not_awaited_for_the_earlier_one() -> None:
    h = hold(SRC, SINK)
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == []
    assert h.ack(JOB, SRC, 2, "src2", now=0.1) == []
    # The sink's ack of 2 overtook its ack of 1 (asynchronous parts can end out of order).
    assert h.ack(JOB, SINK, 2, "sink2", now=0.2) == ["src1", "src2", "sink2"]
    assert h.ack(JOB, SINK, 1, "sink1", now=0.21) == ["sink1"]


def test_other_jobs_never_wait_for_each_other() -> None:
    h = hold(SRC, SINK)
    h.start(OTHER_JOB, SRC)
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == []
    assert h.ack(OTHER_JOB, SRC, 1, "other-src1", now=0.0) == ["other-src1"]
    assert h.end(OTHER_JOB, SRC) == []
    assert h.ack(JOB, SINK, 1, "sink1", now=0.01) == ["src1", "sink1"]


def test_an_untracked_subtask_acks_at_once_and_holds_nothing() -> None:
    h = hold(SRC, SINK)
    assert h.ack(JOB, ("elsewhere", 0, 1), 1, "x1", now=0.0) == ["x1"]
    assert h.decline(JOB, ("elsewhere", 0, 1), 1) == []
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == []  # still waits for the sink


def test_a_lone_subtask_acks_at_once() -> None:
    h = hold(SRC)
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == ["src1"]
    assert h.held == 0


def test_the_bound_releases_a_group_whoever_it_still_awaits() -> None:
    h = hold(SRC, SINK, max_hold_s=3.0)
    assert h.ack(JOB, SRC, 1, "src1", now=10.0) == []
    assert h.next_deadline() == 13.0
    assert h.ack(JOB, SRC, 2, "src2", now=11.0) == []
    assert h.next_deadline() == 13.0  # the oldest group's
    assert h.expire(12.999) == []
    assert h.expire(13.0) == ["src1"]
    assert h.next_deadline() == 14.0
    # The late ack of checkpoint 1 goes alone: its peer's went already.
    assert h.ack(JOB, SINK, 1, "sink1", now=13.5) == ["sink1"]
    assert h.expire(14.0) == ["src2"]
    assert h.next_deadline() is None


def test_an_ack_joining_a_group_keeps_its_first_deadline() -> None:
    h = hold(SRC, MAP, SINK, max_hold_s=1.0)
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == []
    assert h.ack(JOB, MAP, 1, "map1", now=0.9) == []
    assert h.expire(1.0) == ["src1", "map1"]


def test_release_all_lets_everything_go_in_checkpoint_order() -> None:
    h = hold(SRC, SINK)
    assert h.ack(JOB, SRC, 2, "src2", now=0.0) == []
    assert h.ack(JOB, SRC, 1, "src1", now=0.0) == []
    assert h.release_all() == ["src1", "src2"]
    assert h.held == 0 and h.next_deadline() is None


def test_a_new_deployment_is_not_held_by_the_old_one() -> None:
    old_src, old_sink = ("src", 0, 1), ("sink", 0, 1)
    new_src, new_sink = ("src", 0, 2), ("sink", 0, 2)
    h = hold(old_src, old_sink)
    assert h.ack(JOB, old_src, 4, "old-src4", now=0.0) == []
    assert h.end(JOB, old_src) == []
    assert h.end(JOB, old_sink) == ["old-src4"]
    h.start(JOB, new_src)
    h.start(JOB, new_sink)
    assert h.ack(JOB, new_src, 5, "src5", now=1.0) == []
    assert h.ack(JOB, new_sink, 5, "sink5", now=1.01) == ["src5", "sink5"]


def test_an_abort_notice_releases_the_acks_held_for_that_checkpoint_only() -> None:
    """The coordinator aborted 2 (a subtask drops it without declining): its held acks go at
    once, not after the bound; another checkpoint's and another job's stay held."""
    h = hold(SRC, SINK)
    h.start(OTHER_JOB, SRC)
    h.start(OTHER_JOB, SINK)
    assert h.ack(JOB, SRC, 2, "src2", now=0.0) == []
    assert h.ack(JOB, SRC, 3, "src3", now=0.1) == []
    assert h.ack(OTHER_JOB, SRC, 2, "other2", now=0.1) == []
    assert h.aborted(JOB, 2) == ["src2"]
    assert h.aborted(JOB, 2) == []
    assert h.held == 2
    assert h.ack(JOB, SINK, 3, "sink3", now=0.2) == ["src3", "sink3"]
