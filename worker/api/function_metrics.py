"""The metrics of a user function: counters and gauges in a :class:`MetricGroup`, reached as
``ctx.metrics`` of its :class:`~snapflow.worker.api.functions.RuntimeContext`.

The task runtime has no metrics registry for user metrics yet, so their values stay readable in
the process, from ``ctx.metrics.values()`` (e.g. in ``close()``, to log them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from snapflow.errors import InvalidArgumentError


class Counter:
    """A count that only goes up (``inc``); ``count`` is its value."""

    def __init__(self) -> None:
        self.count = 0

    def inc(self, n: int = 1) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidArgumentError(f"a counter goes up by an integer >= 0, got {n!r}")
        self.count += n


class Gauge:
    """A value read when asked: ``fn()``."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    @property
    def value(self) -> Any:
        return self.fn()


class MetricGroup:
    """The metrics of one user function in one subtask: named counters and gauges. ``scope``
    names the subtask (``vertex#subtask``) and the operator."""

    def __init__(self, scope: str = "") -> None:
        self.scope = scope
        self._counters: dict[str, Counter] = {}
        self._gauges: dict[str, Gauge] = {}

    def counter(self, name: str) -> Counter:
        """The counter ``name`` (created on first use; the same one afterwards)."""
        self._check(name, self._gauges)
        return self._counters.setdefault(name, Counter())

    def gauge(self, name: str, fn: Callable[[], Any]) -> Gauge:
        """Register ``fn`` as gauge ``name`` (replaces an earlier one of that name)."""
        self._check(name, self._counters)
        if not callable(fn):
            raise InvalidArgumentError(f"gauge {name!r} needs a callable, got {fn!r:.100}")
        gauge = self._gauges[name] = Gauge(fn)
        return gauge

    def values(self) -> dict[str, Any]:
        """Every metric's current value by name."""
        out: dict[str, Any] = {n: c.count for n, c in self._counters.items()}
        out.update((n, g.value) for n, g in self._gauges.items())
        return out

    @staticmethod
    def _check(name: str, other: dict[str, Any]) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"metric names are non-empty strings, got {name!r}")
        if name in other:
            raise InvalidArgumentError(f"metric {name!r} already exists as another kind")
