"""S3 failure handling against a real server: moto behind a fault-injecting HTTP proxy
(tests/kit/s3_faults.py) that answers chosen requests with S3's throttling (503 SlowDown) and
transient (500 InternalError) errors, resets connections, or loses answers. Transient errors are
retried with back-off within ``max_attempts`` attempts; beyond that a StorageError names the
bucket and the operation, promptly; create-if-absent never mistakes its own retried write for
another writer's; a sink upload with throttled parts commits exactly its rows, and one that
fails leaves nothing visible; a checkpoint whose ``_metadata`` PUT is throttled completes."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from kit.coordinator import running_coordinator, submit
from kit.s3 import S3Server
from kit.s3_faults import Fault, FaultProxy, fault_proxy
from kit.simulated_agent import SimulatedAgent
from kit.sinks import kb, sink_ctx

from snapflow import filestore_registry
from snapflow.errors import AlreadyExistsError, StateError, StorageError
from snapflow.s3_filestore import S3FileStore, S3Settings
from snapflow.s3_multipart import MultipartUploads
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.state.operator_state import OperatorStateBackend

TRANSIENT = [Fault.SLOW_DOWN, Fault.INTERNAL_ERROR]


# botocore's back-off before retry i (1-based) is at most 2 ** (i - 1) s (jitter below that).
def max_backoff_s(max_attempts: int) -> float:
    return float(sum(2 ** (i - 1) for i in range(1, max_attempts)))


@pytest.fixture
def proxy(s3: S3Server) -> Iterator[FaultProxy]:
    with fault_proxy(s3) as p:
        yield p


def via(proxy: FaultProxy, max_attempts: int = 3) -> S3FileStore:
    """A store that reaches moto through the proxy."""
    return S3FileStore(S3Settings(endpoint_url=proxy.url, max_attempts=max_attempts))


def direct(s3: S3Server) -> S3FileStore:
    """A store that reaches moto itself: what S3 really holds."""
    return S3FileStore(S3Settings(endpoint_url=s3.endpoint_url))


def outcomes(proxy: FaultProxy, method: str, target: str) -> list[Fault | int | None]:
    """What each matching request got: its fault, else moto's status."""
    return [s.fault or s.status for s in proxy.seen(method, target)]


# ---------------------------------------------------------------------------------------------
# Retried within the bound
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", TRANSIENT)
def test_put_and_get_are_retried_past_transient_errors(
    fault: Fault, proxy: FaultProxy, s3: S3Server, s3_bucket: str
) -> None:
    store = via(proxy, max_attempts=3)
    path = f"s3://{s3_bucket}/chk-1/a.state"
    data = os.urandom(64 * 1024)
    proxy.inject(fault, times=2, method="PUT", target="/chk-1/a.state$")
    store.write(path, data)
    assert outcomes(proxy, "PUT", "/a.state$") == [fault, fault, 200]
    assert direct(s3).read(path) == data  # intact

    proxy.inject(fault, times=2, method="GET", target="/chk-1/a.state$")
    assert store.read(path) == data
    assert outcomes(proxy, "GET", "/a.state$") == [fault, fault, 200]

    proxy.inject(fault, times=2, method="GET", target="/chk-1/a.state$")
    assert store.read_range(path, 1000, 10) == data[1000:1010]
    proxy.inject(fault, times=2, method="HEAD", target="/chk-1/a.state$")
    assert store.size(path) == len(data)
    assert outcomes(proxy, "HEAD", "/a.state$") == [fault, fault, 200]
    # Counted once each: the budget counts operations, the proxy counts attempts.
    assert store.requests.snapshot() == {"put": 1, "get": 2, "head": 1, "list": 0, "delete": 0}


def test_reset_connections_are_retried(proxy: FaultProxy, s3: S3Server, s3_bucket: str) -> None:
    store = via(proxy, max_attempts=3)
    path = f"s3://{s3_bucket}/k"
    store.write(f"s3://{s3_bucket}/warm", b"w")  # a pooled connection to reset
    proxy.inject(Fault.RESET, times=2, method="PUT", target="/k$")
    store.write(path, b"after resets")
    proxy.inject(Fault.RESET, times=2, method="GET", target="/k$")
    assert store.read(path) == b"after resets"
    assert direct(s3).read(path) == b"after resets"
    for method in ("PUT", "GET"):
        assert outcomes(proxy, method, "/k$") == [Fault.RESET, Fault.RESET, 200]


