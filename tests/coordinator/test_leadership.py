"""The leader election core (coordinator/leadership.py): exact event sequences, invariants
after every step, and the timing argument (a leader steps down before its lease can lapse)
checked against a model of Redis's expiry over seeded random runs."""

from __future__ import annotations

import random

import pytest

from snapflow.coordinator.leadership import (
    Action,
    Lead,
    LeaderElection,
    LeadershipRole,
    LeaseTiming,
    Release,
    Renew,
    StepDown,
    TryAcquire,
)

TIMING = LeaseTiming(ttl_s=5.0, renew_interval_s=1.0)
ME = "10.0.0.1:50051"
OTHER = "10.0.0.2:50051"


def step(core: LeaderElection, actions: list[Action]) -> list[Action]:
    core.check_invariants()
    return actions


def leading(epoch: int = 7) -> LeaderElection:
    """A core that won ``epoch`` with an acquisition sent at t=0."""
    core = LeaderElection(TIMING, ME, now=0.0)
    assert step(core, core.tick(0.0)) == [TryAcquire()]
    assert step(core, core.acquired(0.01, epoch)) == [Lead(epoch)]
    return core


def test_a_sole_candidate_leads_and_renews_every_interval() -> None:
    core = leading()
    assert (core.role, core.epoch, core.leader_address) == (LeadershipRole.LEADER, 7, ME)
    assert core.step_down_at() == 4.0  # sent at 0 + ttl 5 - interval 1
    assert core.next_wakeup() == 1.0
    assert step(core, core.tick(0.5)) == []
    assert step(core, core.tick(1.0)) == [Renew(7)]
    assert core.next_wakeup() == 4.0  # a request is out: only the deadline
    assert step(core, core.renewed(1.02)) == []
    assert core.step_down_at() == 5.0  # from the renewal's send time, not its answer
    assert step(core, core.tick(2.0)) == [Renew(7)]
    assert step(core, core.renewed(2.5)) == []
    assert core.step_down_at() == 6.0


def test_failed_renewals_step_down_at_the_deadline_even_with_a_request_hanging() -> None:
    core = leading()
    assert step(core, core.tick(1.0)) == [Renew(7)]
    assert step(core, core.failed(1.1, "UnavailableError: Redis down")) == []
    assert step(core, core.tick(2.0)) == [Renew(7)]
    assert step(core, core.failed(2.05, "UnavailableError: Redis down")) == []
    assert step(core, core.tick(3.0)) == [Renew(7)]  # this one hangs
    assert step(core, core.tick(3.999)) == []
    actions = step(core, core.tick(4.0))
    assert len(actions) == 1 and isinstance(actions[0], StepDown)
    assert actions[0].epoch == 7
    assert "not renewed within 4 s" in actions[0].reason
    assert (core.role, core.leader_address, core.step_down_at()) == (
        LeadershipRole.STANDBY,
        "",
        None,
    )
    # the hanging renewal comes back late: ignored; the standby tries to acquire at once
    assert step(core, core.renewed(4.2)) == [TryAcquire()]
    assert step(core, core.acquired(4.25, 8)) == [Lead(8)]  # its own lease: a new term
    assert (core.role, core.epoch, core.step_down_at()) == (LeadershipRole.LEADER, 8, 8.2)


