"""Event-time bounds shared by the state backend, the task runtime and the operators.

Watermarks are milliseconds in a signed 64-bit range, as Flink's ``long`` watermarks are.
"""

from __future__ import annotations

#: Flink's ``Long.MIN_VALUE`` watermark: no watermark yet.
MIN_WATERMARK = -(1 << 63)

#: Flink's ``Long.MAX_VALUE`` watermark: end of event time (a finished source emits it).
MAX_WATERMARK = (1 << 63) - 1