def test_a_get_whose_body_breaks_off_is_asked_again(
    proxy: FaultProxy, s3_bucket: str, tmp_path: Path
) -> None:
    """botocore retries requests, not the reading of a body once the answer began: the store
    asks again (a bug found here: the aiohttp error escaped, neither retried nor mapped)."""
    store = via(proxy, max_attempts=3)
    path = f"s3://{s3_bucket}/big"
    data = os.urandom(300 * 1024)
    store.write(path, data)
    proxy.inject(Fault.TRUNCATED_BODY, times=2, method="GET", target="/big$")
    assert store.read(path) == data
    proxy.inject(Fault.TRUNCATED_BODY, times=2, method="GET", target="/big$")
    size, _ = store.download_file(path, str(tmp_path / "big"))
    assert size == len(data) and (tmp_path / "big").read_bytes() == data  # started over
    assert outcomes(proxy, "GET", "/big$") == [Fault.TRUNCATED_BODY] * 2 + [200] + [
        Fault.TRUNCATED_BODY
    ] * 2 + [200]


# ---------------------------------------------------------------------------------------------
# The bound
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", TRANSIENT)
@pytest.mark.parametrize("max_attempts", [1, 3])
def test_errors_beyond_the_bound_name_bucket_and_operation(
    fault: Fault, max_attempts: int, proxy: FaultProxy, s3: S3Server, s3_bucket: str
) -> None:
    store = via(proxy, max_attempts=max_attempts)
    path = f"s3://{s3_bucket}/chk-2/b.state"
    proxy.inject(fault, times=100, target="/chk-2/b.state$")
    started = time.monotonic()
    with pytest.raises(StorageError) as put_error:
        store.write(path, b"never stored")
    with pytest.raises(StorageError) as get_error:
        store.read(path)
    elapsed = time.monotonic() - started
    for error, operation in ((put_error, "put_object"), (get_error, "get_object")):
        text = str(error.value)
        assert s3_bucket in text and operation in text and len(text) < 1000
    # Exactly max_attempts attempts each (max_attempts counts the first one: 1 is no retry).
    assert outcomes(proxy, "PUT", "b.state$") == [fault] * max_attempts
    assert outcomes(proxy, "GET", "b.state$") == [fault] * max_attempts
    assert elapsed < 2 * max_backoff_s(max_attempts) + 5  # two operations; no hang
    assert not direct(s3).exists(path)


def test_a_body_that_always_breaks_off_is_a_storage_error(
    proxy: FaultProxy, s3_bucket: str
) -> None:
    store = via(proxy, max_attempts=2)
    path = f"s3://{s3_bucket}/big"
    store.write(path, os.urandom(100 * 1024))
    proxy.inject(Fault.TRUNCATED_BODY, times=100, method="GET", target="/big$")
    with pytest.raises(StorageError, match="get_object") as error:
        store.read(path)
    assert s3_bucket in str(error.value) and "broke off" in str(error.value)
    assert outcomes(proxy, "GET", "/big$") == [Fault.TRUNCATED_BODY] * 2


def test_resets_are_bounded_too(proxy: FaultProxy, s3_bucket: str) -> None:
    store = via(proxy, max_attempts=2)
    proxy.inject(Fault.RESET, times=100, method="PUT", target="/r$")
    with pytest.raises(StorageError, match="put_object") as error:
        store.write(f"s3://{s3_bucket}/r", b"x")
    assert s3_bucket in str(error.value)
    # aiohttp may resend once on a reused connection, below botocore's attempts.
    assert 2 <= len(proxy.seen("PUT", "/r$")) <= 4


