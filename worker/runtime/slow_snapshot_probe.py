"""A debugging aid for slow checkpoints: what every thread of this worker is doing while a
snapshot's asynchronous part is slow, and where that part's time went.

Off unless ``SNAPFLOW_DEBUG_SLOW_ASYNC_MS`` is set (a threshold in ms). Then, for every
asynchronous part of a snapshot:

* when it runs longer than the threshold, ``py-spy dump`` of this process (every thread's Python
  stack, and which thread holds the GIL: ``active+gil``), again every threshold while it goes
  on, at most ``MAX_DUMPS`` times; each dump is saved whole and its GIL holder logged
  (``checkpoint.slow_async_stacks``). py-spy needs ptrace: root, or ``CAP_SYS_PTRACE``.
* one JSON line per snapshot with its steps (:class:`AsyncPhases`), so that the slow ones can be
  compared with the rest.

Both go to ``SNAPFLOW_DEBUG_DIR`` (default: ``snapflow-debug`` in the temporary directory).
py-spy comes with the ``dev`` extra; without it the dumps are skipped (logged once).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

from snapflow.durable_files import write_atomic

ENV_THRESHOLD_MS = "SNAPFLOW_DEBUG_SLOW_ASYNC_MS"
ENV_DIR = "SNAPFLOW_DEBUG_DIR"
MAX_DUMPS = 4
DUMP_TIMEOUT_S = 20.0
GIL_FRAMES = 4  # innermost frames of a GIL holder in the log line (the dump has them all)

log = structlog.get_logger("snapflow.worker")


@dataclass
class AsyncPhases:
    """Where one asynchronous part of a snapshot spent its time (ms)."""

    subtask: str
    checkpoint_id: int
    total_ms: float = 0.0
    """What the subtask reports as its asynchronous duration."""
    queued_ms: float = 0.0
    """From handing the write to a thread to that thread starting it (a free pool thread and
    the GIL)."""
    serialise_ms: float = 0.0
    durable_ms: float = 0.0
    """fsync, rename, the directory's fsync; an object store's PUT."""
    thread_ms: float = 0.0
    """The whole write on its thread (or on the loop, for a snapshot encoded there): serialise
    and durable, and waits for the GIL in between."""
    resumed_ms: float = 0.0
    """From the thread's end to the subtask's coroutine running again on the agent's loop."""


class SlowSnapshotProbe:
    """Watches asynchronous parts (see the module docstring)."""

    def __init__(self, threshold_ms: float, directory: Path, py_spy: str | None) -> None:
        self.threshold_s = threshold_ms / 1000.0
        self.directory = directory
        self.py_spy = py_spy
        self._lines = directory / f"async-phases-{os.getpid()}.jsonl"
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_env(cls) -> SlowSnapshotProbe | None:
        """The probe ``SNAPFLOW_DEBUG_SLOW_ASYNC_MS`` asks for, or None (the default)."""
        raw = os.environ.get(ENV_THRESHOLD_MS, "").strip()
        if not raw:
            return None
        directory = Path(
            os.environ.get(ENV_DIR) or os.path.join(tempfile.gettempdir(), "snapflow-debug")
        )
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not os.path.exists(py_spy):
            log.warning("debug.no_py_spy", detail="install the dev extra for stack dumps")
            return cls(float(raw), directory, None)
        return cls(float(raw), directory, py_spy)

    def watch(self, subtask: str, checkpoint_id: int) -> threading.Event:
        """Start watching one asynchronous part; set the returned event when it ends."""
        done = threading.Event()
        if self.py_spy is not None:
            threading.Thread(
                target=self._dump_while_slow,
                args=(subtask, checkpoint_id, done),
                name=f"slow-snapshot-probe-{checkpoint_id}",
                daemon=True,
            ).start()
        return done

    def record(self, phases: AsyncPhases) -> None:
        line = json.dumps({"at": time.time(), **asdict(phases)})
        with self._lock, self._lines.open("a") as f:
            f.write(line + "\n")

    def _dump_while_slow(self, subtask: str, checkpoint_id: int, done: threading.Event) -> None:
        started = time.perf_counter()
        for n in range(MAX_DUMPS):
            if done.wait(self.threshold_s):
                return
            elapsed_ms = (time.perf_counter() - started) * 1000
            stacks = self._dump()
            name = f"slow-async-{os.getpid()}-{subtask.replace('/', '_')}-chk{checkpoint_id}-{n}"
            # all at once: whoever watches the directory sees a whole dump or none
            write_atomic(
                str(self.directory / f"{name}.txt"),
                f"# {subtask} checkpoint {checkpoint_id}: asynchronous part running for "
                f"{elapsed_ms:.0f} ms\n{stacks}".encode(),
            )
            log.warning(
                "checkpoint.slow_async_stacks",
                subtask=subtask,
                checkpoint_id=checkpoint_id,
                elapsed_ms=round(elapsed_ms),
                gil=gil_holders(stacks),
                file=name,
            )

    def _dump(self) -> str:
        assert self.py_spy is not None
        try:
            done = subprocess.run(
                [self.py_spy, "dump", "--pid", str(os.getpid())],
                capture_output=True,
                text=True,
                timeout=DUMP_TIMEOUT_S,
            )
        except (OSError, subprocess.SubprocessError) as e:
            return f"py-spy failed: {e}"
        return done.stdout + done.stderr


def gil_holders(stacks: str) -> list[str]:
    """``thread name: its innermost frames`` of each thread ``py-spy dump`` shows holding the
    GIL."""
    lines = stacks.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.startswith("Thread ") and "+gil)" in line:
            name = line.split(":", 1)[1].strip().strip('"') if ":" in line else line
            frames = []
            for frame in lines[i + 1 : i + 1 + GIL_FRAMES]:
                if not frame.startswith(" "):
                    break
                frames.append(frame.strip())
            out.append(f"{name}: {' < '.join(frames)}")
    return out
