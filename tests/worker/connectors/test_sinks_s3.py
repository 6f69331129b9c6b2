"""The exactly-once file sinks on S3 (moto's server, never a mock): a transaction is a multipart
upload, pre-committed (parts uploaded, invisible) on the barrier and completed on the
checkpoint's completion notice; restores re-commit idempotently and abort what the restored
state did not commit; readers (``read_committed``, ``pyarrow.dataset``) see committed rows
only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs
import pytest
from kit.s3 import S3Server
from kit.sinks import (
    crash_after_a_lost_notice,
    crash_before_a_completion,
    crash_sink,
    finish_sink,
    kb,
    restore_sink,
    sink_ctx,
)
from kit.workers import check_exactly_once, expected_counts

from snapflow.errors import StateError, StorageError
from snapflow.filestore_registry import store_for
from snapflow.s3_filestore import S3FileStore
from snapflow.s3_multipart import MultipartUploads
from snapflow.worker.connectors.file_sink import (
    FileTransaction,
    TransactionalFileSink,
    committed_files,
    read_committed,
)
from snapflow.worker.connectors.file_staging import MultipartStaging
from snapflow.worker.connectors.parquet_sink import (
    TransactionalParquetSink,
    committed_parquet_files,
    read_committed_parquet,
)
from snapflow.worker.state.operator_state import OperatorStateBackend


def committed(directory: str) -> list[int]:
    table = read_committed(directory)
    return table.column("v").to_pylist() if table.num_rows else []


def objects(directory: str) -> list[str]:
    """Every object under ``directory``: what any S3 reader can see."""
    return [p.rsplit("/", 1)[-1] for p in store_for(directory).list(directory)]


def uploads(directory: str) -> list[str]:
    """The names of the multipart uploads in progress under ``directory``."""
    s3 = MultipartUploads(_store(directory))
    return sorted(p.rsplit("/", 1)[-1] for p, _ in s3.list_uploads(directory + "/"))


def _store(directory: str) -> S3FileStore:
    store = store_for(directory)
    assert isinstance(store, S3FileStore)
    return store


def _requests(directory: str) -> dict[str, int]:
    return _store(directory).requests.snapshot()


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


# ---------------------------------------------------------------------------------------------
# The lifecycle
# ---------------------------------------------------------------------------------------------


def test_s3_transaction_is_invisible_until_its_checkpoint_completes(s3_bucket: str) -> None:
    out = f"s3://{s3_bucket}/out"
    sink = TransactionalFileSink(out)
    sink.open(sink_ctx(OperatorStateBackend()))
    assert isinstance(sink.staging, MultipartStaging)
    sink.process_batch(kb([1, 2]))
    assert objects(out) == [] and uploads(out) == []  # spooled locally only
    before = _requests(out)
    sink.snapshot_state(1)  # pre-commit: one upload started, one part
    assert _delta(before, _requests(out)) == {"put": 2}
    ((cid, txn),) = sink.pending_transactions
    assert cid == 1 and txn.upload_id is not None and len(txn.parts) == 1
    assert uploads(out) == [txn.part_name]
    assert objects(out) == [] and committed(out) == []  # invisible: no object yet
    sink.process_batch(kb([3]))
    before = _requests(out)
    sink.notify_checkpoint_complete(1)  # commit: one CompleteMultipartUpload
    assert _delta(before, _requests(out)) == {"put": 1}
    assert committed(out) == [1, 2] and uploads(out) == []
    assert objects(out) == [txn.part_name]
    sink.notify_checkpoint_complete(1)  # repeated: nothing happens
    sink.commit(txn)  # committed already: a no-op
    assert committed(out) == [1, 2]
    # a lost notification is repaired by the next one, in checkpoint order
    sink.snapshot_state(2)
    sink.process_batch(kb([4]))
    sink.snapshot_state(3)
    sink.snapshot_state(4)  # empty transaction: no upload, no request
    sink.notify_checkpoint_complete(4)
    assert committed(out) == [1, 2, 3, 4]
    assert [os.path.basename(p) for p in committed_files(out)] == objects(out)
    sink.process_batch(kb([5]))
    before = _requests(out)
    sink.close()  # aborts the open transaction: never uploaded, so no request
    assert _delta(before, _requests(out)) == {}
    assert committed(out) == [1, 2, 3, 4] and uploads(out) == []
    assert all(name.startswith("part-0-") for name in objects(out))


def test_s3_abort_of_a_pre_committed_transaction_leaves_nothing(s3_bucket: str) -> None:
    out = f"s3://{s3_bucket}/out"
    sink = TransactionalFileSink(out)
    sink.open(sink_ctx(OperatorStateBackend()))
    sink.process_batch(kb([1, 2]))
    sink.snapshot_state(1)
    ((_, txn),) = sink.pending_transactions
    assert uploads(out) == [txn.part_name]
    sink.abort(txn)
    sink.abort(txn)  # idempotent
    assert uploads(out) == [] and objects(out) == [] and committed(out) == []
    sink.close()
    assert uploads(out) == [] and objects(out) == []


def test_s3_restore_recommits_idempotently_and_aborts_the_current_transaction(
    s3_bucket: str, tmp_path: Path
) -> None:
    out = f"s3://{s3_bucket}/out"
    sink = TransactionalFileSink(out)
    h2 = crash_after_a_lost_notice(sink, tmp_path)
    assert committed(out) == [1, 2] and len(uploads(out)) == 1
    # the first recovery re-commits 2, then dies before any checkpoint
    again = restore_sink(sink, 2, h2, attempt=1)
    assert committed(out) == [1, 2, 3, 4] and uploads(out) == []
    again.process_batch(kb([5, 6]))
    crash_sink(again)
    # the second recovery commits 2 again: the object exists, nothing changes
    restored = restore_sink(sink, 2, h2, attempt=2)
    assert committed(out) == [1, 2, 3, 4] and uploads(out) == []
    finish_sink(restored, [5, 6], 3, tmp_path)  # the replay
    assert committed(out) == [1, 2, 3, 4, 5, 6]
    assert uploads(out) == [] and len(objects(out)) == 3


def test_s3_restore_of_an_earlier_checkpoint_aborts_the_later_upload(
    s3_bucket: str, tmp_path: Path
) -> None:
    out = f"s3://{s3_bucket}/out"
    sink = TransactionalFileSink(out)
    # checkpoint 2 pre-committed (uploaded), never completes
    h1 = crash_before_a_completion(sink, tmp_path, after_barrier=[7])
    (late,) = uploads(out)
    assert late.startswith("part-0-2-")
    # checkpoint 1 recorded the transaction as current, before its upload existed: the
    # restore finds the upload by name and aborts it
    restored = restore_sink(sink, 1, h1, attempt=1)
    assert uploads(out) == [] and committed(out) == [1]
    finish_sink(restored, [2, 3], 2, tmp_path)
    assert committed(out) == [1, 2, 3] and uploads(out) == []


def test_s3_transaction_over_5_mib_is_uploaded_in_several_parts(s3_bucket: str) -> None:
    out = f"s3://{s3_bucket}/big"
    sink = TransactionalFileSink(out)
    sink.open(sink_ctx(OperatorStateBackend()))
    # incompressible rows, 11 MiB in all: three parts (5 MiB, 5 MiB, the rest)
    rows = [os.urandom(64 * 1024) for _ in range(176)]
    batch = pa.RecordBatch.from_pydict({"b": pa.array(rows, pa.binary())})
    sink.process_batch(batch)
    before = _requests(out)
    sink.snapshot_state(1)
    ((_, txn),) = sink.pending_transactions
    assert [n for n, _ in txn.parts] == [1, 2, 3]
    assert _delta(before, _requests(out)) == {"put": 4}  # start + 3 parts
    assert objects(out) == []
    sink.notify_checkpoint_complete(1)
    sink.close()
    (path,) = committed_files(out)
    assert _store(out).size(path) > 2 * MultipartUploads.MIN_PART_BYTES
    assert read_committed(out).column("b").to_pylist() == rows


# ---------------------------------------------------------------------------------------------
# Parquet on S3, read by pyarrow.dataset
# ---------------------------------------------------------------------------------------------


def test_s3_parquet_dataset_reads_committed_rows_only(s3: S3Server, s3_bucket: str) -> None:
    out = f"s3://{s3_bucket}/pq"
    sink = TransactionalParquetSink(out, compression="zstd")
    sink.open(sink_ctx(OperatorStateBackend()))
    sink.process_batch(kb([1, 2]))
    sink.snapshot_state(1)
    sink.process_batch(kb([3]))
    sink.snapshot_state(2)
    sink.notify_checkpoint_complete(1)  # 2 is pre-committed only
    sink.process_batch(kb([4]))  # open, spooled locally
    assert len(uploads(out)) == 1
    env = s3.env()
    arrow_s3 = pyarrow.fs.S3FileSystem(
        endpoint_override=env["AWS_ENDPOINT_URL"],
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        region=env["AWS_REGION"],
    )

    def visible() -> list[int]:
        table = ds.dataset(f"{s3_bucket}/pq", filesystem=arrow_s3, format="parquet").to_table()
        return sorted(table.column("v").to_pylist())

    assert visible() == [1, 2]
    assert read_committed_parquet(out).column("v").to_pylist() == [1, 2]
    sink.notify_checkpoint_complete(2)
    assert visible() == [1, 2, 3]
    # s3fs (fsspec) sees the same: only completed uploads are objects
    import s3fs

    fsspec_s3 = s3fs.S3FileSystem(endpoint_url=env["AWS_ENDPOINT_URL"], skip_instance_cache=True)
    table = ds.dataset(f"{s3_bucket}/pq", filesystem=fsspec_s3, format="parquet").to_table()
    assert sorted(table.column("v").to_pylist()) == [1, 2, 3]
    sink.close()
    assert visible() == [1, 2, 3] and uploads(out) == []
    assert [os.path.basename(p) for p in committed_parquet_files(out)] == sorted(objects(out))


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def test_s3_permanent_error_fails_the_snapshot_naming_bucket_and_operation(s3: S3Server) -> None:
    out = "s3://snapflow-no-such-bucket/out"
    sink = TransactionalFileSink(out)
    sink.open(sink_ctx(OperatorStateBackend()))
    sink.process_batch(kb([1]))
    with pytest.raises(StorageError) as failed:
        sink.snapshot_state(1)
    message = str(failed.value)
    assert "create_multipart_upload" in message and "snapflow-no-such-bucket" in message
    assert "NoSuchBucket" in message and len(message) < 500
    assert sink.pending_transactions == []
    # the transaction's spooled rows are gone with the failed pre-commit: writing on would
    # commit a transaction without them, so the sink refuses until a restore
    with pytest.raises(StateError, match="could not be pre-committed"):
        sink.process_batch(kb([2]))
    with pytest.raises(StateError, match="could not be pre-committed"):
        sink.snapshot_state(2)
    sink.close()


def test_s3_staging_refuses_parts_below_the_s3_minimum() -> None:
    with pytest.raises(Exception, match="5242880"):
        MultipartStaging("s3://bucket/out", part_bytes=1024)
    assert FileTransaction("x.arrow", 0, 0, "t").parts == ()


# ---------------------------------------------------------------------------------------------
# On local Spark: a task killed, the stage resubmitted, exactly-once output on S3
# ---------------------------------------------------------------------------------------------


@pytest.mark.spark
def test_killed_task_on_spark_commits_exactly_once_to_s3(
    spark: Any, s3_bucket: str, tmp_path: Path
) -> None:
    from snapflow.spark_bridge import FixedDelay, JobStatus, Pipeline
    from snapflow.worker.api.fault_injection import FailAt
    from snapflow.worker.connectors.split_sources import GeneratorSource

    out = f"s3://{s3_bucket}/out"
    source = GeneratorSource(
        total_records=100_000, rate_per_s=100_000, num_keys=200, batch_size=2048, seed=11
    )
    p = Pipeline("keyed-count-s3", parallelism=2, max_parallelism=128)
    # deployment 1, subtask 0: the Python worker exits after a checkpoint and 30,000 records
    crash = FailAt(how="exit", after_records=30_000, after_checkpoints=1)
    events = p.source(source, name="events").transform(crash, name="crash-once")
    events.key_by("key").count().sink(TransactionalFileSink(out))
    p.checkpointing(interval_ms=150, storage=tmp_path / "cp")  # checkpoint storage: local
    p.restart_strategy(FixedDelay(attempts=2, delay_s=0.2))
    result = p.run(spark, timeout_s=120.0)
    assert result.state is JobStatus.FINISHED and result.restarts == 1
    check_exactly_once(read_committed(out), expected_counts(source, 2))
    # what the killed run pre-committed was completed by the restore or aborted: no upload
    # is left behind, and every object is a committed part file
    assert uploads(out) == []
    assert [os.path.basename(p) for p in committed_files(out)] == sorted(
        objects(out), key=lambda n: [int(x) for x in n.split("-")[1:4]]
    )
