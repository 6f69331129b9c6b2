"""Multi-process failover: coordinator, Redis and two `snapflow worker` processes.

An agent process is killed (SIGKILL) after the first checkpoint completed; the test plays the
driver: it waits for the job to fail over, starts a new pair of agents, and the job restores
from the latest completed checkpoint. The committed output of the transactional sink must have
no loss and no duplicates in every exactly-once mode, and no loss at least once. A second test
stops with a savepoint and resumes at another parallelism.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from kit.coordinator import running_coordinator, wait_checkpoints_completed, wait_job_state
from kit.processes import worker_argv
from kit.shared_files import shared_files_state
from kit.tls import Pki, make_pki
from kit.workers import check_exactly_once, count_graph, expected_counts, submit_graph

from snapflow.security import PLAINTEXT, SecuritySettings
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource

pytestmark = pytest.mark.slow

RECORDS = 300_000
KEYS = 300
RATE = 100_000  # records/s over all sources: the job runs ~3 s


def _source() -> GeneratorSource:
    return GeneratorSource(
        total_records=RECORDS, rate_per_s=RATE, num_keys=KEYS, batch_size=2048, seed=11
    )


async def _start_agents(
    address: str, job_id: str, slots: int, log_dir: Path, tag: str, extra_env: dict[str, str]
) -> list[asyncio.subprocess.Process]:
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR", "PYTHONUNBUFFERED": "1", **extra_env}
    procs = []
    for slot in range(slots):
        log = open(log_dir / f"agent-{tag}-{slot}.log", "wb")  # noqa: SIM115 - closed with the process
        procs.append(
            await asyncio.create_subprocess_exec(
                *worker_argv(address, job_id, slot, slots, "warning"),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
            )
        )
        log.close()
    return procs


async def _reap(
    procs: list[asyncio.subprocess.Process], timeout_s: float = 10.0
) -> list[int | None]:
    codes: list[int | None] = []
    for p in procs:
        try:
            async with asyncio.timeout(timeout_s):
                codes.append(await p.wait())
        except TimeoutError:
            p.kill()
            await p.wait()
            codes.append(None)
    return codes


class _AgentProcesses:
    """The ``snapflow worker`` processes a test starts (logs in ``log_dir``); on exit, those
    still running are killed and every one is reaped."""

    def __init__(self, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.env = env or {}  # e.g. SNAPFLOW_TLS_* for mutual TLS
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(
        self, address: str, job_id: str, slots: int, tag: str
    ) -> list[asyncio.subprocess.Process]:
        procs = await _start_agents(address, job_id, slots, self.log_dir, tag, self.env)
        self.procs += procs
        return procs

    async def __aenter__(self) -> _AgentProcesses:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.returncode is None:
                p.kill()
        await _reap(self.procs)


MODES = [
    pytest.param(pb.CHECKPOINT_MODE_ALIGNED, 0, "local", id="aligned"),
    pytest.param(pb.CHECKPOINT_MODE_UNALIGNED, 0, "local", id="unaligned"),
    pytest.param(pb.CHECKPOINT_MODE_ALIGNED, 20, "local", id="aligned-timeout"),
    pytest.param(pb.CHECKPOINT_MODE_AT_LEAST_ONCE, 0, "local", id="at-least-once"),
    # Checkpoints on S3 (moto's server; the agents inherit the AWS_* variables): the restore
    # reads the killed run's merged state objects with ranged GETs.
    pytest.param(pb.CHECKPOINT_MODE_ALIGNED, 0, "s3", id="aligned-s3"),
    pytest.param(pb.CHECKPOINT_MODE_UNALIGNED, 0, "s3", id="unaligned-s3"),
    # Mutual TLS on every hop (agent -> coordinator, coordinator -> agent, agent -> agent),
    # service tokens on top, access checks on: the same guarantee, and no secret in the logs.
    pytest.param(pb.CHECKPOINT_MODE_ALIGNED, 0, "local-mtls", id="aligned-mtls"),
    # The disk state backend (incremental checkpoints, shared files) in every mode, and on S3.
    pytest.param(pb.CHECKPOINT_MODE_ALIGNED, 0, "local-rocksdb", id="aligned-rocksdb"),
    pytest.param(pb.CHECKPOINT_MODE_UNALIGNED, 0, "local-rocksdb", id="unaligned-rocksdb"),
    pytest.param(pb.CHECKPOINT_MODE_ALIGNED, 20, "local-rocksdb", id="aligned-timeout-rocksdb"),
    pytest.param(pb.CHECKPOINT_MODE_AT_LEAST_ONCE, 0, "local-rocksdb", id="at-least-once-rocksdb"),
    pytest.param(pb.CHECKPOINT_MODE_ALIGNED, 0, "s3-rocksdb", id="aligned-s3-rocksdb"),
    # Local recovery: the second run restores from the copies the first one kept on disk.
    pytest.param(pb.CHECKPOINT_MODE_ALIGNED, 0, "s3-rocksdb-lr", id="aligned-s3-rocksdb-local"),
]


def _mtls(tmp_path: Path) -> tuple[dict[str, str], dict[str, str], SecuritySettings, Pki]:
    """(coordinator setting overrides, agent environment, the test's client, the PKI)."""
    pki = make_pki(tmp_path / "pki")
    server = pki.server(mutual=True)
    overrides = {f.name: getattr(server, f.name) for f in dataclasses.fields(server)}
    env = {f"SNAPFLOW_{name.upper()}": value for name, value in overrides.items() if value}
    env["SNAPFLOW_TOKEN_FILE"] = str(pki.token_file("service"))
    return overrides, env, pki.client("operator", cert="service"), pki


def _assert_no_secrets(pki: Pki, texts: list[str]) -> None:
    keys = [p.read_text().splitlines()[1] for p in pki.dir.glob("*.key")]
    for text in texts:
        for secret in [*pki.tokens.values(), *keys]:
            assert secret not in text, "a secret reached the logs"
        assert "PRIVATE KEY" not in text


@pytest.mark.parametrize(("mode", "aligned_checkpoint_timeout_ms", "storage"), MODES)
def test_killed_agent_recovers_without_loss_or_duplicates(
    redis_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    mode: pb.CheckpointMode,
    aligned_checkpoint_timeout_ms: int,
    storage: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    local_recovery = storage.endswith("-lr")
    storage = storage.removesuffix("-lr")
    rocksdb = storage.endswith("-rocksdb")
    storage = storage.removesuffix("-rocksdb")
    root = (
        f"s3://{request.getfixturevalue('s3_bucket')}/checkpoints"
        if storage == "s3"
        else str(tmp_path / "cp")
    )
    overrides: dict[str, str] = {}
    agent_env: dict[str, str] = {}
    client = PLAINTEXT
    pki = None
    if storage == "local-mtls":
        overrides, agent_env, client, pki = _mtls(tmp_path)
    copies = tmp_path / "tmp" / "snapflow-local-recovery"  # the default root, in $TMPDIR
    if local_recovery:
        copies.parent.mkdir()
        agent_env["TMPDIR"] = str(copies.parent)

    async def main() -> None:
        async with running_coordinator(redis_url, root, client, **overrides) as c:
            graph = count_graph(_source(), KeyedCount("key"), TransactionalFileSink(str(out)))
            config = pb.CheckpointConfig(
                interval_ms=150,
                mode=mode,
                aligned_checkpoint_timeout_ms=aligned_checkpoint_timeout_ms,
                tolerable_failures=5,
                state_backend="rocksdb" if rocksdb else "",
                state_backend_options=pb.StateBackendOptions(local_recovery=True)
                if local_recovery
                else None,
            )
            job_id = await submit_graph(c.stub, graph, config)
            async with _AgentProcesses(tmp_path, agent_env) as agents:
                first = await agents.start(c.address, job_id, 2, "first")
                await wait_checkpoints_completed(c.stub, job_id, 2)
                first[1].send_signal(signal.SIGKILL)
                await wait_job_state(c.stub, job_id, {pb.JOB_STATE_RESTARTING})
                codes = await _reap(first)
                assert codes[1] == -signal.SIGKILL
                if local_recovery:  # kept on disk, past the kill
                    assert list(copies.glob(f"{job_id}/*/*/chk-*/local-copy.json"))
                second = await agents.start(c.address, job_id, 2, "second")
                await wait_job_state(c.stub, job_id, {pb.JOB_STATE_FINISHED}, timeout_s=90)
                assert await _reap(second) == [0, 0]
                info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
                assert info.restarts == 1
                stats = await c.stub.GetCheckpointStats(
                    cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5
                )
                assert stats.counts.restored == 1 and stats.latest_restore.checkpoint_id >= 1
                if rocksdb:  # the killed agent's unacknowledged uploads are swept too
                    stored, referenced = await shared_files_state(c.coordinator, job_id)
                    assert referenced and stored == referenced
                if local_recovery:  # the job finished: its agents deleted its local copies
                    assert not (copies / job_id).exists()

    asyncio.run(main())
    if pki is not None:
        captured = capfd.readouterr()
        logs = [p.read_text(errors="replace") for p in tmp_path.glob("agent-*.log")]
        _assert_no_secrets(pki, [captured.out, captured.err, *logs])
    committed = read_committed(out)
    expected = expected_counts(_source(), 2)
    if mode == pb.CHECKPOINT_MODE_AT_LEAST_ONCE:
        finals: Counter[int] = Counter()
        for key, count in zip(
            committed.column("key").to_pylist(), committed.column("count").to_pylist(), strict=True
        ):
            finals[key] = max(finals[key], count)
        assert all(finals[k] >= n for k, n in expected.items()), "at-least-once lost records"
    else:
        check_exactly_once(committed, expected)


def test_stop_with_savepoint_and_resume_with_other_parallelism(
    redis_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"

    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            graph = count_graph(
                _source(), KeyedCount("key"), TransactionalFileSink(str(out)), parallelism=2
            )
            config = pb.CheckpointConfig(interval_ms=200)
            job_id = await submit_graph(c.stub, graph, config)
            async with _AgentProcesses(tmp_path) as agents:
                first = await agents.start(c.address, job_id, 2, "p2")
                await wait_checkpoints_completed(c.stub, job_id, 1)
                stop = await c.stub.StopWithSavepoint(
                    cpb.StopWithSavepointRequest(
                        job_id=job_id, target_directory=str(tmp_path / "sp")
                    ),
                    timeout=30,
                )
                assert await _reap(first, 30) == [0, 0]
                assert (
                    await wait_job_state(c.stub, job_id, {pb.JOB_STATE_FINISHED})
                    == pb.JOB_STATE_FINISHED
                )
                graph3 = count_graph(
                    _source(), KeyedCount("key"), TransactionalFileSink(str(out)), parallelism=3
                )
                restore = cpb.RestoreSettings(savepoint_path=stop.external_path)
                resumed = await submit_graph(c.stub, graph3, config, restore)
                second = await agents.start(c.address, resumed, 3, "p3")
                await wait_job_state(c.stub, resumed, {pb.JOB_STATE_FINISHED}, timeout_s=90)
                assert await _reap(second) == [0, 0, 0]

    asyncio.run(main())
    committed = read_committed(out)
    expected = expected_counts(_source(), 2)
    seen: dict[int, set[int]] = {}
    for key, count in zip(
        committed.column("key").to_pylist(), committed.column("count").to_pylist(), strict=True
    ):
        assert count not in seen.setdefault(key, set()), f"key {key}: count {count} committed twice"
        seen[key].add(count)
    assert {k: max(v) for k, v in seen.items()} == dict(expected)


_ = pa  # the committed tables are pyarrow tables
