"""``snapflow run PIPELINE.py``, ``snapflow info`` and ``snapflow jobs --state``.

* Without Spark: bad usage gets exit code 2 and a message saying what to fix; a file that
  executes no pipeline is refused; the command line's options reach ``Pipeline.execute()``
  (default parallelism, checkpoint overrides, restore path and job id of the first job) with
  the driver replaced by a recorder; ``snapflow info`` shows a submitted graph's vertices and
  edges; ``jobs --state`` filters.
* ``spark``: the three examples run through ``snapflow run --spark-master local[2]`` as
  subprocesses and their committed output is checked exactly: word count detached against a
  running coordinator (then ``info`` and ``jobs --state`` on it), keyed event-time windows,
  and DataFrame -> Parquet with periodic checkpoints off (the final checkpoint commits).
"""

from __future__ import annotations

import asyncio
import csv
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from kit.coordinator import running_coordinator
from kit.polling import wait_until

from snapflow.checkpointing import CheckpointMode
from snapflow.cli.main import main
from snapflow.coordinator.embedded import EmbeddedCoordinator
from snapflow.spark_bridge import Pipeline, submission
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.connectors.debug_sinks import CollectSink
from snapflow.worker.connectors.file_sink import read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource
from snapflow.worker.runtime.operator import Operator, OutputTag

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
MASTER = "local[2]"
RUN_TIMEOUT_S = 240


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------------
# Without Spark
# ---------------------------------------------------------------------------------------------


def test_run_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "p.py"
    f.write_text("")
    cases = [
        (["run", str(tmp_path / "missing.py")], "no such file"),
        (["run", "--allow-non-restored-state", str(f)], "needs --restore PATH"),
        (["run", "--detach", str(f)], "--detach needs --coordinator"),
        (["run", "--job-id", "xyz", str(f)], "--job-id must be 32 lowercase hex"),
        (["run", "--checkpoint-interval", "5", str(f)], "0 (off) or >= 10 ms"),
        (["run", "--parallelism", "0", str(f)], "--parallelism must be >= 1"),
        (["run", "--checkpoint-mode", "exactly", str(f)], "invalid choice"),
        (["jobs", "--state", "sleeping"], "not a job state"),
    ]
    for argv, message in cases:
        code, _, err = run_cli(argv, capsys)
        assert code == 2, argv
        assert message in err, (argv, err)
        assert len(err) < 2000


def test_run_refuses_a_file_that_executes_no_pipeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "nothing.py"
    f.write_text("import sys\nprint('argv', sys.argv[1:], __name__)\n")
    code, out, err = run_cli(["run", str(f), "--x", "1"], capsys)
    assert code == 2
    assert "argv ['--x', '1'] __main__" in out
    assert "executed no pipeline: call pipeline.execute()" in err
    f.write_text("raise SystemExit(3)\n")
    assert run_cli(["run", str(f)], capsys)[0] == 3


PIPELINE_FILE = """
from snapflow.spark_bridge import Pipeline
from snapflow.worker.connectors.debug_sinks import CollectSink
from snapflow.worker.connectors.split_sources import GeneratorSource

def build(name):
    p = Pipeline(name)
    p.source(GeneratorSource(total_records=10)).key_by("key", parallelism=1).count().sink(CollectSink())
    p.checkpointing(interval_ms=1000, mode="aligned", aligned_checkpoint_timeout_ms=50)
    return p

if __name__ == "__main__":
    build("first").execute(spark="the-session")
    build("second").execute(spark="the-session")
"""


def test_run_hands_its_options_to_execute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from snapflow.spark_bridge import JobResult, JobStatus

    calls: list[dict[str, Any]] = []

    def fake_run(pipeline: Pipeline, spark: Any, **kwargs: Any) -> Any:
        graph = pipeline.job_graph()
        calls.append(
            {
                "name": pipeline.name,
                "spark": spark,
                "parallelism": [v.parallelism for v in graph.vertices],
                "checkpoints": pipeline.checkpoint_config,
                **kwargs,
            }
        )
        return JobResult(
            job_id="f" * 32,
            name=pipeline.name,
            state=JobStatus.FINISHED,
            checkpoints_completed=1,
            latest_checkpoint_id=1,
            restarts=0,
            stage_attempts=1,
            recovery_times_s=(),
            duration_s=0.5,
        )

    monkeypatch.setattr(submission, "run", fake_run)
    f = tmp_path / "pipeline.py"
    f.write_text(PIPELINE_FILE)
    job_id = "a" * 32
    argv = ["run", "-p", "3", "--checkpoint-interval", "0", "--checkpoint-mode", "unaligned"]
    argv += ["--coordinator", "10.0.0.1:50051", "--restore", str(tmp_path / "sp")]
    argv += ["--allow-non-restored-state", "--job-id", job_id, str(f)]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    first, second = calls
    assert (first["name"], second["name"]) == ("first", "second")
    assert first["spark"] == "the-session"
    assert first["parallelism"] == [3, 1]  # the default; an explicit parallelism wins
    cp = first["checkpoints"]
    assert (cp.interval_ms, cp.mode, cp.aligned_checkpoint_timeout_ms) == (
        0,
        CheckpointMode.UNALIGNED,
        0,
    )
    assert first["coordinator_address"] == second["coordinator_address"] == "10.0.0.1:50051"
    assert first["restore_from"] == str(tmp_path / "sp")
    assert first["allow_non_restored_state"] is True and first["job_id"] == job_id
    # the restore point and the job id belong to the first job only
    assert second["restore_from"] is None and "job_id" not in second
    assert out.count(f"Job {'f' * 32} (") == 2 and "FINISHED" in out
    # outside snapflow run: the program's own settings
    assert submission.current() is None
    assert Pipeline("plain").parallelism == 1


