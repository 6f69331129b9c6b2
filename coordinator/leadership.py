"""Leader election of highly available coordinators: a pure core (no Redis, no clock).

Several ``snapflow coordinator`` processes share one Redis (``high_availability = "redis"``).
One of them, the leader, holds a lease in Redis: a key with a time to live (``lease_ttl_s``)
that the leader renews every ``lease_renew_interval_s``. Winning the lease and taking the
fencing epoch are one atomic step (``CheckpointStore.try_acquire_lease``), so the epoch is
only ever taken by a coordinator that has bound its ports (the shell starts the election after
the bind) and won the lease. The others are standbys: they answer health as NOT_SERVING,
refuse coordinator RPCs with UNAVAILABLE naming the leader, and try to acquire the lease every
renew interval; they win once it has lapsed in Redis.

**Why a leader stops acting before a standby can take over.** Let a renewal (or the
acquisition) be sent at local monotonic time ``s`` and succeed. Redis runs it at some time
``r >= s`` (a request is not executed before it is sent) and sets the key to expire at
``r + ttl``. The leader stops acting (``StepDown``) at ``s + ttl - renew_interval`` by its
own clock unless a later renewal succeeded. A standby can win only once the key has expired,
at ``r + ttl >= s + ttl`` or later. So the leader steps down at least one renew interval
before any standby can win, provided (1) the leader's clock and Redis's run at the same rate
within ``renew_interval / ttl`` (20 % with the defaults; real clocks differ by parts per
million) and (2) the leader's event loop runs its timer less than one renew interval late.
Whatever breaks these assumptions (a process paused by SIGSTOP or a VM migration, a wall
clock step on the Redis host, which expires keys by wall clock) is caught by the fencing
epoch: the new leader's epoch is higher, so every Redis mutation of the old one fails
(``StaleEpochError``) and agents refuse its commands once they have seen the newer epoch.
The lease keeps two coordinators from *acting* at the same time in the normal case; the epoch
keeps a stale one from *changing* anything in every case.

Events (methods) take the current time ``now`` (monotonic seconds, injected) and return
actions, which the shell (``coordinator.leader_election``) executes in order:

- ``TryAcquire``: run the acquire script; report ``acquired`` / ``held_by`` / ``failed``;
- ``Renew(epoch)``: run the renew script; report ``renewed`` / ``lost`` / ``failed``;
- ``Lead(epoch)``: start leading with this epoch (recover the jobs, open the gate, SERVING);
  report ``resign`` if that fails;
- ``StepDown(epoch, reason)``: stop acting now (fence the job manager, close the gate,
  NOT_SERVING);
- ``Release(epoch)``: delete the lease if it is still this term's (a graceful stop, or a
  resignation), so that a standby takes over at its next attempt instead of after the TTL.

At most one acquire or renew request is outstanding; the shell bounds each by a timeout of
one renew interval, so a result (``failed`` at worst) always comes back.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Action",
    "Lead",
    "LeaderElection",
    "LeadershipRole",
    "LeaseTiming",
    "Release",
    "Renew",
    "StepDown",
    "TryAcquire",
]


class LeadershipRole(enum.Enum):
    """Where this coordinator stands in the leader election (not a caller's access role:
    that is ``snapflow.security.CallerRole``)."""

    STANDBY = "standby"
    LEADER = "leader"
    STOPPED = "stopped"


@dataclass(frozen=True)
class LeaseTiming:
    """The lease's time to live and renew interval, in seconds."""

    ttl_s: float
    """How long the lease lives in Redis after the last renewal."""

    renew_interval_s: float
    """How often the leader renews (and a standby tries to acquire); also the leader's safety
    margin: it steps down this long before the lease can expire."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.renew_interval_s) and self.renew_interval_s > 0):
            raise ValueError(f"renew_interval_s must be > 0, got {self.renew_interval_s}")
        if not (math.isfinite(self.ttl_s) and self.ttl_s >= 3 * self.renew_interval_s):
            # ttl - interval >= 2 intervals: at least one renewal is retried before stepping down
            raise ValueError(
                f"ttl_s ({self.ttl_s}) must be at least 3 times renew_interval_s "
                f"({self.renew_interval_s})"
            )

    @property
    def step_down_after_s(self) -> float:
        """The leader steps down this long after sending its last successful renewal."""
        return self.ttl_s - self.renew_interval_s

    @property
    def ttl_ms(self) -> int:
        return math.ceil(self.ttl_s * 1000)


@dataclass(frozen=True)
class TryAcquire:
    """Run the acquire script (wins the lease and a new epoch if the lease is free)."""


@dataclass(frozen=True)
class Renew:
    """Run the renew script for this epoch's lease."""

    epoch: int


