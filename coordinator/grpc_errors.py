"""The one place that maps Snapflow errors to gRPC status codes.

Servicer methods are wrapped with :func:`grpc_errors`; a ``SnapflowError`` becomes its
``status`` with its message, anything else becomes INTERNAL (logged with its traceback) so the
service never crashes on bad input. Every message is cut to
``snapflow.limits.MAX_ERROR_MESSAGE_BYTES``: a message that echoes a huge field would break the
``grpc-message`` header, and the client would wait for its deadline instead of getting the
status. A cut message is logged (``rpc.error_message_cut``) with its full text, itself cut to
``MAX_LOGGED_VALUE_CHARS``.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import structlog
from google.protobuf.message import DecodeError

from snapflow import limits
from snapflow.errors import SnapflowError
from snapflow.request_parsing import MalformedRequest

log = structlog.get_logger("snapflow.coordinator")

T = TypeVar("T")


def status_for(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and the bounded message of ``error``."""
    code, message = _status(error)
    bounded = limits.cut(message)
    if bounded is not message:
        log.warning(
            "rpc.error_message_cut",
            code=code.name,
            message=limits.cut_chars(message, limits.MAX_LOGGED_VALUE_CHARS),
        )
    return code, bounded


def _status(error: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(error, SnapflowError):
        return error.status, str(error)
    if isinstance(error, DecodeError):
        return grpc.StatusCode.INVALID_ARGUMENT, f"malformed message: {error}"
    return grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}: {error}"


def grpc_errors(
    method: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[T]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[T]]:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> T:
        if isinstance(request, MalformedRequest):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.describe())
        try:
            return await method(self, request, context)
        except Exception as error:  # converted to a status below
            if isinstance(error, grpc.aio.AbortError):
                raise
            code, message = status_for(error)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("rpc.internal_error", method=method.__name__)
            await context.abort(code, message)
            raise  # unreachable: abort raises

    return wrapper


def grpc_errors_stream(
    method: Callable[[Any, Any, grpc.aio.ServicerContext], AsyncIterator[T]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], AsyncIterator[T]]:
    @functools.wraps(method)
    async def wrapper(
        self: Any, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[T]:
        if isinstance(request, MalformedRequest):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.describe())
        try:
            async for item in method(self, request, context):
                yield item
        except Exception as error:
            if isinstance(error, grpc.aio.AbortError):
                raise
            code, message = status_for(error)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("rpc.internal_error", method=method.__name__)
            await context.abort(code, message)

    return wrapper
