"""Registers a servicer with a request parser that turns undecodable bytes into a clear error.

The generated ``add_*Servicer_to_server`` parses requests with ``FromString``; when that
raises, grpc answers UNKNOWN ("Unexpected DecodeError ...") before our code runs. Here every
method gets a parser that returns a :class:`MalformedRequest` marker instead. Unary requests
carrying one are answered with INVALID_ARGUMENT and a message saying what failed before the
servicer runs; a client-streaming method reads the marker from its stream and must answer it
itself (``isinstance(message, MalformedRequest)``). Used by the coordinator and the worker.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

MAX_ERROR_CHARS = 200


class MalformedRequest:
    """Stands in for a request whose bytes did not parse as the method's message type."""

    def __init__(self, type_name: str, error: str) -> None:
        self.type_name = type_name
        self.error = error[:MAX_ERROR_CHARS]

    def describe(self) -> str:
        return f"malformed request: the bytes are not a valid {self.type_name} ({self.error})"


def _parser(message_class: type[Message]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except DecodeError as e:
            return MalformedRequest(message_class.DESCRIPTOR.full_name, str(e))

    return parse


def _unary(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(behaviour)
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, MalformedRequest):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.describe())
        return await behaviour(request, context)

    return handle


def _server_stream(behaviour: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(behaviour)
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, MalformedRequest):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.describe())
        async for item in behaviour(request, context):
            yield item

    return handle


def add_servicer(server: grpc.aio.Server, service: ServiceDescriptor, servicer: Any) -> None:
    """Register ``servicer``'s methods of ``service`` on ``server`` with tolerant parsing."""
    handlers = {}
    for method in service.methods:
        request_class = GetMessageClass(method.input_type)
        response_class = GetMessageClass(method.output_type)
        behaviour = getattr(servicer, method.name)
        if method.client_streaming:
            factory = (
                grpc.stream_stream_rpc_method_handler
                if method.server_streaming
                else grpc.stream_unary_rpc_method_handler
            )
        elif method.server_streaming:
            factory, behaviour = grpc.unary_stream_rpc_method_handler, _server_stream(behaviour)
        else:
            factory, behaviour = grpc.unary_unary_rpc_method_handler, _unary(behaviour)
        handlers[method.name] = factory(
            behaviour,
            request_deserializer=_parser(request_class),
            response_serializer=response_class.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
