"""Errors of data channels: what a producer's ``send`` and a consumer's ``InputGate.next`` raise.

A channel error fails the task (``ChannelFailedError`` when the other side or the stream
failed); the gRPC status says how a remote peer should see it.
"""

from __future__ import annotations

import grpc

from snapflow.errors import SnapflowError

__all__ = ["ChannelClosedError", "ChannelError", "ChannelFailedError", "CreditViolationError"]


class ChannelError(SnapflowError):
    """Base of data-channel errors."""

    status = grpc.StatusCode.UNAVAILABLE


class ChannelFailedError(ChannelError):
    """The other side of the channel failed or the stream broke; the task must fail."""


class ChannelClosedError(ChannelError):
    """The channel was closed (end of partition sent) and accepts no more frames."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class CreditViolationError(ChannelError):
    """The producer handed over a data frame without holding a credit (a protocol bug)."""

    status = grpc.StatusCode.FAILED_PRECONDITION
