"""The state backends' errors, each with the gRPC status it maps to (``snapflow.errors``)."""

from __future__ import annotations

import grpc

from snapflow.errors import StateError

__all__ = [
    "CorruptStateError",
    "IncompatibleStateError",
    "KeyGroupRangeError",
    "NoCurrentKeyError",
    "StateFormatVersionError",
    "no_current_key",
]


class CorruptStateError(StateError):
    """A state file is corrupt or truncated (bad magic, sizes or checksum; unreadable pickle)."""

    status = grpc.StatusCode.DATA_LOSS


class StateFormatVersionError(StateError):
    """A state file was written in a format version this code does not know."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class IncompatibleStateError(StateError):
    """State that cannot be used as asked: another max parallelism or key hash, a state name
    registered with another kind, a restore into a backend that already holds state."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class KeyGroupRangeError(StateError):
    """A key (or key group) outside the backend's key-group range."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class NoCurrentKeyError(StateError):
    """A keyed state access (or timer registration) without a current key; its own class so
    that an operator can name its own fix (a broadcast side: ``apply_to_keyed_state``)."""


def no_current_key() -> StateError:
    """The error of a keyed state access (or timer registration) without a current key."""
    return NoCurrentKeyError("no current key: call set_current_key(key) before using keyed state")