# ---------------------------------------------------------------------------------------------
# Create-if-absent (_metadata)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", [*TRANSIENT, Fault.RESET])
def test_create_retried_after_an_unapplied_error_creates(
    fault: Fault, proxy: FaultProxy, s3: S3Server, s3_bucket: str
) -> None:
    """The first attempt never reached moto (the proxy answered it): the retry creates."""
    store = via(proxy)
    path = f"s3://{s3_bucket}/chk-3/_metadata"
    store.write(f"s3://{s3_bucket}/warm", b"w")  # a pooled connection to reset
    proxy.inject(fault, times=1, method="PUT", target="/_metadata$")
    store.create(path, b"first")
    seen = proxy.seen("PUT", "/_metadata$")
    assert [s.fault or s.status for s in seen] == [fault, 200]
    assert all(s.headers.get("if-none-match") == "*" for s in seen)  # each attempt conditional
    assert direct(s3).read(path) == b"first"
    # A second writer still gets AlreadyExistsError, and the object stays.
    proxy.inject(fault, times=1, method="PUT", target="/_metadata$")
    with pytest.raises(AlreadyExistsError, match="never overwritten"):
        store.create(path, b"second")
    assert direct(s3).read(path) == b"first"


def test_create_whose_answer_was_lost_finds_its_own_object(
    proxy: FaultProxy, s3: S3Server, s3_bucket: str
) -> None:
    """moto stored the first attempt but the answer was lost: the retry meets 412. The bytes
    are ours, so the create succeeded (a bug found here: it reported "already exists")."""
    store = via(proxy)
    path = f"s3://{s3_bucket}/chk-4/_metadata"
    proxy.inject(Fault.RESET_AFTER_FORWARD, times=1, method="PUT", target="/_metadata$")
    store.create(path, b"mine")
    assert outcomes(proxy, "PUT", "/_metadata$") == [Fault.RESET_AFTER_FORWARD, 412]
    assert direct(s3).read(path) == b"mine"


def test_create_retried_into_another_writers_object_refuses(
    proxy: FaultProxy, s3: S3Server, s3_bucket: str
) -> None:
    path = f"s3://{s3_bucket}/chk-5/_metadata"
    direct(s3).create(path, b"winner")
    store = via(proxy)
    proxy.inject(Fault.SLOW_DOWN, times=1, method="PUT", target="/_metadata$")
    with pytest.raises(AlreadyExistsError, match="never overwritten"):
        store.create(path, b"stale coordinator")
    assert outcomes(proxy, "PUT", "/_metadata$") == [Fault.SLOW_DOWN, 412]
    assert direct(s3).read(path) == b"winner"


# ---------------------------------------------------------------------------------------------
# The S3 sink's multipart uploads
# ---------------------------------------------------------------------------------------------


def _sink_through(
    proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch, out: str, max_attempts: int
) -> TransactionalFileSink:
    """An opened sink on ``out`` whose store (``store_for`` with default settings, as the
    worker's) reaches moto through the proxy."""
    monkeypatch.setitem(filestore_registry._STORES, ("s3", S3Settings()), via(proxy, max_attempts))
    sink = TransactionalFileSink(out)
    sink.open(sink_ctx(OperatorStateBackend()))
    return sink


def _big_rows() -> pa.RecordBatch:
    # incompressible, 6 MiB: two parts (5 MiB and the rest)
    rows = [os.urandom(64 * 1024) for _ in range(96)]
    return pa.RecordBatch.from_pydict({"b": pa.array(rows, pa.binary())})


