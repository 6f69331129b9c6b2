"""State larger than memory: the disk (RocksDB) backend's incremental checkpoints against full
ones, its throughput against the heap backend's, its memory, and restore time.

``make bench BENCH=state`` (``python -m bench.state_bench``): the issue's size by default, 10 M
keys, about a gigabyte of live state (``--keys`` for another), a few minutes on a 2-core
machine. Results: ``bench/results/state.json``.

Parts:

1. **Checkpoints** (a child process, so its peak RSS is its own): a disk backend whose memory
   budget is a quarter of the state it holds loads ``--keys`` keys with ``--value-bytes``
   random bytes each, then ``--rounds`` times updates ``--update-fraction`` of the keys (1%: the
   issue's "1% of keys updated per second", one checkpoint per second of updates) and takes an
   incremental checkpoint, the completion notified as the coordinator would. The checkpoint
   directory is on another file system than the state (``--checkpoint-dir``, ``/dev/shm`` by
   default), so that every new byte is copied as to the shared storage of a cluster; the run
   is repeated with checkpoints beside the state (``linked_*`` figures), where the local store
   hard-links the immutable SST files instead of copying them. Then one full checkpoint (nothing reused) and a restore of the latest
   incremental checkpoint into a new backend (download and open).
2. **Throughput**: the keyed count operator's state work (Arrow pre-aggregation per batch, then
   one fold per distinct key through the bulk API, as ``KeyedCount`` does) on each backend,
   records/s, over the same batches of uniformly random keys.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import operator
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa

from bench.common import write_results
from snapflow.checkpointing import (
    INCREMENTAL,
    SHARED_NEW,
    BarrierOptions,
    CheckpointKind,
    StateHandle,
)
from snapflow.worker.api.keyed_operators import fold_and_get
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.keyed_state import aggregate_batch
from snapflow.worker.state.rocksdb_backend import RocksDBKeyedStateBackend
from snapflow.worker.state.rocksdb_tuning import RocksDBTuning

MAXP = 128
BATCH = 10_000


LINKED_METRICS = (
    "incremental_checkpoint_p50_ms",
    "incremental_checkpoint_p99_ms",
    "full_checkpoint_ms",
    "restore_s",
)
"""Reported again (``linked_``) for checkpoints on the state's own file system."""


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _checkpoint(
    backend: RocksDBKeyedStateBackend, root: str, cid: int, notify: bool
) -> tuple[float, int, int, list[StateHandle]]:
    """(seconds, bytes uploaded, bytes of the whole snapshot, handles)."""
    target = os.path.join(root, "job", f"chk-{cid}")
    start = time.perf_counter()
    snap = backend.snapshot(cid, BarrierOptions(CheckpointKind.CHECKPOINT, target_location=target))
    handles = snap.write(os.path.join(target, "count-0-1", "v/keyed"))
    snap.release()
    elapsed = time.perf_counter() - start
    if notify:
        backend.notify_checkpoint_complete(cid)
    uploaded = sum(h.size_bytes for h in handles if h.kind in (SHARED_NEW, INCREMENTAL))
    whole = sum(h.size_bytes for h in handles)
    return elapsed, uploaded, whole, handles


