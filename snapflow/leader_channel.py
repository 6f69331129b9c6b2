"""Channels to highly available coordinators: several addresses, calls go to the leader.

Every coordinator client (the CLI, worker agents, the Spark driver) takes its coordinator
address as ``host:port`` or a comma-separated list ``host:port,host:port``. With one address,
:func:`aio_leader_channel` and :func:`sync_leader_channel` return a plain gRPC channel. With
several, they return a channel that sends each unary call to the coordinator that answered
last and, when a coordinator answers ``UNAVAILABLE`` (a standby, a coordinator that is down,
or one still recovering), tries the others within the same deadline:

- a standby names the leader in the trailing metadata ``snapflow-leader`` (and says so in
  its message); if that address is in the list and was not tried yet, it is tried next;
- otherwise the next address of the list that was not tried yet;
- each address at most once per call, so a leader's own ``UNAVAILABLE`` (Redis down) is not
  sent again to it; when all were tried the error of the leader a standby named is raised
  (else the last one), and the caller's retries apply as with a single coordinator.

Only ``UNAVAILABLE`` moves on: a standby never executes a call, and a refused connection
never reached a coordinator. Streaming calls (``WatchJob``) go to the coordinator that
answered last, without retries; call again after a failover. The channels to all addresses
reconnect with a short back-off (at most ``MAX_RECONNECT_BACKOFF_MS``), so a standby that
becomes the leader is reached at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

import grpc
import grpc.aio

from snapflow.errors import ConfigError
from snapflow.security import PLAINTEXT, SecuritySettings
from snapflow.tls import aio_channel, sync_channel

LEADER_METADATA_KEY = "snapflow-leader"
"""Trailing metadata of a standby's refusal: the leader's address, when known."""
ROLE_METADATA_KEY = "snapflow-role"
STANDBY_ROLE = "standby"
MAX_ADDRESSES = 16
MAX_RECONNECT_BACKOFF_MS = 1000

__all__ = [
    "LEADER_METADATA_KEY",
    "ROLE_METADATA_KEY",
    "LeaderTracker",
    "aio_leader_channel",
    "leader_hint",
    "parse_addresses",
    "sync_leader_channel",
]


def parse_addresses(text: str) -> tuple[str, ...]:
    """``host:port[,host:port...]`` -> the addresses, in order, without duplicates;
    ConfigError naming the bad part."""
    addresses: list[str] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        host, colon, port = item.rpartition(":")
        # isascii: str.isdigit accepts digits int() refuses (superscripts); <= 5: int() of a
        # huge digit string raises ValueError, not this error.
        valid_port = port.isascii() and port.isdigit() and len(port) <= 5
        if not colon or not host or not valid_port or not 0 < int(port) <= 65535:
            raise ConfigError(
                f"coordinator address {item!r:.100} is not host:port (several: host:port,host:port)"
            )
        if item not in addresses:
            addresses.append(item)
    if not addresses:
        raise ConfigError("no coordinator address given (host:port, or host:port,host:port)")
    if len(addresses) > MAX_ADDRESSES:
        raise ConfigError(f"{len(addresses)} coordinator addresses; at most {MAX_ADDRESSES}")
    return tuple(addresses)


def leader_hint(error: grpc.RpcError) -> str:
    """The leader address a standby named in its refusal ("" if none)."""
    trailing: Any = None
    try:
        trailing = error.trailing_metadata()
    except AttributeError:  # an RpcError that is no call (no metadata), e.g. a channel-level one
        return ""
    for key, value in trailing or ():
        if key == LEADER_METADATA_KEY:
            return value.decode() if isinstance(value, bytes) else str(value)
    return ""


def _should_try_next(error: grpc.RpcError) -> bool:
    code = error.code() if hasattr(error, "code") else None
    return bool(code == grpc.StatusCode.UNAVAILABLE)


class LeaderTracker:
    """Which address to call: the last that answered first, then a standby's hint, then the
    rest of the list in order (each at most once per call). Thread-safe enough for the sync
    clients: it only swaps one index."""

    def __init__(self, addresses: Sequence[str]) -> None:
        if not addresses:
            raise ConfigError("no coordinator address given")
        self.addresses = tuple(addresses)
        self._current = 0

    @property
    def current(self) -> str:
        return self.addresses[self._current]

    def next_address(self, tried: Sequence[str], hint: str = "") -> str | None:
        """The address to try after ``tried`` (empty: the first attempt of a call)."""
        if not tried:
            return self.current
        if hint and hint in self.addresses and hint not in tried:
            return hint
        start = self.addresses.index(tried[-1]) if tried[-1] in self.addresses else 0
        n = len(self.addresses)
        for step in range(1, n + 1):
            candidate = self.addresses[(start + step) % n]
            if candidate not in tried:
                return candidate
        return None

    def answered(self, address: str) -> None:
        """``address`` answered (not UNAVAILABLE): call it first from now on."""
        if address in self.addresses:
            self._current = self.addresses.index(address)


def _channel_options(options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [
        *options,
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ]


# ---------------------------------------------------------------------------------------------
# asyncio
# ---------------------------------------------------------------------------------------------


def aio_leader_channel(
    addresses: str | Sequence[str],
    security: SecuritySettings = PLAINTEXT,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to the coordinator(s) at ``addresses`` (see the module doc)."""
    parsed = parse_addresses(addresses) if isinstance(addresses, str) else tuple(addresses)
    if len(parsed) == 1:
        return aio_channel(parsed[0], security, options)
    return AioLeaderChannel(parsed, security, options)


