"""Snapflow's one error hierarchy.

Every error a caller can act on is a :class:`SnapflowError`. Each subclass names the gRPC status
it maps to, so the service layer (``coordinator.grpc_errors``) converts any of them into a
precise status and message without a table of special cases.
"""

from __future__ import annotations

import grpc


class SnapflowError(Exception):
    """Base of every Snapflow error."""

    status: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgumentError(SnapflowError):
    """The request is malformed or names something impossible; fix the request."""

    status = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(SnapflowError):
    """A job, task, checkpoint or savepoint that does not exist."""

    status = grpc.StatusCode.NOT_FOUND


class JobNotFoundError(NotFoundError):
    pass


class CheckpointNotFoundError(NotFoundError):
    pass


class AlreadyExistsError(SnapflowError):
    status = grpc.StatusCode.ALREADY_EXISTS


class FailedPreconditionError(SnapflowError):
    """The system is not in a state that allows the operation (e.g. the job is finished)."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class UnknownTaskError(FailedPreconditionError):
    """A task or attempt that the job does not know (or no longer knows)."""


class StaleEpochError(FailedPreconditionError):
    """A newer coordinator incarnation has taken over; this one must stop mutating state."""


class CheckpointRefusedError(FailedPreconditionError):
    """A checkpoint trigger was refused; ``reason`` is the named reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


class CheckpointFailedError(SnapflowError):
    """A triggered checkpoint or savepoint did not complete."""

    status = grpc.StatusCode.ABORTED

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


class DeadlineExceededError(SnapflowError):
    """The operation did not finish within its deadline; it may still complete later."""

    status = grpc.StatusCode.DEADLINE_EXCEEDED


class ResourceExhaustedError(SnapflowError):
    """A bound was reached (jobs, queued requests, watch stream backlog)."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class StorageError(SnapflowError):
    """Checkpoint storage could not be read or written."""

    status = grpc.StatusCode.UNAVAILABLE


class InvalidFieldError(InvalidArgumentError):
    """One field of a config or request is invalid. The message starts with the field's name
    (``field``), so whoever read the field from a larger message can say where it sat
    (:meth:`within`: ``checkpoint_config.retained must be >= 1, got 0``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field

    def within(self, parent: str) -> InvalidFieldError:
        """The same error, its field and message prefixed with ``parent.``."""
        return InvalidFieldError(f"{parent}.{self.field}", f"{parent}.{self}")


class InvalidStatePathError(InvalidArgumentError):
    """A state handle points outside the job's checkpoint storage; it is never touched."""


class PermissionDeniedError(SnapflowError):
    """The caller may not do this (a path outside the allowed roots, a missing role)."""

    status = grpc.StatusCode.PERMISSION_DENIED


class ConfigError(SnapflowError):
    """Invalid configuration; the message names the setting and what is allowed."""

    status = grpc.StatusCode.INVALID_ARGUMENT


class UnavailableError(SnapflowError):
    """A dependency (Redis, a worker) cannot be reached right now; retry later."""

    status = grpc.StatusCode.UNAVAILABLE


class StateError(SnapflowError):
    """Operator state cannot be used as asked: a corrupt, truncated or incompatible snapshot
    file, an unknown state format version, or a key outside the backend's key-group range."""
