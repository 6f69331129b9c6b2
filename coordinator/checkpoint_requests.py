"""The checkpoints and savepoints users ask of one job, and the callers waiting for them.

A request is validated, numbered and handed to the checkpoint coordinator core; its outcome
(the completed checkpoint, a refusal, an abort) comes back through :meth:`resolve` as the shell
executes the core's actions. ``TriggerCheckpoint``/``TriggerSavepoint``/``StopWithSavepoint``
wait for it (:meth:`CheckpointRequests.trigger`); ``StartSavepoint`` returns at once and its
outcome is kept in the job's ``SavepointOperations`` (Flink REST's savepoint trigger ids).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable

from snapflow.coordinator.checkpoint_coordinator import TriggerRequest
from snapflow.coordinator.model import (
    CheckpointKind,
    CompletedCheckpoint,
    ExecutionAttempt,
    JobState,
)
from snapflow.coordinator.savepoint_operations import SavepointOperation, SavepointOperations
from snapflow.errors import (
    CheckpointRefusedError,
    DeadlineExceededError,
    InvalidArgumentError,
    SnapflowError,
)
from snapflow.filestore import is_object_store_uri
from snapflow.storage_location import s3_location


class CheckpointRequests:
    """Numbers user requests, hands them to the core and resolves whoever waits for them."""

    def __init__(
        self,
        job_id: str,
        check_not_fenced: Callable[[], None],
        to_core: Callable[[TriggerRequest], None],
        job_state: Callable[[], JobState],
    ) -> None:
        """``to_core``: hands a request to the core and executes the actions it returns (a
        refusal on the spot resolves the request before ``to_core`` returns)."""
        self.job_id = job_id
        self._check_not_fenced = check_not_fenced
        self._to_core = to_core
        self._job_state = job_state
        self._waiters: dict[int, asyncio.Future[CompletedCheckpoint]] = {}
        self._next_request_id = 1
        self.savepoint_operations = SavepointOperations()

    def submit(
        self,
        kind: CheckpointKind,
        target_directory: str,
        input_ended: ExecutionAttempt | None = None,
    ) -> tuple[TriggerRequest, asyncio.Future[CompletedCheckpoint]]:
        """Hand a user's checkpoint or savepoint request to the core; the future ends with the
        completed checkpoint or its failure. ``input_ended``: an ended source asks for the
        job's final checkpoint (``TriggerRequest.input_ended``)."""
        self._check_not_fenced()
        if kind.is_savepoint and is_object_store_uri(target_directory):
            s3_location(target_directory, what="target_directory")  # refused before queueing
        elif (
            kind.is_savepoint
            and target_directory
            and not os.path.isabs(convert_target := target_directory.removeprefix("file://"))
        ):
            raise InvalidArgumentError(
                f"target_directory {convert_target!r} must be an absolute path"
            )
        request = TriggerRequest(
            self._next_request_id,
            kind,
            periodic=False,
            target_directory=target_directory,
            input_ended=input_ended,
        )
        self._next_request_id += 1
        future: asyncio.Future[CompletedCheckpoint] = asyncio.get_running_loop().create_future()
        self._waiters[request.request_id] = future
        self._to_core(request)
        return request, future

    def resolve(self, request_id: int, outcome: CompletedCheckpoint | SnapflowError) -> None:
        """The outcome of a request (periodic ones and callers that stopped waiting: none)."""
        future = self._waiters.get(request_id)
        if future is None or future.done():
            return
        if isinstance(outcome, SnapflowError):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    async def trigger(
        self,
        kind: CheckpointKind,
        target_directory: str,
        timeout_s: float,
        input_ended: ExecutionAttempt | None = None,
    ) -> CompletedCheckpoint:
        """Request a checkpoint or savepoint and wait for it, at most ``timeout_s``."""
        request, future = self.submit(kind, target_directory, input_ended)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            raise DeadlineExceededError(
                f"{kind.value} did not complete within {timeout_s:.1f} s; it may still complete "
                f"(see GetCheckpointStats)"
            ) from None
        finally:
            self._waiters.pop(request.request_id, None)

    def start_savepoint(self, kind: CheckpointKind, target_directory: str) -> SavepointOperation:
        """Queue a savepoint and return its operation at once (IN_PROGRESS, or already ended
        if the request was refused on the spot); ``savepoint_operation`` reports it later."""
        operation = self.savepoint_operations.start(uuid.uuid4().hex, kind)
        try:
            request, future = self.submit(kind, target_directory)
        except BaseException as e:
            # Refused before it was queued (a bad target, a fenced coordinator): the error goes
            # to the caller, and the operation ends so that it holds no in-progress slot.
            self.savepoint_operations.failed(operation.request_id, str(e)[:1000])
            raise

        def ended(f: asyncio.Future[CompletedCheckpoint]) -> None:
            self._waiters.pop(request.request_id, None)
            if f.cancelled():
                self.savepoint_operations.failed(operation.request_id, "the job was closed")
            elif (error := f.exception()) is not None:
                if isinstance(error, CheckpointRefusedError):
                    error = self.naming_the_job_state(error)
                self.savepoint_operations.failed(operation.request_id, str(error)[:1000])
            else:
                self.savepoint_operations.completed(operation.request_id, f.result())

        future.add_done_callback(ended)
        return self.savepoint_operations.get(operation.request_id)

    def savepoint_operation(self, request_id: str) -> SavepointOperation:
        return self.savepoint_operations.get(request_id)

    def naming_the_job_state(self, refused: CheckpointRefusedError) -> CheckpointRefusedError:
        """A refusal because the job's checkpoint coordinator is shut down says why: the job
        has ended (or is ending after a stop-with-savepoint), in the words of its state."""
        if refused.reason != "CHECKPOINT_COORDINATOR_SHUTDOWN":
            return refused
        state = self._job_state()
        if state.is_terminal:
            why = (
                f"job {self.job_id} is {state.name}: an ended job takes no checkpoints or "
                f"savepoints (resubmit it with restore to run it again)"
            )
        else:
            why = (
                f"job {self.job_id} is {state.name} but stopping after a stop-with-savepoint: "
                f"it takes no more checkpoints"
            )
        return CheckpointRefusedError(refused.reason, why)