def test_a_timed_out_renewal_steps_down_and_the_rewon_lease_is_a_new_term_that_renews() -> None:
    """The chaos run's sequence: under load a renewal times out (the shell's bound), the
    deadline passes, the leader steps down, then wins its own lease back: the new term must
    start (Lead) and be renewed with its own epoch, and a resignation must retry."""
    core = leading(30)
    assert step(core, core.tick(1.0)) == [Renew(30)]
    assert step(core, core.tick(3.0)) == []  # the renewal hangs: nothing else is sent
    assert step(core, core.failed(3.5, "TimeoutError: ")) == [Renew(30)]
    actions = step(core, core.tick(4.0))  # deadline: 0 + ttl 5 - interval 1
    assert [type(a) for a in actions] == [StepDown]
    assert "last error: TimeoutError" in actions[0].reason  # type: ignore[union-attr]
    # the retry renewal succeeded in Redis but answers after the step-down: a standby now
    assert step(core, core.renewed(4.3)) == [TryAcquire()]
    assert core.role is LeadershipRole.STANDBY and core.next_wakeup() is None
    assert step(core, core.acquired(4.4, 31)) == [Lead(31)]
    assert (core.role, core.epoch, core.leader_epoch, core.step_down_at()) == (
        LeadershipRole.LEADER,
        31,
        31,
        8.3,
    )
    assert step(core, core.tick(5.3)) == [Renew(31)]
    assert step(core, core.renewed(5.35)) == []
    assert core.step_down_at() == 9.3
    # the shell could not lead epoch 31 (its task failed): give the lease up, retry later
    assert step(core, core.resign(5.5, "leading epoch 31 failed")) == [
        StepDown(31, "leading epoch 31 failed"),
        Release(31),
    ]
    assert core.next_wakeup() == 6.5
    assert step(core, core.tick(6.5)) == [TryAcquire()]
    assert step(core, core.acquired(6.6, 32)) == [Lead(32)]


def test_a_standby_follows_the_holder_and_takes_over_when_the_lease_is_free() -> None:
    core = LeaderElection(TIMING, ME, now=10.0)
    assert step(core, core.tick(10.0)) == [TryAcquire()]
    assert step(core, core.held_by(10.01, OTHER, 3)) == []
    assert (core.role, core.leader_address, core.leader_epoch) == (LeadershipRole.STANDBY, OTHER, 3)
    assert core.next_wakeup() == 11.0
    assert step(core, core.tick(10.9)) == []
    assert step(core, core.tick(11.0)) == [TryAcquire()]
    assert step(core, core.failed(11.5, "TimeoutError")) == []
    assert core.last_error == "TimeoutError"
    assert step(core, core.tick(12.0)) == [TryAcquire()]
    assert step(core, core.acquired(12.01, 4)) == [Lead(4)]
    assert (core.role, core.leader_address, core.leader_epoch) == (LeadershipRole.LEADER, ME, 4)


def test_a_lost_lease_steps_down_and_names_the_new_holder() -> None:
    core = leading()
    assert step(core, core.tick(1.0)) == [Renew(7)]
    actions = step(core, core.lost(1.01, OTHER, 9))
    assert actions == [
        StepDown(
            7,
            f"the leader lease of epoch 7 was lost (the lease is held by {OTHER}; "
            "the current epoch is 9)",
        )
    ]
    assert (core.role, core.leader_address, core.leader_epoch) == (LeadershipRole.STANDBY, OTHER, 9)
    assert step(core, core.tick(1.5)) == []
    assert step(core, core.tick(2.0)) == [TryAcquire()]  # one interval after the renewal


def test_an_acquisition_answered_too_late_is_released_and_tried_again() -> None:
    core = LeaderElection(TIMING, ME, now=0.0)
    assert step(core, core.tick(0.0)) == [TryAcquire()]
    # sent at 0, answered at 4: another standby may win at 5 -> do not lead on it
    assert step(core, core.acquired(4.0, 5)) == [Release(5), TryAcquire()]
    assert core.role is LeadershipRole.STANDBY
    assert step(core, core.acquired(4.01, 6)) == [Lead(6)]
    assert core.step_down_at() == 8.0


