"""Which of an agent's acks may go to the coordinator now: a pure core (acks, declines and the
ends of subtasks in, the acks to send out); ``AckBatcher`` is its asyncio shell.

An agent typically hosts a source subtask, which acks checkpoint N right at the trigger, and a
downstream one, which acks N 10-50 ms later, once its barriers arrived. Sent as they come, that
is two ``AcknowledgeCheckpoints`` calls per agent and checkpoint, about 1 ms of GIL time each on
either side. So the ack of N is *held* while another subtask of the same job hosted here still
has to ack or decline N and is still running; the last one to answer (or end) releases the whole
group as one call.

Holding never delays N's completion: the coordinator expects an ack from every subtask running
when it triggered N (``CheckpointCoordinator.on_checkpoint_id``), so N cannot complete before the
awaited subtask's ack arrives, and that ack releases the held ones with it. Nothing on the task
side waits for a held ack in a way that could block the awaited subtask: a subtask sends its
barrier downstream before it snapshots (``SubtaskCheckpoints.take_snapshot``), so no subtask's
barrier of N depends on another one's ack of N; only checkpoint completion waits for acks (a
finishing task, a source waiting for the final checkpoint or a stop-with-savepoint), and
completion needs the awaited subtask's ack anyway. An abort notice for N releases its held acks
(a subtask drops an aborted N without declining it); where the guess of who is awaited is
still wrong, ``MAX_HOLD_S`` bounds the hold.

A subtask is awaited for N if it is tracked (``start``; its run has not ended), has not acked
or declined N or a later checkpoint (a later answer means it skipped N or acks it late: neither
is worth waiting for), and was awaited when N's first ack was held: a group's awaited set only
shrinks. Acks of untracked subtasks, of other checkpoints and of other jobs never wait for each
other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

SubtaskKey = tuple[str, int, int]
"""A subtask attempt: vertex id, subtask index, attempt number."""

MAX_HOLD_S = 3.0
"""The longest an ack is held for the other subtasks of its agent. Only reached when the agent
guessed wrong (an awaited subtask will never answer the checkpoint, which then cannot complete
either); it bounds how long a finishing task waits for its ack to be answered then. Far above
the usual 10-50 ms between a source's and its downstream's acks, and above their tails under
load (hundreds of ms), so that the common case always goes as one call."""


@dataclass
class _Group(Generic[T]):
    """The held acks of one checkpoint of one job."""

    awaited: set[SubtaskKey]
    deadline: float
    items: list[T] = field(default_factory=list)


class AckHold(Generic[T]):
    """The hold rule over the acks ``T`` of one agent; times are the caller's clock (seconds).

    Every method returns the acks to send now: released groups by checkpoint id, each group's
    acks in the order they were held."""

    def __init__(self, max_hold_s: float = MAX_HOLD_S) -> None:
        self.max_hold_s = max_hold_s
        self._running: dict[str, set[SubtaskKey]] = {}
        self._answered: dict[tuple[str, SubtaskKey], int] = {}
        """The highest checkpoint id each running subtask acked or declined."""
        self._groups: dict[tuple[str, int], _Group[T]] = {}

    # --- subtasks ----------------------------------------------------------------------------

    def start(self, job_id: str, subtask: SubtaskKey) -> None:
        """``subtask`` runs: from now on it is awaited for the checkpoints it has not answered."""
        self._running.setdefault(job_id, set()).add(subtask)

    def end(self, job_id: str, subtask: SubtaskKey) -> list[T]:
        """``subtask``'s run ended (finished, failed or cancelled): nobody waits for it."""
        running = self._running.get(job_id)
        if running is not None:
            running.discard(subtask)
            if not running:
                del self._running[job_id]
        self._answered.pop((job_id, subtask), None)
        return self._forget(job_id, subtask, up_to=None)

    # --- acks and declines -------------------------------------------------------------------

    def ack(
        self, job_id: str, subtask: SubtaskKey, checkpoint_id: int, item: T, now: float
    ) -> list[T]:
        """``subtask`` acked ``checkpoint_id``; ``item`` is its ack."""
        running = self._running.get(job_id, set())
        if subtask not in running:
            return [item]  # untracked: nothing is known about its peers, so it does not wait
        released = self._answer(job_id, subtask, checkpoint_id)
        key = (job_id, checkpoint_id)
        group = self._groups.get(key)
        if group is None:
            awaited = {
                s
                for s in running
                if s != subtask and self._answered.get((job_id, s), 0) < checkpoint_id
            }
            if not awaited:
                return [*released, item]
            group = self._groups[key] = _Group(awaited, now + self.max_hold_s)
        group.items.append(item)
        return released

    def decline(self, job_id: str, subtask: SubtaskKey, checkpoint_id: int) -> list[T]:
        """``subtask`` declined ``checkpoint_id``: nobody waits for its ack of it."""
        if subtask not in self._running.get(job_id, set()):
            return []
        return self._answer(job_id, subtask, checkpoint_id)

    def _answer(self, job_id: str, subtask: SubtaskKey, checkpoint_id: int) -> list[T]:
        answered = self._answered.get((job_id, subtask), 0)
        self._answered[(job_id, subtask)] = max(answered, checkpoint_id)
        return self._forget(job_id, subtask, up_to=checkpoint_id)

    def _forget(self, job_id: str, subtask: SubtaskKey, up_to: int | None) -> list[T]:
        """``subtask`` is awaited no more for the job's checkpoints up to ``up_to`` (None: any);
        the groups that now await nobody go."""
        released: list[T] = []
        for key in sorted(self._groups):
            group_job, checkpoint_id = key
            if group_job != job_id or (up_to is not None and checkpoint_id > up_to):
                continue
            group = self._groups[key]
            group.awaited.discard(subtask)
            if not group.awaited:
                released.extend(self._groups.pop(key).items)
        return released

    def aborted(self, job_id: str, checkpoint_id: int) -> list[T]:
        """The coordinator aborted ``checkpoint_id``: its held acks go now (the coordinator
        discards their state); a subtask that dropped it would never answer."""
        group = self._groups.pop((job_id, checkpoint_id), None)
        return [] if group is None else group.items

    # --- time --------------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When the oldest held group goes at the latest (``expire``); None: nothing held."""
        return min((g.deadline for g in self._groups.values()), default=None)

    def expire(self, now: float) -> list[T]:
        """The groups held for ``max_hold_s`` go, whoever they still await."""
        due = sorted(k for k, g in self._groups.items() if g.deadline <= now)
        return [item for key in due for item in self._groups.pop(key).items]

    def release_all(self) -> list[T]:
        """Everything held goes (the agent stops)."""
        groups, self._groups = self._groups, {}
        return [item for key in sorted(groups) for item in groups[key].items]

    @property
    def held(self) -> int:
        """How many acks are held."""
        return sum(len(g.items) for g in self._groups.values())