def _tuning(args: argparse.Namespace, budget: int) -> RocksDBTuning:
    base = RocksDBTuning()
    return RocksDBTuning(
        memory_budget_bytes=budget,
        compaction_style=args.compaction_style or base.compaction_style,
        compaction_trigger=_or(args.compaction_trigger, base.compaction_trigger),
        max_size_amplification_percent=_or(args.max_size_amp, base.max_size_amplification_percent),
        upload_threads=_or(args.upload_threads, base.upload_threads),
    )


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def checkpoints(args: argparse.Namespace) -> dict[str, Any]:
    """Part 1, in the child process."""
    rng = np.random.default_rng(7)
    state_estimate = args.keys * (args.value_bytes + 16)
    budget = max(8 << 20, state_estimate // 4)
    work = tempfile.mkdtemp(prefix="snapflow-state-bench-")
    tuning = _tuning(args, budget)
    backend = RocksDBKeyedStateBackend(
        MAXP,
        (0, MAXP - 1),
        name="v/keyed",
        local_dir=os.path.join(work, "local"),
        tuning=tuning,
        cache_entries=min(100_000, args.keys // 100),
    )
    state = backend.get_value_state("value")
    width = args.value_bytes

    def values(n: int) -> list[bytes]:
        blob = rng.bytes(n * width)
        return [blob[i * width : (i + 1) * width] for i in range(n)]

    start = time.perf_counter()
    for begin in range(0, args.keys, BATCH):
        keys = np.arange(begin, min(args.keys, begin + BATCH), dtype=np.int64)
        state.update_many(pa.array(keys), values(len(keys)))
    # Start from the state as a long-running job's full compaction leaves it (one sorted
    # run), not from a bulk load's compaction debt, which would be paid off during the rounds.
    backend._flush()
    backend.db.flush()
    backend.db.compact_range(None, None)
    load_s = time.perf_counter() - start
    # Checkpoint storage on the database's file system takes SST files as hard links (no bytes
    # move: filestore's LocalStore.upload_file); on another one (``--checkpoint-dir``, e.g. a
    # tmpfs) every new byte is copied, as to any shared storage a cluster would use.
    root = (
        tempfile.mkdtemp(prefix="snapflow-state-bench-", dir=args.checkpoint_dir)
        if args.checkpoint_dir
        else os.path.join(work, "checkpoints")
    )
    _checkpoint(backend, root, 1, notify=True)  # the first one uploads everything
    times, uploaded, whole = [], [], []
    per_round = max(1, int(args.keys * args.update_fraction))
    handles: list[StateHandle] = []
    for cid in range(2, args.rounds + 2):
        keys = rng.choice(args.keys, size=per_round, replace=False).astype(np.int64)
        for begin in range(0, per_round, BATCH):
            chunk = keys[begin : begin + BATCH]
            state.update_many(pa.array(chunk), values(len(chunk)))
        elapsed, up, full, handles = _checkpoint(backend, root, cid, notify=True)
        times.append(elapsed * 1000)
        uploaded.append(up)
        whole.append(full)
    # A full checkpoint of the same state: nothing reused.
    backend._confirmed = {}
    full_s, full_bytes, _, _ = _checkpoint(backend, root, args.rounds + 2, notify=False)
    # The live data alone (no space amplification): the files after a full compaction.
    backend.db.compact_range(None, None)
    db_dir = backend._db_path
    live_bytes = sum(
        os.path.getsize(os.path.join(db_dir, n)) for n in os.listdir(db_dir) if n.endswith(".sst")
    )
    state_bytes = sum(h.size_bytes for h in handles)
    start = time.perf_counter()
    restored = RocksDBKeyedStateBackend(
        MAXP, (0, MAXP - 1), local_dir=os.path.join(work, "restored"), tuning=tuning
    )
    restored.restore(handles)
    restore_s = time.perf_counter() - start
    probe = restored.get_value_state("value").get_many(list(range(0, args.keys, 9973)))
    assert all(v is not None and len(v) == width for v in probe), "restore lost values"
    restored.dispose()
    backend.dispose()
    subprocess.run(["rm", "-rf", work, root], check=False)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "load_s": round(load_s, 2),
        "incremental_checkpoint_p50_ms": round(_p(times, 0.5), 1),
        "incremental_checkpoint_p99_ms": round(_p(times, 0.99), 1),
        "incremental_bytes_mean": int(statistics.mean(uploaded)),
        "incremental_bytes_max": max(uploaded),
        "full_checkpoint_ms": round(full_s * 1000, 1),
        "full_bytes": full_bytes,
        "incremental_bytes_ratio": round(statistics.mean(uploaded) / full_bytes, 4),
        "live_bytes": live_bytes,
        "incremental_vs_live_bytes_ratio": round(statistics.mean(uploaded) / live_bytes, 4),
        "state_bytes": state_bytes,
        "restore_s": round(restore_s, 2),
        "memory_budget_mb": round(budget / 2**20, 1),
        "peak_rss_mb": round(peak_rss_mb, 1),
    }


def _throughput(backend: KeyedStateBackend, batches: list[pa.Array]) -> float:
    count = backend.get_reducing_state("count", operator.add)
    records = 0
    start = time.perf_counter()
    for keys in batches:
        distinct, counts = aggregate_batch(keys)
        groups = kgs.key_groups(distinct, MAXP)
        fold_and_get(count, operator.add, distinct, counts, groups)
        records += len(keys)
    return records / (time.perf_counter() - start)


def _compare(keys: int, records: int) -> tuple[float, float]:
    rng = np.random.default_rng(3)
    batches = [
        pa.array(rng.integers(0, keys, size=4096, dtype=np.int64)) for _ in range(records // 4096)
    ]
    heap = _throughput(KeyedStateBackend(MAXP, (0, MAXP - 1)), batches)
    with tempfile.TemporaryDirectory() as local:
        disk_backend = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), local_dir=local)
        disk = _throughput(disk_backend, batches)
        disk_backend.dispose()
    return heap, disk


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    """The keyed count job's key space (10,000 keys, as bench/keyed_count_ops.py), and a cold
    one: uniformly random keys over ``--cold-keys``, ten times the disk backend's cache."""
    heap, disk = _compare(args.throughput_keys, args.throughput_records)
    cold_heap, cold_disk = _compare(args.cold_keys, args.cold_records)
    return {
        "heap_records_per_s": int(heap),
        "disk_records_per_s": int(disk),
        "disk_vs_heap_throughput_ratio": round(disk / heap, 3),
        "cold_heap_records_per_s": int(cold_heap),
        "cold_disk_records_per_s": int(cold_disk),
        "cold_disk_vs_heap_throughput_ratio": round(cold_disk / cold_heap, 3),
    }


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.state_bench", description=__doc__)
    parser.add_argument("--keys", type=int, default=10_000_000, help="keys held (issue 14: 10 M)")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=100, help="incremental checkpoints")
    parser.add_argument("--update-fraction", type=float, default=0.01)
    parser.add_argument("--throughput-keys", type=int, default=10_000)
    parser.add_argument("--throughput-records", type=int, default=4_000_000)
    parser.add_argument("--cold-keys", type=int, default=1_000_000)
    parser.add_argument("--cold-records", type=int, default=1_000_000)
    parser.add_argument("--compaction-style", default="", help="default: the backend's")
    parser.add_argument("--compaction-trigger", type=int, default=None)
    parser.add_argument("--max-size-amp", type=int, default=None)
    parser.add_argument("--upload-threads", type=int, default=None)
    parser.add_argument(
        "--checkpoint-dir",
        default="/dev/shm" if os.path.isdir("/dev/shm") else "",
        help="a directory on another file system than the state's (copies, as to shared "
        "storage); '' for beside the state (hard links)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _tuning_flags(args: argparse.Namespace) -> list[str]:
    flags = [f"--compaction-style={args.compaction_style}"] if args.compaction_style else []
    for name in ("compaction_trigger", "max_size_amp", "upload_threads"):
        value = getattr(args, name)
        if value is not None:
            flags.append(f"--{name.replace('_', '-')}={value}")
    return flags


def main(argv: list[str] | None = None) -> int:
    args = _args(argv if argv is not None else [])
    if args.child:
        print(json.dumps(checkpoints(args)))
        return 0

    def child(checkpoint_dir: str) -> dict[str, Any]:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.state_bench",
                "--child",
                f"--keys={args.keys}",
                f"--value-bytes={args.value_bytes}",
                f"--rounds={args.rounds}",
                f"--update-fraction={args.update_fraction}",
                f"--checkpoint-dir={checkpoint_dir}",
                *_tuning_flags(args),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
        return result

    # The figures: checkpoints copied to another file system (what shared storage costs);
    # beside them, the same run with checkpoints on the state's file system (hard links).
    part1 = child(args.checkpoint_dir)
    if args.checkpoint_dir:
        linked = child("")
        for name in LINKED_METRICS:
            part1[f"linked_{name}"] = linked[name]
    part2 = throughput(args)
    metrics = {**part1, **part2}
    path = write_results(
        "state",
        metrics,
        workload={
            "keys": args.keys,
            "value_bytes": args.value_bytes,
            "update_fraction": args.update_fraction,
            "rounds": args.rounds,
            "throughput_keys": args.throughput_keys,
            "throughput_records": args.throughput_records,
            "cold_keys": args.cold_keys,
            "cold_records": args.cold_records,
            "checkpoint_dir": args.checkpoint_dir,
            "tuning": {
                k: v
                for k, v in dataclasses.asdict(_tuning(args, 1)).items()
                if k != "memory_budget_bytes"
            },
            "note": (
                "one disk backend holding all 128 key groups, memory budget a quarter of the "
                "state, starting from a fully compacted state; checkpoints to a directory on "
                "another file system (checkpoint_dir; every new byte copied), linked_*: the "
                "same run with checkpoints beside the state (SST files hard-linked); full_bytes: a full checkpoint of the files at the end (space "
                "amplification included), live_bytes: the same state fully compacted; "
                "throughput is the keyed count operator's state work per backend, in process"
            ),
        },
        targets={
            "incremental_checkpoint_p99_ms": "< 1000",
            "incremental_bytes_ratio": "<= 0.05",
            "disk_vs_heap_throughput_ratio": ">= 0.5",
        },
    )
    print(json.dumps(metrics, indent=2))
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
