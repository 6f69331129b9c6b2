"""A clock the test moves: inject it where the code takes ``clock: Callable[[], float]``."""

from __future__ import annotations


class ManualClock:
    """Seconds that pass only when the test says so (``advance`` or by setting ``now``)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