def test_superseded_resign_and_stop() -> None:
    core = leading()
    actions = step(core, core.superseded(0.5, "stale epoch: 9 in Redis"))
    assert actions == [StepDown(7, "stale epoch: 9 in Redis")]
    assert (core.role, core.leader_address) == (LeadershipRole.STANDBY, "")
    assert step(core, core.superseded(0.6, "again")) == []  # only a leader steps down
    assert step(core, core.tick(1.5)) == [TryAcquire()]
    assert step(core, core.acquired(1.6, 10)) == [Lead(10)]
    assert step(core, core.resign(1.7, "recovery failed")) == [
        StepDown(10, "recovery failed"),
        Release(10),
    ]
    assert step(core, core.tick(2.7)) == [TryAcquire()]
    assert step(core, core.acquired(2.8, 11)) == [Lead(11)]
    assert step(core, core.tick(3.7)) == [Renew(11)]
    assert step(core, core.stop(3.8)) == [
        StepDown(11, "the coordinator is stopping"),
        Release(11),
    ]
    assert core.role is LeadershipRole.STOPPED and core.next_wakeup() is None
    assert step(core, core.renewed(3.9)) == []
    assert step(core, core.tick(100.0)) == []


def test_an_acquisition_won_after_stop_is_released() -> None:
    core = LeaderElection(TIMING, ME, now=0.0)
    assert step(core, core.tick(0.0)) == [TryAcquire()]
    assert step(core, core.stop(0.1)) == []
    assert step(core, core.acquired(0.2, 3)) == [Release(3)]
    assert core.role is LeadershipRole.STOPPED


def test_answers_without_a_request_are_shell_bugs() -> None:
    core = LeaderElection(TIMING, ME, now=0.0)
    with pytest.raises(ValueError, match="no renew request"):
        core.renewed(0.0)
    with pytest.raises(ValueError, match="no request"):
        core.failed(0.0, "x")
    assert core.tick(0.0) == [TryAcquire()]
    with pytest.raises(ValueError, match="no renew request"):
        core.lost(0.1, OTHER, 2)


@pytest.mark.parametrize(
    ("ttl", "interval", "message"),
    [(2.0, 1.0, "at least 3 times"), (5.0, 0.0, "must be > 0"), (float("inf"), 1.0, "3 times")],
)
def test_timing_is_validated(ttl: float, interval: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LeaseTiming(ttl, interval)


@pytest.mark.parametrize("seed", range(20))
def test_the_leader_steps_down_before_redis_can_expire_its_lease(seed: int) -> None:
    """Random answers and delays. Model: a request sent at s is executed by Redis at some
    r in [s, answer time]; a successful one sets expiry r + ttl. Whenever the core leads, its
    deadline is at least one interval before that expiry, and at the deadline it has stepped
    down (so when a standby can win, at the expiry, this one acts no more)."""
    rng = random.Random(seed)
    core = LeaderElection(TIMING, ME, now=0.0)
    now = 0.0
    out: tuple[str, float] | None = None  # (kind, sent at)
    expiry = float("-inf")
    epoch = 0
    for _ in range(400):
        now += rng.choice([0.05, 0.3, 0.7, 1.0, 1.5])
        if out is not None and rng.random() < 0.7:
            kind, sent = out
            out = None
            executed = rng.uniform(sent, now)
            outcome = rng.random()
            if kind == "acquire":
                if outcome < 0.5 and executed >= expiry:
                    epoch += 1
                    expiry = executed + TIMING.ttl_s
                    actions = core.acquired(now, epoch)
                elif outcome < 0.8:
                    actions = core.held_by(now, OTHER, epoch)
                else:
                    actions = core.failed(now, "Redis down")
            elif outcome < 0.6 and executed < expiry:
                expiry = executed + TIMING.ttl_s
                actions = core.renewed(now)
            elif outcome < 0.8:
                actions = core.lost(now, OTHER, epoch + 1)
            else:
                actions = core.failed(now, "Redis down")
        else:
            actions = core.tick(now)
        core.check_invariants()
        for action in actions:
            if isinstance(action, TryAcquire):
                out = ("acquire", now)
            elif isinstance(action, Renew):
                out = ("renew", now)
        deadline = core.step_down_at()
        if core.is_leader:
            assert deadline is not None
            assert deadline <= expiry - TIMING.renew_interval_s + 1e-9
            assert now < deadline
