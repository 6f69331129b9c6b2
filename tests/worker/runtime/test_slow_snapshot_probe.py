"""The slow-snapshot probe (a debugging aid, off by default): the GIL holders of a py-spy dump,
the dumps of a slow asynchronous part, and one line of phases per snapshot."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

from snapflow.worker.runtime.slow_snapshot_probe import (
    ENV_DIR,
    ENV_THRESHOLD_MS,
    AsyncPhases,
    SlowSnapshotProbe,
    gil_holders,
)

DUMP = """Process 1: python
Python v3.11.7

Thread 10 (idle): "MainThread"
    select (selectors.py:415)
Thread 11 (active+gil): "task-count-0"
    __call__ (keyed_count_ops.py:114)
    process (keyed_operators.py:200)
    run (mailbox.py:90)
    _bootstrap (threading.py:1002)
    _bootstrap_inner (threading.py:1045)
Thread 12 (active): "asyncio_0"
    write (state_files.py:200)
"""


def test_gil_holders_names_the_thread_and_its_innermost_frames() -> None:
    assert gil_holders(DUMP) == [
        "task-count-0: __call__ (keyed_count_ops.py:114) < process (keyed_operators.py:200) "
        "< run (mailbox.py:90) < _bootstrap (threading.py:1002)"
    ]
    assert gil_holders('Thread 1 (idle): "x"\n    f (a.py:1)\n') == []


def test_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_THRESHOLD_MS, raising=False)
    assert SlowSnapshotProbe.from_env() is None
    monkeypatch.setenv(ENV_THRESHOLD_MS, "40")
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    probe = SlowSnapshotProbe.from_env()
    assert probe is not None and probe.threshold_s == pytest.approx(0.04)
    assert probe.directory == tmp_path


def test_records_one_line_per_snapshot(tmp_path: Path) -> None:
    probe = SlowSnapshotProbe(50, tmp_path, py_spy=None)
    probe.record(AsyncPhases("count (1/2)", 7, total_ms=12, queued_ms=1.5))
    (line,) = (tmp_path).glob("async-phases-*.jsonl")
    row = json.loads(line.read_text())
    assert (row["subtask"], row["checkpoint_id"], row["total_ms"], row["queued_ms"]) == (
        "count (1/2)", 7, 12, 1.5,
    )  # fmt: skip


def test_a_slow_part_is_dumped_with_the_gil_holder(tmp_path: Path) -> None:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        pytest.skip("py-spy (the dev extra) is not installed")
    stop = threading.Event()

    def spin() -> None:  # holds the GIL as user code does
        x = 0
        while not stop.is_set():
            x += 1

    spinner = threading.Thread(target=spin, name="spinner", daemon=True)
    spinner.start()
    try:
        watcher = SlowSnapshotProbe(30, tmp_path, py_spy)
        done = watcher.watch("count (1/2)", 3)
        deadline = time.monotonic() + 30
        while not list(tmp_path.glob("slow-async-*-chk3-0.txt")) and time.monotonic() < deadline:
            time.sleep(0.05)
        done.set()
    finally:
        stop.set()
        spinner.join()
    (first,) = tmp_path.glob("slow-async-*-chk3-0.txt")
    text = first.read_text()
    if "Permission denied" in text or "py-spy failed" in text:
        pytest.skip(f"py-spy cannot attach here: {text[:200]}")
    assert text.startswith("# count (1/2) checkpoint 3: asynchronous part running for")
    assert '"spinner"' in text