@dataclass(frozen=True)
class Lead:
    """Start leading with ``epoch``."""

    epoch: int


@dataclass(frozen=True)
class StepDown:
    """Stop acting as the leader of ``epoch`` now."""

    epoch: int
    reason: str


@dataclass(frozen=True)
class Release:
    """Delete the lease if it is still ``epoch``'s."""

    epoch: int


Action = TryAcquire | Renew | Lead | StepDown | Release


class LeaderElection:
    """One coordinator's side of the election. Starts as a standby that tries at once."""

    def __init__(self, timing: LeaseTiming, address: str, now: float) -> None:
        self.timing = timing
        self.address = address
        self._role = LeadershipRole.STANDBY
        self._epoch = 0
        self._in_flight: Literal["acquire", "renew"] | None = None
        self._sent_at = now
        self._lease_from = now
        self._next_attempt_at = now
        self._step_down_at: float | None = None
        self._leader_address = ""
        self._leader_epoch = 0
        self._last_error = ""

    # --- queries -----------------------------------------------------------------------------

    @property
    def role(self) -> LeadershipRole:
        return self._role

    @property
    def is_leader(self) -> bool:
        return self._role is LeadershipRole.LEADER

    @property
    def epoch(self) -> int:
        """The epoch of the current (or last) leadership term of this coordinator; 0: none."""
        return self._epoch

    @property
    def leader_address(self) -> str:
        """The leader's advertised address as last seen (this one's when leading); "" when
        unknown."""
        return self._leader_address

    @property
    def leader_epoch(self) -> int:
        return self._leader_epoch

    @property
    def last_error(self) -> str:
        return self._last_error

    def step_down_at(self) -> float | None:
        """When the leader steps down unless a renewal succeeds first (None: not leading)."""
        return self._step_down_at

    def next_wakeup(self) -> float | None:
        """When the shell must call ``tick`` next (None: only when a request returns)."""
        if self._role is LeadershipRole.STOPPED:
            return None
        times = []
        if self._in_flight is None:
            times.append(self._next_attempt_at)
        if self._step_down_at is not None:
            times.append(self._step_down_at)
        return min(times) if times else None

    def check_invariants(self) -> None:
        if self._role is LeadershipRole.LEADER:
            assert self._epoch >= 1, "a leader has an epoch"
            assert self._step_down_at is not None, "a leader has a step-down deadline"
            assert self._step_down_at == self._lease_from + self.timing.step_down_after_s, (
                "the deadline follows the last successful request"
            )
            assert self._leader_address == self.address, "a leader names itself"
            assert self._leader_epoch == self._epoch
            assert self._in_flight != "acquire", "a leader never acquires"
        else:
            assert self._step_down_at is None, "only a leader has a step-down deadline"
        if self._role is LeadershipRole.STOPPED:
            assert self._in_flight is None or self._in_flight in ("acquire", "renew")
        assert self._in_flight in (None, "acquire", "renew")
        if self._in_flight == "renew":
            assert self._epoch >= 1, "a renewal is for an epoch"
        assert self._epoch >= 0 and self._leader_epoch >= 0

    # --- events ------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Action]:
        """Time passed: step down past the deadline; send the next request when due."""
        actions: list[Action] = []
        if self._role is LeadershipRole.STOPPED:
            return actions
        if self._step_down_at is not None and now >= self._step_down_at:
            actions.extend(
                self._step_down(
                    now,
                    f"the leader lease was not renewed within "
                    f"{self.timing.step_down_after_s:g} s "
                    f"(lease_ttl_s {self.timing.ttl_s:g} less one renew interval)"
                    + (f"; last error: {self._last_error}" if self._last_error else ""),
                    retry_at=now,
                )
            )
        if self._in_flight is None and now >= self._next_attempt_at:
            self._sent_at = now
            self._next_attempt_at = now + self.timing.renew_interval_s
            if self._role is LeadershipRole.LEADER:
                self._in_flight = "renew"
                actions.append(Renew(self._epoch))
            else:
                self._in_flight = "acquire"
                actions.append(TryAcquire())
        return actions

    def acquired(self, now: float, epoch: int) -> list[Action]:
        """The acquire script won the lease with a new ``epoch``."""
        self._expect("acquire")
        if self._role is LeadershipRole.STOPPED:
            return [Release(epoch)]
        if now >= self._sent_at + self.timing.step_down_after_s:
            # Too late to be sure nobody else can win meanwhile: try again (a new epoch).
            self._last_error = f"the acquisition of epoch {epoch} answered too late"
            self._next_attempt_at = now
            return [Release(epoch), *self.tick(now)]
        self._role = LeadershipRole.LEADER
        self._epoch = epoch
        self._leader_address = self.address
        self._leader_epoch = epoch
        self._lease_from = self._sent_at
        self._step_down_at = self._sent_at + self.timing.step_down_after_s
        self._last_error = ""
        return [Lead(epoch), *self.tick(now)]

    def held_by(self, now: float, address: str, epoch: int) -> list[Action]:
        """The acquire script found the lease held by another coordinator."""
        self._expect("acquire")
        self._leader_address = address
        self._leader_epoch = epoch
        self._last_error = ""
        return self.tick(now)

    def renewed(self, now: float) -> list[Action]:
        """The renew script extended this term's lease."""
        self._expect("renew")
        if self._role is LeadershipRole.LEADER:
            self._lease_from = self._sent_at
            self._step_down_at = self._sent_at + self.timing.step_down_after_s
            self._last_error = ""
        return self.tick(now)

    def lost(self, now: float, address: str, epoch: int) -> list[Action]:
        """The renew script refused: the lease is gone or another term's (``address``,
        ``epoch``: the lease holder and the current epoch as Redis has them)."""
        self._expect("renew")
        actions: list[Action] = []
        if self._role is LeadershipRole.LEADER:
            holder = f"held by {address}" if address else "not held"
            actions.extend(
                self._step_down(
                    now,
                    f"the leader lease of epoch {self._epoch} was lost (the lease is {holder}; "
                    f"the current epoch is {epoch})",
                    retry_at=self._next_attempt_at,
                )
            )
        if address:
            self._leader_address = address
            self._leader_epoch = epoch
        return actions + self.tick(now)

    def failed(self, now: float, error: str) -> list[Action]:
        """The outstanding acquire or renew request failed (Redis unreachable, timed out)."""
        if self._in_flight is None:
            raise ValueError("no request is outstanding")
        self._in_flight = None
        self._last_error = error[:500]
        return self.tick(now)

    def superseded(self, now: float, reason: str) -> list[Action]:
        """A fenced write found a newer epoch in Redis: another coordinator leads."""
        if self._role is not LeadershipRole.LEADER:
            return []
        actions = self._step_down(
            now, reason, retry_at=now + self.timing.renew_interval_s, forget_leader=True
        )
        return actions + self.tick(now)

    def resign(self, now: float, reason: str) -> list[Action]:
        """The shell could not lead (the recovery of the jobs failed): give the lease up."""
        if self._role is not LeadershipRole.LEADER:
            return []
        epoch = self._epoch
        actions = self._step_down(
            now, reason, retry_at=now + self.timing.renew_interval_s, forget_leader=True
        )
        return [*actions, Release(epoch), *self.tick(now)]

    def stop(self, now: float) -> list[Action]:
        """The coordinator stops: step down and release the lease."""
        if self._role is LeadershipRole.STOPPED:
            return []
        actions: list[Action] = []
        if self._role is LeadershipRole.LEADER:
            epoch = self._epoch
            actions = [*self._step_down(now, "the coordinator is stopping", retry_at=now)]
            actions.append(Release(epoch))
        self._role = LeadershipRole.STOPPED
        return actions

    # --- internals ---------------------------------------------------------------------------

    def _expect(self, kind: Literal["acquire", "renew"]) -> None:
        if self._in_flight != kind:
            raise ValueError(f"no {kind} request is outstanding (outstanding: {self._in_flight})")
        self._in_flight = None

    def _step_down(
        self, now: float, reason: str, retry_at: float, forget_leader: bool = False
    ) -> list[Action]:
        self._role = LeadershipRole.STANDBY
        self._step_down_at = None
        self._next_attempt_at = max(retry_at, now)
        if forget_leader or self._leader_address == self.address:
            self._leader_address = ""
            self._leader_epoch = 0
        return [StepDown(self._epoch, reason)]
