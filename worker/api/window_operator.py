"""The keyed window operator (Flink's ``WindowOperator`` with its event-time and
processing-time triggers), for one input or several keyed alike (window co-group and join).

* Windows come from the assigner (:mod:`snapflow.worker.api.window_assigners`); each input's
  contents of a window live in keyed state under ``(key, window)``
  (:mod:`snapflow.worker.api.window_contents`): the window start for fixed-size windows, the
  ``(start, end)`` pair for sessions. A batch is grouped per ``(key, window)`` with Arrow
  before the state is touched.
* Sessions (merging assigners): a key's windows are kept in keyed state (``sessions``); each
  batch's windows merge with them (:mod:`snapflow.worker.api.session_merging`), and the
  contents and timers of merged windows move to the window that covers them.
* Event time: one timer per ``(key, window)`` at the window's max timestamp (namespace
  ``(operator_id, window)``); a watermark ``>= end - 1`` fires it and the emitter
  (:mod:`snapflow.worker.api.window_emitters`) turns the fired windows into output. With
  ``allowed_lateness_ms = L > 0`` the state is kept until a second (cleanup) timer at
  ``end - 1 + L``, and rows for a window that already fired but is within the lateness fire it
  again at once with its updated contents. A window is *late* when ``end - 1 + L <=
  watermark``; a record none of whose windows took it and that is late itself
  (``ts + L <= watermark``) goes to the ``late_data_tag`` side output, or, without one, is
  counted in ``num_late_records_dropped`` (Flink's ``sideOutputLateData`` and
  ``numLateRecordsDropped``).
* Processing time: a record's time is the ``clock`` (ms) when it reaches the operator; a
  window fires (and is purged) once the clock reaches its max timestamp: the task calls the
  operator when its earliest window is due (``next_processing_time_ms``, the runtime's
  processing-time timers; also while no input arrives), and it checks whenever it runs (a batch
  of any input, a watermark) and at the end of input, which fires every window left. The due windows are kept in memory and rebuilt from the state on open. No
  lateness: nothing is late in processing time.
* ``end_input`` fires every remaining window (as the ``MAX_WATERMARK`` of a finished bounded
  source would). Watermarks are not part of snapshots: a restored operator fires its restored
  windows once the new watermark passes them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MAX_WATERMARK, MIN_WATERMARK
from snapflow.worker.api.arrays import arange
from snapflow.worker.api.session_merging import merge_sessions
from snapflow.worker.api.window_assigners import (
    TimeWindow,
    WindowAssigner,
    as_ms,
    check_ms,
    i64,
)
from snapflow.worker.api.window_contents import BuiltinAggContents, WindowContents
from snapflow.worker.api.window_emitters import FiredWindows, ResultRows, WindowEmitter
from snapflow.worker.api.window_functions import WindowContext
from snapflow.worker.runtime.chain import fire_timers
from snapflow.worker.runtime.operator import Operator, OperatorContext, OutputTag
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.keyed_backend import KeyedStateBackend, wall_clock_ms
from snapflow.worker.state.keyed_state import ValueState

__all__ = ["WindowAggregate", "WindowOperator"]

_I64 = pa.int64()
# (key, key group, window namespace): a window of one key
_Win = tuple[Any, int, Any]


class WindowOperator(Operator):
    """Keyed windows over ``len(key_fields)`` inputs keyed alike: input i's key is
    ``key_fields[i]``, its event time ``time_fields[i]`` (int ms or timestamp; unused in
    processing time), its contents ``contents[i]``; fired windows go to ``emitter``. See the
    module docstring."""

    _runtime_fields: tuple[str, ...] = (
        "_backend",
        "_owner",
        "_sessions",
        "_wctx",
        "_proc_heap",
        "_proc_pending",
        "_proc_seq",
    )

    def __init__(
        self,
        key_fields: Sequence[str],
        time_fields: Sequence[str | None],
        assigner: WindowAssigner,
        contents: Sequence[WindowContents],
        emitter: WindowEmitter,
        *,
        allowed_lateness_ms: int = 0,
        late_data_tag: OutputTag | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        if not isinstance(assigner, WindowAssigner):
            raise InvalidArgumentError(f"not a window assigner: {assigner!r:.100}")
        if not (len(key_fields) == len(time_fields) == len(contents) >= 1):
            raise InvalidArgumentError("a key field, a time field and contents per input")
        if assigner.is_event_time and not all(time_fields):
            raise InvalidArgumentError(
                f"{assigner!r} is an event-time assigner: every input needs a time_field"
            )
        self.allowed_lateness_ms = check_ms("allowed_lateness_ms", allowed_lateness_ms, 0)
        if self.allowed_lateness_ms and not assigner.is_event_time:
            raise InvalidArgumentError(
                f"allowed lateness applies to event time only; {assigner!r} windows processing "
                f"time, where nothing is late: drop allowed_lateness_ms"
            )
        if late_data_tag is not None and not isinstance(late_data_tag, OutputTag):
            raise InvalidArgumentError(f"late_data_tag must be an OutputTag, got {late_data_tag!r}")
        self.key_fields = tuple(key_fields)
        self.time_fields = tuple(time_fields)
        self.assigner = assigner
        self.contents = tuple(contents)
        self.emitter = emitter
        self.late_data_tag = late_data_tag
        self.clock = clock
        self.num_late_records_dropped = 0
        self._key_type: pa.DataType | None = None
        self._schemas: list[pa.Schema | None] = [None] * len(self.contents)
        self._watermark = MIN_WATERMARK

    # --- life cycle ---------------------------------------------------------------------------

    def _state_name(self, i: int) -> str:
        return "window" if len(self.contents) == 1 else f"window-{i}"

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._backend: KeyedStateBackend = ctx.require_keyed_state(self.name)
        for i, c in enumerate(self.contents):
            c.open(self._backend, ctx.state_name(self._state_name(i)))
        self._sessions: ValueState[Any] = self._backend.get_value_state(ctx.state_name("sessions"))
        self._owner = ctx.operator_id
        self._watermark = self._backend.timer_service.current_watermark
        self.num_late_records_dropped = 0
        self._wctx = WindowContext(ctx, self._now)
        self.emitter.open(ctx, self._wctx)
        self._proc_heap: list[tuple[int, int, Any, int, Any]] = []
        self._proc_pending: set[tuple[Any, Any]] = set()
        self._proc_seq = itertools.count()
        if not self.assigner.is_event_time:
            self._restore_processing_time()

    def close(self) -> None:
        self.emitter.close()

    def _now(self) -> int:
        return (self.clock or wall_clock_ms)()

    @property
    def current_watermark(self) -> int:
        return self._watermark

    # --- windows and their namespaces ---------------------------------------------------------

    def _window(self, ns: Any) -> TimeWindow:
        if self.assigner.is_merging:
            return TimeWindow(*ns)
        return TimeWindow(ns, ns + self.assigner.size_ms)

    def _bounds(self, namespaces: list[Any]) -> tuple[list[int], list[int]]:
        """The starts and ends of windows by namespace (no window objects: hot path)."""
        if self.assigner.is_merging:
            return [ns[0] for ns in namespaces], [ns[1] for ns in namespaces]
        size = self.assigner.size_ms
        return list(namespaces), [ns + size for ns in namespaces]

    # --- data ---------------------------------------------------------------------------------

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return self.process_input(0, batch)

    def process_input(self, input_index: int, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if not 0 <= input_index < len(self.contents):
            return super().process_input(input_index, batch)
        out = [] if self.assigner.is_event_time else self._fire_processing_time(self._now())
        n = batch.num_rows
        if not n:
            return out
        schema = batch.schema
        contents = self.contents[input_index]
        key_field, time_field = self.key_fields[input_index], self.time_fields[input_index]
        for name in (key_field, time_field, contents.value_field):
            if name is not None and schema.get_field_index(name) < 0:
                raise InvalidArgumentError(
                    f"{self.name}: field {name!r} not in input {input_index} (columns: "
                    f"{schema.names})"
                )
        if self._schemas[input_index] is None:
            self._schemas[input_index] = schema
        keys = batch.column(schema.get_field_index(key_field))
        if self._key_type is None:
            self._key_type = keys.type
        values = (
            batch.column(schema.get_field_index(contents.value_field))
            if contents.value_field is not None
            else None
        )
        contents.note_types(None if values is None else values.type)
        if self.assigner.is_event_time:
            ts = as_ms(batch.column(schema.get_field_index(time_field)))
            if ts.null_count:
                raise InvalidArgumentError(f"{self.name}: null event times in {time_field!r}")
        else:
            ts = pa.repeat(pa.scalar(self._now(), _I64), n)
        if self.assigner.is_merging:
            out += self._add_sessions(input_index, batch, keys, ts, values)
        else:
            out += self._add_fixed(input_index, batch, keys, ts, values)
        return out

    def _late(self, batch: pa.RecordBatch, rows: pa.Array | list[int]) -> None:
        """Records no window took and late themselves: to the side output, or dropped."""
        n = len(rows)
        if not n:
            return
        if self.late_data_tag is None:
            self.num_late_records_dropped += n
        else:
            self._context().output(self.late_data_tag, batch.take(rows))

    def _add_fixed(
        self,
        input_index: int,
        batch: pa.RecordBatch,
        keys: pa.Array,
        ts: pa.Array,
        values: pa.Array | None,
    ) -> list[pa.RecordBatch]:
        rows, starts = self.assigner.assign(ts)
        row_idx = rows if rows is not None else arange(len(ts))
        if rows is not None:
            keys = keys.take(rows)
        size, lateness, wm = self.assigner.size_ms, self.allowed_lateness_ms, self._watermark
        if self.assigner.is_event_time and wm > MIN_WATERMARK:
            # late window: start + size - 1 + lateness <= wm  <=>  start <= wm - size + 1 - L
            keep = pc.greater(starts, i64(wm - size + 1 - lateness))
            kept = pc.sum(keep).as_py() or 0
            if rows is None:  # one window per record: a late window is a late record
                if kept < len(starts):
                    self._late(batch, row_idx.filter(pc.invert(keep)))
            else:
                # Flink: a record is late when none of its windows was taken and the record
                # itself is late (ts + lateness <= wm); records in gaps included
                late_ts = pc.less_equal(ts, i64(wm - lateness))
                if pc.any(late_ts).as_py():
                    taken = pc.unique(rows.filter(keep))
                    untaken = pc.invert(pc.is_in(arange(len(ts)), value_set=taken))
                    self._late(batch, arange(len(ts)).filter(pc.and_(untaken, late_ts)))
            if kept < len(starts):
                keys, starts, row_idx = keys.filter(keep), starts.filter(keep), row_idx.filter(keep)
        if not len(starts):
            return []
        table = {"k": keys, "w": starts, "r": row_idx}
        if values is not None:
            table["v"] = (
                values if len(row_idx) == len(values) and rows is None else values.take(row_idx)
            )
        grouped = (
            pa.table(table)
            .group_by(["k", "w"], use_threads=False)
            .aggregate(self.contents[input_index].aggregations())
        )
        dkeys = grouped.column("k").combine_chunks()
        groups = kgs.key_groups(dkeys, self._backend.max_parallelism).to_pylist()
        key_list = dkeys.to_pylist()
        start_list = grouped.column("w").to_pylist()
        composites = list(zip(key_list, start_list, strict=True))
        self.contents[input_index].add(composites, groups, grouped, batch)
        wins = list(zip(key_list, groups, start_list, strict=True))
        return self._after_add(wins)

    def _after_add(self, wins: list[_Win]) -> list[pa.RecordBatch]:
        """Timers of windows that took records; those already fired (within the allowed
        lateness) fire again now."""
        if not self.assigner.is_event_time:
            for key, group, ns in wins:
                self._push_processing_time(key, group, ns)
            return []
        backend, timers, owner = self._backend, self._backend.timer_service, self._owner
        lateness, wm = self.allowed_lateness_ms, self._watermark
        late_firing: list[_Win] = []
        _, ends = self._bounds([ns for _, _, ns in wins])
        for win, end in zip(wins, ends, strict=True):
            key, group, ns = win
            max_ts = end - 1
            backend.set_current_key(key, group)
            if max_ts > wm:
                timers.register_event_time_timer(max_ts, (owner, ns))
            else:  # the window already fired (within the allowed lateness): fire again now
                late_firing.append(win)
            if lateness:
                timers.register_event_time_timer(max_ts + lateness, (owner, ns))
        return self._fire(late_firing)

    def _add_sessions(
        self,
        input_index: int,
        batch: pa.RecordBatch,
        keys: pa.Array,
        ts: pa.Array,
        values: pa.Array | None,
    ) -> list[pa.RecordBatch]:
        n, gap = len(ts), self.assigner.gap_ms  # type: ignore[attr-defined]
        lateness, wm = self.allowed_lateness_ms, self._watermark
        ts_list = ts.to_pylist()
        check_late = self.assigner.is_event_time and wm > MIN_WATERMARK
        by_key = (
            pa.table({"k": keys, "r": arange(n)})
            .group_by(["k"], use_threads=False)
            .aggregate([("r", "list")])
        )
        dkeys = by_key.column("k").combine_chunks()
        key_groups = kgs.key_groups(dkeys, self._backend.max_parallelism).to_pylist()
        backend, sessions = self._backend, self._sessions
        gid = [-1] * n
        wins: list[_Win] = []
        dropped: list[int] = []
        for key, group, rows in zip(
            dkeys.to_pylist(), key_groups, by_key.column("r_list").to_pylist(), strict=True
        ):
            backend.set_current_key(key, group)
            existing = [TimeWindow(*w) for w in sessions.value() or ()]
            new = [TimeWindow(ts_list[r], ts_list[r] + gap) for r in rows]
            late = [w.max_timestamp + lateness <= wm for w in new] if check_late else None
            update = merge_sessions(existing, new, late)
            dropped.extend(rows[i] for i in update.dropped)
            for merge in update.merges:
                target = merge.window
                for old in merge.absorbed:
                    if old == target:
                        continue
                    for c in self.contents:
                        c.move((key, tuple(old)), (key, tuple(target)), group)
                    self._forget_timers(key, group, old)
                for i in merge.rows:
                    gid[rows[i]] = len(wins)
                wins.append((key, group, tuple(target)))
            backend.set_current_key(key, group)
            sessions.update(tuple(tuple(w) for w in update.windows) or None)
        if dropped:
            self._late(batch, sorted(dropped))
        if not wins:
            return []
        gids = pa.array(gid, _I64)
        taken = pc.greater_equal(gids, i64(0))
        table = {"g": gids.filter(taken), "r": arange(n).filter(taken)}
        if values is not None:
            table["v"] = values.filter(taken)
        grouped = (
            pa.table(table)
            .group_by(["g"], use_threads=False)
            .aggregate(self.contents[input_index].aggregations())
        )
        order = grouped.column("g").to_pylist()
        self.contents[input_index].add(
            [(wins[g][0], wins[g][2]) for g in order],
            [wins[g][1] for g in order],
            grouped,
            batch,
        )
        return self._after_add(wins)

    def _forget_timers(self, key: Any, group: int, window: TimeWindow) -> None:
        """A window merged into another: its timers go (processing time: skipped lazily)."""
        if not self.assigner.is_event_time:
            self._proc_pending.discard((key, tuple(window)))
            return
        timers, ns = self._backend.timer_service, (self._owner, tuple(window))
        self._backend.set_current_key(key, group)
        timers.delete_event_time_timer(window.max_timestamp, ns)
        if self.allowed_lateness_ms:
            timers.delete_event_time_timer(window.max_timestamp + self.allowed_lateness_ms, ns)

    # --- firing -------------------------------------------------------------------------------

    # Fired windows travel as parallel lists (keys, key groups, namespaces), not as a tuple
    # per window: hundreds of thousands of small tuples per watermark cost garbage-collector
    # passes over the whole state.

    def _fire(self, wins: list[_Win], purge: bool = False) -> list[pa.RecordBatch]:
        return self._fire_lists(
            [k for k, _, _ in wins], [g for _, g, _ in wins], [ns for _, _, ns in wins], purge
        )

    def _fire_lists(
        self, keys: list[Any], groups: list[int], nss: list[Any], purge: bool = False
    ) -> list[pa.RecordBatch]:
        """Emit windows ``(keys[j], nss[j])``; ``purge``: and clear them (their last firing)."""
        if not keys:
            return []
        if purge:
            results = [c.take_results(zip(keys, nss, strict=True), groups) for c in self.contents]
            self._forget_sessions(keys, groups, nss)
        else:
            results = [c.results(zip(keys, nss, strict=True), groups) for c in self.contents]
        if len(results) == 1:
            keep = [j for j, v in enumerate(results[0]) if v is not None]
        else:
            keep = [
                j
                for j, vs in enumerate(zip(*results, strict=True))
                if any(v is not None for v in vs)
            ]
        if not keep:
            return []
        if len(keep) < len(keys):
            keys, nss = [keys[j] for j in keep], [nss[j] for j in keep]
            results = [[r[j] for j in keep] for r in results]
        self._wctx.current_watermark = self._watermark
        starts, ends = self._bounds(nss)
        fired = FiredWindows(
            keys=keys,
            starts=starts,
            ends=ends,
            results=results,
            key_type=self._key_type,
            result_types=[c.result_type() for c in self.contents],
            schemas=list(self._schemas),
        )
        return self.emitter.emit(fired)

    def _purge(self, keys: list[Any], groups: list[int], nss: list[Any]) -> None:
        if not keys:
            return
        for c in self.contents:
            c.clear_many(zip(keys, nss, strict=True), groups)
        self._forget_sessions(keys, groups, nss)

    def _forget_sessions(self, keys: list[Any], groups: list[int], nss: list[Any]) -> None:
        if self.assigner.is_merging:
            backend, sessions = self._backend, self._sessions
            for key, group, ns in zip(keys, groups, nss, strict=True):
                backend.set_current_key(key, group)
                left = tuple(w for w in sessions.value() or () if tuple(w) != ns)
                sessions.update(left or None)

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        if watermark_ms > self._watermark:
            self._watermark = watermark_ms
        if not self.assigner.is_event_time:
            return self._fire_processing_time(self._now())
        fired = fire_timers(self._backend, watermark_ms, self._owner)
        if not fired:
            return []
        keys = [t[1] for t in fired]  # Timer = (timestamp, key, namespace, key group)
        groups = [t[3] for t in fired]
        nss = [t[2][1] for t in fired]
        lateness = self.allowed_lateness_ms
        if not lateness:  # one timer per window: it fires and purges
            return self._fire_lists(keys, groups, nss, purge=True)
        # every window fires before it is purged: its firing timer is not later than its
        # cleanup timer, and a purged window never fires again
        _, ends = self._bounds(nss)
        fire = [j for j, t in enumerate(fired) if t[0] == ends[j] - 1]
        purge = [j for j, t in enumerate(fired) if t[0] == ends[j] - 1 + lateness]
        out = self._fire_lists(
            [keys[j] for j in fire], [groups[j] for j in fire], [nss[j] for j in fire]
        )
        self._purge([keys[j] for j in purge], [groups[j] for j in purge], [nss[j] for j in purge])
        return out

    def end_input(self) -> list[pa.RecordBatch]:
        if not self.assigner.is_event_time:
            return self._fire_processing_time(MAX_WATERMARK)
        return self.process_watermark(MAX_WATERMARK)

    # --- processing time ----------------------------------------------------------------------

    def _push_processing_time(self, key: Any, group: int, ns: Any) -> None:
        if (key, ns) in self._proc_pending:
            return
        self._proc_pending.add((key, ns))
        max_ts = self._window(ns).max_timestamp
        heapq.heappush(self._proc_heap, (max_ts, next(self._proc_seq), key, group, ns))

    def _restore_processing_time(self) -> None:
        backend = self._backend
        if self.assigner.is_merging:
            for key, windows in list(backend.entries(self._sessions.name)):
                for w in windows or ():
                    self._push_processing_time(key, backend.key_group_of(key), tuple(w))
            return
        for c in self.contents:
            for (key, ns), _ in list(backend.entries(c.state_name)):
                self._push_processing_time(key, backend.key_group_of(key), ns)

    def next_processing_time_ms(self) -> int | None:
        """Processing-time windows: when the earliest window's max timestamp has passed (the
        task then calls :meth:`process_processing_time`; a stale entry fires nothing)."""
        if self.assigner.is_event_time or not self._proc_heap:
            return None
        return int(self._proc_heap[0][0])

    def process_processing_time(self, now_ms: int) -> list[pa.RecordBatch]:
        if self.assigner.is_event_time:
            return []
        return self._fire_processing_time(self._now())

    def _fire_processing_time(self, now: int) -> list[pa.RecordBatch]:
        heap, pending = self._proc_heap, self._proc_pending
        due: list[_Win] = []
        while heap and heap[0][0] <= now:
            _, _, key, group, ns = heapq.heappop(heap)
            if (key, ns) in pending:
                pending.discard((key, ns))
                due.append((key, group, ns))
        return self._fire(due, purge=True)


class WindowAggregate(WindowOperator):
    """Keyed window aggregation: ``agg`` (``"sum"``, ``"count"``, ``"min"``, ``"max"``) of
    ``value_field`` (unused for ``"count"``) per key and window, windows from ``assigner``,
    event time from ``time_field`` (int ms or timestamp; None for processing time). Emits
    rows ``(key_field, "window_start", "window_end", output_field)``."""

    def __init__(
        self,
        key_field: str,
        time_field: str | None,
        value_field: str | None,
        assigner: WindowAssigner,
        agg: str = "sum",
        allowed_lateness_ms: int = 0,
        output_field: str = "value",
        late_data_tag: OutputTag | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(
            (key_field,),
            (time_field,),
            assigner,
            (BuiltinAggContents(agg, value_field),),
            ResultRows(key_field, output_field),
            allowed_lateness_ms=allowed_lateness_ms,
            late_data_tag=late_data_tag,
            clock=clock,
        )
        self.key_field = key_field
        self.time_field = time_field
        self.value_field = value_field
        self.agg = agg
        self.output_field = output_field