class AioLeaderChannel(grpc.aio.Channel):
    def __init__(
        self,
        addresses: Sequence[str],
        security: SecuritySettings = PLAINTEXT,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.tracker = LeaderTracker(addresses)
        opts = _channel_options(options)
        self.channels = {a: aio_channel(a, security, opts) for a in self.tracker.addresses}

    @property
    def current(self) -> grpc.aio.Channel:
        return self.channels[self.tracker.current]

    async def __aenter__(self) -> AioLeaderChannel:
        return self

    async def __aexit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        await self.close()

    async def close(self, grace: float | None = None) -> None:
        for channel in self.channels.values():
            await channel.close(grace)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self.current.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self.current.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self.current.channel_ready()

    def unary_unary(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.aio.UnaryUnaryMultiCallable[Any, Any]:
        return _AioUnaryUnary(self, method, request_serializer, response_deserializer)

    def unary_stream(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        return _AioDelegate(self, "unary_stream", method, request_serializer, response_deserializer)

    def stream_unary(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        return _AioDelegate(self, "stream_unary", method, request_serializer, response_deserializer)

    def stream_stream(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        return _AioDelegate(
            self, "stream_stream", method, request_serializer, response_deserializer
        )


class _AioDelegate:
    """A streaming multi-callable on the coordinator that answered last (no retries)."""

    def __init__(self, owner: AioLeaderChannel, kind: str, method: str, ser: Any, de: Any) -> None:
        self._owner, self._kind, self._method, self._ser, self._de = owner, kind, method, ser, de

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        factory = getattr(self._owner.current, self._kind)
        return factory(self._method, self._ser, self._de)(*args, **kwargs)


class _AioUnaryUnary(grpc.aio.UnaryUnaryMultiCallable):
    def __init__(self, owner: AioLeaderChannel, method: str, ser: Any, de: Any) -> None:
        self._owner, self._method, self._ser, self._de = owner, method, ser, de

    def __call__(
        self,
        request: Any,
        *,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> _AioLeaderCall:
        kwargs = {
            "metadata": metadata,
            "credentials": credentials,
            "wait_for_ready": wait_for_ready,
            "compression": compression,
        }
        return _AioLeaderCall(
            self._owner, self._method, self._ser, self._de, request, timeout, kwargs
        )


class _AioLeaderCall(grpc.aio.UnaryUnaryCall):
    """One unary call, tried on the coordinators in turn (see the module docstring)."""

    def __init__(
        self,
        owner: AioLeaderChannel,
        method: str,
        ser: Any,
        de: Any,
        request: Any,
        timeout: float | None,
        kwargs: dict[str, Any],
    ) -> None:
        self._owner, self._method, self._ser, self._de = owner, method, ser, de
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._call: Any = None
        self._task = asyncio.ensure_future(self._run(request, kwargs))

    async def _run(self, request: Any, kwargs: dict[str, Any]) -> Any:
        tracker = self._owner.tracker
        tried: list[str] = []
        hint = ""
        errors: dict[str, grpc.aio.AioRpcError] = {}
        named = ""  # the leader a standby named: its own error says most
        while True:
            address = tracker.next_address(tried, hint)
            if address is None:
                raise errors.get(named) or errors[tried[-1]]
            tried.append(address)
            remaining = None
            if self._deadline is not None:
                remaining = max(0.0, self._deadline - time.monotonic())
            callable_ = self._owner.channels[address].unary_unary(self._method, self._ser, self._de)
            self._call = callable_(request, timeout=remaining, **kwargs)
            try:
                response = await self._call
            except grpc.aio.AioRpcError as error:
                if not _should_try_next(error):
                    tracker.answered(address)
                    raise
                errors[address] = error
                hint = leader_hint(error)
                named = hint or named
                continue
            tracker.answered(address)
            return response

    def __await__(self) -> Generator[Any, None, Any]:
        return self._task.__await__()

    def cancelled(self) -> bool:
        return self._task.cancelled()

    def done(self) -> bool:
        return self._task.done()

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def cancel(self) -> bool:
        return self._task.cancel()

    def add_done_callback(self, callback: Any) -> None:
        self._task.add_done_callback(lambda _task: callback(self))

    async def _settled(self) -> Any:
        await asyncio.gather(self._task, return_exceptions=True)
        return self._call

    async def initial_metadata(self) -> Any:
        call = await self._settled()
        return await call.initial_metadata() if call is not None else None

    async def trailing_metadata(self) -> Any:
        call = await self._settled()
        return await call.trailing_metadata() if call is not None else None

    async def code(self) -> grpc.StatusCode:
        call = await self._settled()
        return await call.code() if call is not None else grpc.StatusCode.CANCELLED

    async def details(self) -> str:
        call = await self._settled()
        return await call.details() if call is not None else ""

    async def wait_for_connection(self) -> None:
        await self._settled()


# ---------------------------------------------------------------------------------------------
# synchronous
# ---------------------------------------------------------------------------------------------


def sync_leader_channel(
    addresses: str | Sequence[str],
    security: SecuritySettings = PLAINTEXT,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A synchronous channel to the coordinator(s) at ``addresses`` (see the module doc)."""
    parsed = parse_addresses(addresses) if isinstance(addresses, str) else tuple(addresses)
    if len(parsed) == 1:
        return sync_channel(parsed[0], security, options)
    return SyncLeaderChannel(parsed, security, options)


class SyncLeaderChannel(grpc.Channel):
    def __init__(
        self,
        addresses: Sequence[str],
        security: SecuritySettings = PLAINTEXT,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.tracker = LeaderTracker(addresses)
        opts = _channel_options(options)
        self.channels = {a: sync_channel(a, security, opts) for a in self.tracker.addresses}

    @property
    def current(self) -> grpc.Channel:
        return self.channels[self.tracker.current]

    def subscribe(self, callback: Any, try_to_connect: bool = False) -> None:
        self.current.subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Any) -> None:
        self.current.unsubscribe(callback)

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()

    def __enter__(self) -> SyncLeaderChannel:
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> bool | None:
        self.close()
        return None

    def unary_unary(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.UnaryUnaryMultiCallable:
        return _SyncUnaryUnary(self, method, request_serializer, response_deserializer)

    def unary_stream(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        return self.current.unary_stream(method, request_serializer, response_deserializer)

    def stream_unary(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        return self.current.stream_unary(method, request_serializer, response_deserializer)

    def stream_stream(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        return self.current.stream_stream(method, request_serializer, response_deserializer)


class _SyncUnaryUnary(grpc.UnaryUnaryMultiCallable):
    def __init__(self, owner: SyncLeaderChannel, method: str, ser: Any, de: Any) -> None:
        self._owner, self._method, self._ser, self._de = owner, method, ser, de

    def _invoke(self, name: str, request: Any, timeout: float | None, kwargs: Any) -> Any:
        tracker = self._owner.tracker
        deadline = None if timeout is None else time.monotonic() + timeout
        tried: list[str] = []
        hint = ""
        errors: dict[str, grpc.RpcError] = {}
        named = ""  # the leader a standby named: its own error says most
        while True:
            address = tracker.next_address(tried, hint)
            if address is None:
                raise errors.get(named) or errors[tried[-1]]
            tried.append(address)
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            callable_ = self._owner.channels[address].unary_unary(self._method, self._ser, self._de)
            try:
                result = getattr(callable_, name)(request, timeout=remaining, **kwargs)
            except grpc.RpcError as error:
                if not _should_try_next(error):
                    tracker.answered(address)
                    raise
                errors[address] = error
                hint = leader_hint(error)
                named = hint or named
                continue
            tracker.answered(address)
            return result

    def __call__(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        kwargs = {
            "metadata": metadata,
            "credentials": credentials,
            "wait_for_ready": wait_for_ready,
            "compression": compression,
        }
        return self._invoke("__call__", request, timeout, kwargs)

    def with_call(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        kwargs = {
            "metadata": metadata,
            "credentials": credentials,
            "wait_for_ready": wait_for_ready,
            "compression": compression,
        }
        return self._invoke("with_call", request, timeout, kwargs)

    def future(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        # A future is one call: on the coordinator that answered last, no retries.
        callable_ = self._owner.current.unary_unary(self._method, self._ser, self._de)
        return callable_.future(
            request,
            timeout=timeout,
            metadata=metadata,
            credentials=credentials,
            wait_for_ready=wait_for_ready,
            compression=compression,
        )
