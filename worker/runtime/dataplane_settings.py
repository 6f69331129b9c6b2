"""How an agent runs its subtasks' data plane: buffer debloating and where user code runs."""

from __future__ import annotations

from dataclasses import dataclass

from snapflow.errors import InvalidArgumentError
from snapflow.worker.runtime.debloat import DEFAULT_TARGET_MS, DebloatSettings

__all__ = ["DataplaneSettings"]


@dataclass(frozen=True)
class DataplaneSettings:
    """How an agent runs its subtasks' data plane (docs/worker.md, "Keeping checkpoints fast
    under load"). ``snapflow worker --debloat-target-ms/--no-task-thread/
    --no-builtins-on-loop/--no-adaptive-task-thread``; the Spark bridge's run options of the
    same names."""

    debloat_target_ms: int = DEFAULT_TARGET_MS
    """Buffer debloating: the data every output channel holds (queued at the producer and
    handed to the consumer) is bounded to what its consumer drains in this time, so a barrier
    waits at most about this long behind data per channel. 0 turns it off (only the
    count bounds, ``buffers_per_channel`` frames and the output queue, apply)."""
    task_thread: bool = True
    """Run each subtask's operators on a task thread of its own (``worker/runtime/mailbox.py``,
    Flink's model), so triggers, barriers, credits and heartbeats never wait for user code.
    False: operators run on the agent's loop, in steps (docs/worker.md, "Where user code
    runs")."""
    builtins_on_loop: bool = True
    """With ``task_thread``: a subtask whose operators all promise short calls that never block
    (``Operator.runs_on_loop``: the vectorised built-ins, such as the generator sources and the
    keyed count, on the heap backend) runs them on the agent's loop, in steps, rather than on a
    thread: no user code to guard the loop from, and the hand-offs between two threads cost
    such a subtask about 14 % of its throughput on a machine with no spare core. False: every
    subtask on its task thread."""
    adaptive_task_thread: bool = True
    """Without ``task_thread``: operators start on the loop, and a subtask's operators move to
    a task thread of their own once their calls are found to block (wall time well above CPU
    time, ``worker/runtime/placement.py``), so a sink that blocks stops holding up the loop.
    False: they stay on the loop. No effect with ``task_thread``."""

    def __post_init__(self) -> None:
        t = self.debloat_target_ms
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise InvalidArgumentError(
                f"debloat_target_ms must be an integer >= 0 (0: off), got {t!r}"
            )
        if not isinstance(self.task_thread, bool):
            raise InvalidArgumentError(f"task_thread must be a bool, got {self.task_thread!r}")
        if not isinstance(self.builtins_on_loop, bool):
            raise InvalidArgumentError(
                f"builtins_on_loop must be a bool, got {self.builtins_on_loop!r}"
            )
        if not isinstance(self.adaptive_task_thread, bool):
            raise InvalidArgumentError(
                f"adaptive_task_thread must be a bool, got {self.adaptive_task_thread!r}"
            )

    @property
    def debloat(self) -> DebloatSettings:
        """The per-channel debloat settings (other fields at their defaults)."""
        return DebloatSettings(target_ms=self.debloat_target_ms)
