"""User functions of the broadcast state pattern (Flink's ``BroadcastProcessFunction`` and
``KeyedBroadcastProcessFunction``), their contexts, and :class:`MapStateDescriptor`.

Input 0 is the element side (``process_element``), input 1 the broadcast side
(``process_broadcast_element``): every subtask gets every broadcast row. Broadcast state is a
map per name, looked up by descriptor (``ctx.get_broadcast_state(MapStateDescriptor("rules"))``)
and created empty on first use. Only the broadcast side writes it; the element side (and
``on_timer``) gets a read-only view whose writes raise an error naming the fix. Each subtask
checkpoints its own copy; on a rescale each new subtask gets one old subtask's copy
(:mod:`snapflow.worker.state.operator_state`).

On keyed streams (:class:`KeyedBroadcastProcessFunction`) the element side also has the keyed
state and event-time timers of its row's key; the broadcast side has no key, so it reaches
keyed state only through ``ctx.apply_to_keyed_state(name, fn)`` (Flink's
``applyToKeyedState``): a direct keyed state access there raises an error naming that fix.
The operators are in :mod:`snapflow.worker.api.broadcast_operators`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.event_time import MIN_WATERMARK
from snapflow.worker.api.co_functions import RowSideOutputs
from snapflow.worker.api.functions import KeyedContext, RichFunction, Rows
from snapflow.worker.runtime.operator import OperatorContext, OutputTag
from snapflow.worker.state.broadcast_state import BroadcastState, ReadOnlyBroadcastState
from snapflow.worker.state.keyed_backend import KeyedStateBackend

__all__ = [
    "BroadcastContext",
    "BroadcastProcessFunction",
    "KeyedBroadcastContext",
    "KeyedBroadcastProcessFunction",
    "MapStateDescriptor",
    "ReadOnlyBroadcastContext",
    "ReadOnlyKeyedBroadcastContext",
    "broadcast_side_keyed_state_error",
]


@dataclass(frozen=True)
class MapStateDescriptor:
    """Names one broadcast state, a map (Flink's ``MapStateDescriptor``; no serializers: keys
    and values are any picklable Python values)."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise InvalidArgumentError(
                f"MapStateDescriptor needs a non-empty name, got {self.name!r}"
            )


def _broadcast_state(ctx: OperatorContext, descriptor: MapStateDescriptor) -> BroadcastState:
    if not isinstance(descriptor, MapStateDescriptor):
        raise InvalidArgumentError(
            f"get_broadcast_state needs a MapStateDescriptor, got {descriptor!r:.80}"
        )
    return ctx.operator_state.get_broadcast_state(descriptor.name)


def broadcast_side_keyed_state_error(what: str) -> StateError:
    """The error of keyed state used on the broadcast side of a keyed broadcast function."""
    return StateError(
        f"{what} in process_broadcast_element: the broadcast input has no key, so keyed state "
        f"and timers cannot be used there directly; use ctx.apply_to_keyed_state(name, fn) to "
        f"read or write the state of every key, or use keyed state in process_element"
    )


class _BroadcastSide:
    """What every broadcast context shares: the subtask and side outputs."""

    def __init__(self, ctx: OperatorContext, side: RowSideOutputs) -> None:
        self._ctx = ctx
        self._side = side

    @property
    def subtask_index(self) -> int:
        return self._ctx.subtask_index

    def output(self, tag: OutputTag, row: dict[str, Any]) -> None:
        """Send ``row`` to the side output ``tag``."""
        self._side.output(tag, row)


class ReadOnlyBroadcastContext(_BroadcastSide):
    """The element side of a :class:`BroadcastProcessFunction`: broadcast state read-only;
    ``current_watermark``: the minimum over both inputs."""

    def __init__(self, ctx: OperatorContext, side: RowSideOutputs) -> None:
        super().__init__(ctx, side)
        self.current_watermark: int = MIN_WATERMARK

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> ReadOnlyBroadcastState:
        return _broadcast_state(self._ctx, descriptor).read_only()


class BroadcastContext(_BroadcastSide):
    """The broadcast side of a :class:`BroadcastProcessFunction`: broadcast state writable."""

    def __init__(self, ctx: OperatorContext, side: RowSideOutputs) -> None:
        super().__init__(ctx, side)
        self.current_watermark: int = MIN_WATERMARK

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        return _broadcast_state(self._ctx, descriptor)