def test_info_shows_the_graph_and_jobs_filter_by_state(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = Pipeline("graph", parallelism=2)
    (
        p.source(GeneratorSource(total_records=10), name="events")
        .filter(lambda r: True, name="keep")
        .key_by("key", parallelism=3)
        .count()
        .rebalance(parallelism=1)
        .sink(CollectSink(), name="collect")
    )

    async def go() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            job = (
                await c.stub.SubmitJob(cpb.SubmitJobRequest(graph=p.job_graph()), timeout=10)
            ).job
            address = ["--address", c.address]
            code, out, err = await asyncio.to_thread(
                run_cli, ["info", job.job_id, *address], capsys
            )
            assert code == 0, err
            assert f"Job {job.job_id} (graph): CREATED, 3 vertices, 2 edges" in out
            assert re.search(r"v0-events \(source\)[\s│]+2[\s│]+128[\s│]+events -> keep", out)
            assert re.search(r"v1-key-by-key[\s│]+3[\s│]+128[\s│]+count", out)
            assert re.search(r"v0-events[\s│]+v1-key-by-key[\s│]+HASH\(key\)[\s│]+2 -> 3", out)
            assert re.search(r"v1-key-by-key[\s│]+v2-rebalance[\s│]+REBALANCE[\s│]+3 -> 1", out)
            code, out, _ = await asyncio.to_thread(
                run_cli, ["jobs", "--state", "created", *address], capsys
            )
            assert code == 0 and job.job_id in out
            code, out, _ = await asyncio.to_thread(
                run_cli, ["jobs", "--state", "RUNNING", "--state", "failed", *address], capsys
            )
            assert code == 0 and job.job_id not in out and "no jobs in that state" in out

    asyncio.run(go())


def test_info_shows_a_dag_with_several_inputs_and_side_outputs(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = Pipeline("dag", parallelism=2)
    a = p.source(GeneratorSource(total_records=10), name="a")
    b = p.source(GeneratorSource(total_records=10), name="b")
    c = p.source(GeneratorSource(total_records=10), name="c")
    joined = a.key_by("key").connect(b.union(c).key_by("key")).transform(Operator(), name="join")
    joined.side_output(OutputTag("late")).sink(CollectSink(), name="late")
    joined.sink(CollectSink(), name="out")

    async def go() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            job = (
                await c.stub.SubmitJob(cpb.SubmitJobRequest(graph=p.job_graph()), timeout=10)
            ).job
            code, out, err = await asyncio.to_thread(
                run_cli, ["info", job.job_id, "--address", c.address], capsys
            )
            assert code == 0, err
            assert "(dag): CREATED, 5 vertices, 4 edges" in out
            # Vertices: where each one's data comes from, per logical input.
            assert re.search(r"v2-c \(source\)[\s│]+2[\s│]+128[\s│]+c[\s│]+-[\s│]", out)
            assert re.search(r"join -> out[\s│]+in0: v0-a; in1: v1-b \+ v2-c", out)
            assert re.search(r"late[\s│]+v3-key-by-key \[side: late\]", out)
            # Edges: the input of a target with several, the side output an edge carries.
            assert re.search(r"v0-a[\s│]+v3-key-by-key in0[\s│]+HASH\(key\)", out)
            assert re.search(r"v2-c[\s│]+v3-key-by-key in1[\s│]+HASH\(key\)", out)
            assert re.search(
                r"v3-key-by-key \[side: late\][\s│]+v4-side-output-late[\s│]+FORWARD", out
            )

    asyncio.run(go())


# ---------------------------------------------------------------------------------------------
# The examples on local Spark (subprocesses: a SparkContext per process)
# ---------------------------------------------------------------------------------------------


def snapflow_run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "snapflow.cli", "run", "--spark-master", MASTER, *argv],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=ROOT,
    )


