"""FailAt: the exact point at which it fires, for one subtask or every subtask."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from snapflow.errors import InvalidArgumentError
from snapflow.worker.api.fault_injection import FailAt, InjectedFailure, read_marker
from snapflow.worker.runtime.operator import OperatorContext


def _batch(n: int) -> pa.RecordBatch:
    return pa.record_batch({"x": pa.array(range(n), pa.int64())})


def _opened(fault: FailAt, *, subtask: int, attempt: int = 1) -> FailAt:
    fault.open(OperatorContext(subtask_index=subtask, parallelism=3, attempt=attempt))
    return fault


def test_fires_in_the_batch_that_reaches_the_record_count() -> None:
    fault = _opened(FailAt(after_records=10), subtask=0)
    assert fault.process_batch(_batch(6))[0].num_rows == 6
    with pytest.raises(InjectedFailure, match=r"deployment 1, subtask 0 .* after 12 records"):
        fault.process_batch(_batch(6))


def test_other_subtasks_and_attempts_pass_everything() -> None:
    other_subtask = _opened(FailAt(subtask=0), subtask=1)
    other_attempt = _opened(FailAt(subtask=0, attempts=(2,)), subtask=0, attempt=1)
    for fault in (other_subtask, other_attempt):
        assert sum(b.num_rows for b in fault.process_batch(_batch(50))) == 50


@pytest.mark.parametrize("subtask", [0, 1, 2])
def test_subtask_none_fires_on_every_subtask(subtask: int) -> None:
    fault = _opened(FailAt(subtask=None), subtask=subtask)
    with pytest.raises(InjectedFailure, match=f"subtask {subtask} "):
        fault.process_batch(_batch(1))


def test_waits_for_completed_checkpoints() -> None:
    fault = _opened(FailAt(after_checkpoints=2), subtask=0)
    fault.process_batch(_batch(5))
    fault.notify_checkpoint_complete(1)
    fault.process_batch(_batch(5))
    fault.notify_checkpoint_complete(2)
    with pytest.raises(InjectedFailure, match="after 15 records and 2 checkpoints"):
        fault.process_batch(_batch(5))


def test_marker_makes_it_fire_once(tmp_path: Path) -> None:
    marker = str(tmp_path / "fired")
    first = _opened(FailAt(marker=marker), subtask=0)
    with pytest.raises(InjectedFailure):
        first.process_batch(_batch(3))
    record = read_marker(marker)
    assert record is not None and record["records_seen"] == 3 and record["subtask"] == 0
    again = _opened(FailAt(marker=marker), subtask=0, attempt=1)
    assert again.process_batch(_batch(3))[0].num_rows == 3


def test_seeded_is_reproducible() -> None:
    a = FailAt.seeded(7, parallelism=4, max_records=1000, max_checkpoints=3)
    b = FailAt.seeded(7, parallelism=4, max_records=1000, max_checkpoints=3)
    assert (a.subtask, a.after_records, a.after_checkpoints) == (
        b.subtask,
        b.after_records,
        b.after_checkpoints,
    )


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="how must be"):
        FailAt(how="crash")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=">= 0"):
        FailAt(subtask=-1)