def test_sink_upload_with_a_throttled_part_commits_exactly_the_rows(
    proxy: FaultProxy, s3: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = f"s3://{s3_bucket}/out"
    sink = _sink_through(proxy, monkeypatch, out, max_attempts=3)
    batch = _big_rows()
    sink.process_batch(batch)
    proxy.inject(Fault.SLOW_DOWN, times=2, method="PUT", target=r"[?&]partNumber=2(&|$)")
    proxy.inject(Fault.INTERNAL_ERROR, times=1, method="POST", target=r"[?&]uploadId=")
    sink.snapshot_state(1)  # pre-commit: start, part 1, part 2 (throttled twice)
    ((_, txn),) = sink.pending_transactions
    assert [n for n, _ in txn.parts] == [1, 2]
    assert outcomes(proxy, "PUT", r"[?&]partNumber=2(&|$)") == [Fault.SLOW_DOWN] * 2 + [200]
    moto = direct(s3)
    assert moto.list(out) == []  # pre-committed: invisible
    sink.notify_checkpoint_complete(1)  # complete (a 500 first, then retried)
    assert outcomes(proxy, "POST", r"[?&]uploadId=") == [Fault.INTERNAL_ERROR, 200]
    sink.close()
    assert read_committed(out).column("b").to_pylist() == batch.column("b").to_pylist()
    assert len(moto.list(out)) == 1
    assert MultipartUploads(moto).list_uploads(out + "/") == []


def test_sink_upload_failing_beyond_the_bound_leaves_nothing_visible(
    proxy: FaultProxy, s3: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = f"s3://{s3_bucket}/out"
    sink = _sink_through(proxy, monkeypatch, out, max_attempts=2)
    sink.process_batch(kb([1, 2, 3]))
    proxy.inject(Fault.SLOW_DOWN, times=100, method="PUT", target=r"[?&]partNumber=1(&|$)")
    started = time.monotonic()
    with pytest.raises(StorageError) as error:
        sink.snapshot_state(1)  # the task declines the checkpoint
    assert time.monotonic() - started < max_backoff_s(2) + 5
    text = str(error.value)
    assert s3_bucket in text and "upload_part" in text
    assert outcomes(proxy, "PUT", r"[?&]partNumber=1(&|$)") == [Fault.SLOW_DOWN] * 2
    moto = direct(s3)
    assert moto.list(out) == []  # no object
    assert MultipartUploads(moto).list_uploads(out + "/") == []  # the upload was aborted
    with pytest.raises(StateError, match="could not be pre-committed"):
        sink.process_batch(kb([4]))  # its rows come back by a restore, never half-written
    sink.close()
    assert moto.list(out) == []


# ---------------------------------------------------------------------------------------------
# A coordinator on S3
# ---------------------------------------------------------------------------------------------


def test_checkpoint_with_a_throttled_metadata_put_completes(
    redis_url: str, proxy: FaultProxy, s3: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The coordinator reaches S3 through the proxy (its ``s3_endpoint_url``); the simulated
    agents write their state files to moto directly (``AWS_ENDPOINT_URL``)."""
    # the proxy's store goes
    monkeypatch.setattr(filestore_registry, "_STORES", dict(filestore_registry._STORES))
    root = f"s3://{s3_bucket}/checkpoints"

    async def main() -> None:
        async with running_coordinator(
            redis_url, root, s3_endpoint_url=proxy.url, s3_max_attempts=3
        ) as c:
            job_id = await submit(c.stub)
            agents = [SimulatedAgent(c.address, job_id, [("src", i), ("map", i)]) for i in (0, 1)]
            try:
                for agent in agents:
                    await agent.start()
                    await agent.register_all()
                proxy.inject(Fault.SLOW_DOWN, times=2, method="PUT", target="/_metadata$")
                summary = await c.stub.TriggerCheckpoint(
                    cpb.TriggerCheckpointRequest(job_id=job_id), timeout=20
                )
            finally:
                for agent in agents:
                    await agent.stop()
        assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
        assert outcomes(proxy, "PUT", "/_metadata$") == [Fault.SLOW_DOWN] * 2 + [200]
        metadata = f"{summary.external_path}/_metadata"
        assert direct(s3).read(metadata).startswith(b"{")

    asyncio.run(main())


def test_proxy_forwards_unmatched_requests_unchanged(proxy: FaultProxy, s3_bucket: str) -> None:
    store = via(proxy)
    base = f"s3://{s3_bucket}/p-{uuid.uuid4().hex[:6]}"
    store.write(f"{base}/a", b"a")
    store.create(f"{base}/_metadata", b"m")
    assert store.list(base) == [f"{base}/_metadata", f"{base}/a"]
    assert store.delete([f"{base}/a", f"{base}/_metadata"]) == 2
    assert store.list(base) == []
    assert all(s.fault is None for s in proxy.seen())