class ReadOnlyKeyedBroadcastContext(KeyedContext):
    """The element side (and ``on_timer``) of a :class:`KeyedBroadcastProcessFunction`: the
    current key, its keyed state and event-time timers, broadcast state read-only."""

    def __init__(
        self, backend: KeyedStateBackend, ctx: OperatorContext, side: RowSideOutputs
    ) -> None:
        super().__init__(backend, ctx)
        self._side = side

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> ReadOnlyBroadcastState:
        return _broadcast_state(self._ctx, descriptor).read_only()

    def output(self, tag: OutputTag, row: dict[str, Any]) -> None:
        """Send ``row`` to the side output ``tag``."""
        self._side.output(tag, row)


class KeyedBroadcastContext(_BroadcastSide):
    """The broadcast side of a :class:`KeyedBroadcastProcessFunction`: broadcast state
    writable, keyed state only through :meth:`apply_to_keyed_state`."""

    def __init__(
        self, ctx: OperatorContext, side: RowSideOutputs, keyed: ReadOnlyKeyedBroadcastContext
    ) -> None:
        super().__init__(ctx, side)
        self._keyed = keyed

    @property
    def current_watermark(self) -> int:
        return self._keyed.current_watermark

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        return _broadcast_state(self._ctx, descriptor)

    def apply_to_keyed_state(self, name: str, fn: Callable[[Any, KeyedContext], Any]) -> None:
        """``fn(key, ctx)`` for every key of this subtask that has keyed state ``name``, with
        ``key`` current on ``ctx`` (the element side's keyed context): read or write any keyed
        state of that key there (Flink's ``applyToKeyedState``). Keys in key-group order."""
        backend = self._keyed._backend
        keys = [k for k, _ in backend.entries(self._ctx.state_name(name))]
        try:
            for key in keys:
                backend.set_current_key(key)
                fn(key, self._keyed)
        finally:
            backend.clear_current_key()

    def _no_key(self, what: str) -> NoReturn:
        raise broadcast_side_keyed_state_error(what)

    @property
    def current_key(self) -> Any:
        self._no_key("current_key")

    def get_value_state(self, name: str, default: Any = None) -> Any:
        self._no_key(f"get_value_state({name!r})")

    def get_list_state(self, name: str) -> Any:
        self._no_key(f"get_list_state({name!r})")

    def get_map_state(self, name: str) -> Any:
        self._no_key(f"get_map_state({name!r})")

    def get_reducing_state(self, name: str, reduce_fn: Callable[[Any, Any], Any]) -> Any:
        self._no_key(f"get_reducing_state({name!r})")

    def get_aggregating_state(self, name: str, fn: Any) -> Any:
        self._no_key(f"get_aggregating_state({name!r})")

    def register_event_time_timer(self, timestamp: int) -> None:
        self._no_key("register_event_time_timer")


class BroadcastProcessFunction(RichFunction):
    """The broadcast state pattern on a non-keyed stream: use it with
    ``stream.connect(other.broadcast()).process(f)``.

    ``process_element(row, ctx)``: a row of input 0, broadcast state read-only
    (:class:`ReadOnlyBroadcastContext`). ``process_broadcast_element(row, ctx)``: a row of the
    broadcast input, broadcast state writable (:class:`BroadcastContext`). Both return or
    yield output rows (dicts), or None.
    """

    def process_element(self, row: dict[str, Any], ctx: ReadOnlyBroadcastContext) -> Rows:
        raise NotImplementedError

    def process_broadcast_element(self, row: dict[str, Any], ctx: BroadcastContext) -> Rows:
        raise NotImplementedError


class KeyedBroadcastProcessFunction(RichFunction):
    """The broadcast state pattern on a keyed stream: use it with
    ``stream.key_by(k).connect(other.broadcast()).process(f)``.

    ``process_element(row, ctx)``: a row of the keyed input with its key current
    (:class:`ReadOnlyKeyedBroadcastContext`: keyed state, event-time timers, broadcast state
    read-only). ``process_broadcast_element(row, ctx)``: a broadcast row
    (:class:`KeyedBroadcastContext`: broadcast state writable, keyed state of every key through
    ``apply_to_keyed_state``). ``on_timer(timestamp, ctx)``: a timer of ``ctx.current_key``
    fired (the element side's context). All return or yield output rows (dicts), or None.
    """

    def process_element(self, row: dict[str, Any], ctx: ReadOnlyKeyedBroadcastContext) -> Rows:
        raise NotImplementedError

    def process_broadcast_element(self, row: dict[str, Any], ctx: KeyedBroadcastContext) -> Rows:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: ReadOnlyKeyedBroadcastContext) -> Rows:
        return None