def expected_word_counts(directory: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for f in sorted(directory.iterdir()):
        with f.open() as fh:
            for row in csv.DictReader(fh):
                counts.update(re.sub(r"[^\w\s']+", " ", row["line"].lower()).split())
    return counts


@pytest.mark.spark
def test_word_count_detached(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--detach against a running coordinator: the command returns with the job id while a
    background driver runs the job to its end; the output is every word's exact count."""
    out = tmp_path / "out"
    log = tmp_path / "driver.log"
    coordinator = EmbeddedCoordinator(storage_root=str(tmp_path / "cp")).start()
    try:
        argv = ["run", "--detach", "--coordinator", coordinator.address, "--spark-master", MASTER]
        argv += ["-p", "2", "--log-file", str(log), str(EXAMPLES / "word_count.py")]
        argv += ["--input", str(EXAMPLES / "data" / "lines"), "--output", str(out)]
        code, stdout, err = run_cli(argv, capsys)
        assert code == 0, err
        m = re.search(r"Job has been submitted with JobID ([0-9a-f]{32})", stdout)
        pid = re.search(r"Driver process: pid (\d+), log (.+)", stdout)
        assert m and pid, stdout
        job_id, driver_pid = m[1], int(pid[1])
        assert pid[2] == str(log)

        exited: list[int] = []

        def driver_exited() -> bool:
            done, status = os.waitpid(driver_pid, os.WNOHANG)
            if done:
                exited.append(os.waitstatus_to_exitcode(status))
            return bool(done)

        try:
            wait_until(driver_exited, "the detached driver exits", timeout_s=RUN_TIMEOUT_S)
        finally:
            if not exited:
                os.kill(driver_pid, signal.SIGKILL)
        assert exited == [0], log.read_text()[-3000:]
        assert "FINISHED" in log.read_text()

        address = ["--address", coordinator.address]
        code, stdout, _ = run_cli(["jobs", "--state", "finished", *address], capsys)
        assert code == 0 and job_id in stdout
        code, stdout, _ = run_cli(["info", job_id, *address], capsys)
        assert "FINISHED, 2 vertices, 1 edges" in stdout
        assert re.search(r"v0-lines[\s│]+v1-key-by-word[\s│]+HASH\(word\)[\s│]+2 -> 2", stdout)
    finally:
        coordinator.stop()

    # count(output="final"): every word once, with its exact count
    rows = read_committed(out).to_pylist()
    assert len(rows) == len({r["word"] for r in rows})
    assert {r["word"]: r["count"] for r in rows} == expected_word_counts(
        EXAMPLES / "data" / "lines"
    )


@pytest.mark.spark
def test_windowed_totals(tmp_path: Path) -> None:
    out = tmp_path / "out"
    data = EXAMPLES / "data" / "events"
    result = snapflow_run(
        "-p", "2", str(EXAMPLES / "windowed_totals.py"), "--input", str(data), "--output", str(out)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"Job [0-9a-f]{32} \(windowed-totals\) FINISHED", result.stdout)
    expected: Counter[tuple[str, int]] = Counter()
    for f in sorted(data.iterdir()):
        with f.open() as fh:
            for row in csv.DictReader(fh):
                expected[(row["user"], int(row["ts"]) // 10_000 * 10_000)] += int(row["amount"])
    rows = read_committed(out).to_pylist()
    assert len(rows) == len(expected)  # every window once
    assert {(r["user"], r["window_start"]): r["total"] for r in rows} == dict(expected)
    assert all(r["window_end"] == r["window_start"] + 10_000 for r in rows)


@pytest.mark.spark
def test_dataframe_to_parquet_with_checkpointing_off(tmp_path: Path) -> None:
    out = tmp_path / "orders"
    result = snapflow_run(
        "-p", "2", "--checkpoint-interval", "0", str(EXAMPLES / "dataframe_to_parquet.py"),
        "--output", str(out), "--rows", "3000", "--staging", str(tmp_path / "staging"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"\(dataframe-to-parquet\) FINISHED: 1 checkpoints", result.stdout)
    table = ds.dataset(str(out), format="parquet").to_table()
    rows = sorted(table.to_pylist(), key=lambda r: r["order_id"])
    assert [r["order_id"] for r in rows] == list(range(3000))
    for r in rows:
        price = r["order_id"] * 37 % 10_000
        assert r["price_cents"] == price
        assert r["gross_cents"] == price * 6 // 5
        assert r["size"] == ("large" if price >= 5000 else "small")
