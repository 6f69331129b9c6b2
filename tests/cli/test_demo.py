"""``snapflow demo`` (cli/demo.py) and the NexMark bid source and query (cli/nexmark.py).

* The bid source: the vectorised generator equals the scalar definition, the rate limit emits
  whole batches, the watermark never makes a bid late, a restore replays exactly.
* The query (a keyed process function) equals its plain-Python reference.
* The demo's flags and its data directory.
* ``spark``: the demo in-process on the session's local Spark, with a task killed mid-run: the
  committed output equals the batch Spark result (exactly-once, exit code 0).
* ``spark`` + ``slow``: the same demo as a subprocess against a Spark standalone master and
  worker started from the pip-installed pyspark and a ``snapflow coordinator`` subprocess on the
  session's Redis (the setup of the compose cluster, on one machine).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import structlog
from kit.clock import ManualClock
from kit.coordinator import is_serving
from kit.polling import wait_until
from kit.sources import src_ctx as _src_ctx
from kit.tls import SERVICE_NAME, make_pki
from pyspark import cloudpickle

from snapflow.cli import demo, demo_config
from snapflow.cli.nexmark import (
    BID_SCHEMA,
    WINDOW_STATS_SCHEMA,
    BidSource,
    PriceStatsWindow,
    expected_window_stats,
    window_stats_rows,
)
from snapflow.cli.parser import build_parser
from snapflow.event_time import MAX_WATERMARK, MIN_WATERMARK
from snapflow.worker.api.keyed_operators import KeyedProcess
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.operator_state import OperatorStateBackend

ROOT = Path(__file__).resolve().parents[2]


def src_ctx(*args: Any, **kwargs: Any) -> OperatorContext:
    return _src_ctx(*args, vertex_id="bids", operator_id="bids.0-source", **kwargs)


# ---------------------------------------------------------------------------------------------
# The bid source
# ---------------------------------------------------------------------------------------------


def test_generator_equals_the_scalar_definition() -> None:
    src = BidSource(None, num_auctions=50, num_hot_auctions=3, seed=5, max_out_of_orderness_ms=40)
    for split, start, n in [(0, 0, 1), (1, 0, 700), (3, 12_345, 2048), (0, 2**40, 5)]:
        batch = src.generate(split, start, n)
        assert batch.schema == BID_SCHEMA
        assert batch.to_pylist() == [src.record(split, i) for i in range(start, start + n)]
    bids = [src.record(0, i) for i in range(4000)]
    hot = sum(1 for b in bids if b["auction"] < 3)
    assert (
        0.45 < hot / len(bids) < 0.6
    )  # half of the bids go to the hot auctions (+ 3/50 of the rest)
    assert {b["auction"] for b in bids} == set(range(50))
    assert all(100 <= b["price"] < 100 + 100_000 and 0 <= b["bidder"] < 10_000 for b in bids)
    assert all(src.start_ms + i - 40 <= b["ts"] <= src.start_ms + i for i, b in enumerate(bids))
    assert [BidSource(None, seed=6).record(0, i) for i in range(20)] != [
        BidSource(None, seed=5).record(0, i) for i in range(20)
    ]


def test_bounded_source_splits_and_watermarks() -> None:
    sizes = BidSource(10).split_sizes(3)
    assert sizes == [4, 3, 3]
    src = BidSource(5000, batch_size=300, max_out_of_orderness_ms=25)
    src.open(src_ctx(1, 2))
    assert src.current_watermark() == MIN_WATERMARK
    wm = MIN_WATERMARK
    rows: list[dict[str, Any]] = []
    while (batch := src.poll_batch(1000)) is not None:
        assert batch.num_rows <= 300
        assert min(batch["ts"].to_pylist()) > wm, "the watermark made a bid late"
        rows.extend(batch.to_pylist())
        wm = src.current_watermark()
    assert rows == [src.record(1, i) for i in range(2500)]
    assert src.current_watermark() == MAX_WATERMARK


def _no_sleep(seconds: float) -> None:
    raise AssertionError(f"the source slept {seconds} s")


def test_rate_limit_emits_whole_batches_without_sleeping() -> None:
    clock = ManualClock()
    src = BidSource(None, rate_per_s=2000, clock=clock)
    src.open(src_ctx(0, 2))  # 1000 bids/s for this subtask, in batches of at least 20 ms worth

    def polled_at(now: float) -> int:
        clock.now = now
        batch = src.poll_batch(1 << 20)
        assert batch is not None
        return batch.num_rows

    with pytest.MonkeyPatch.context() as patch:  # an empty batch at once: the source never sleeps
        patch.setattr(time, "sleep", _no_sleep)
        # Nothing due; 10 bids due but less than 20 ms worth; 125 due, all at once; then none;
        # after a 10 s stall one second's worth (the burst bound).
        rows = [polled_at(t) for t in (0.0, 0.01, 0.125, 0.125, 10.125)]
    assert rows == [0, 0, 125, 0, 1000]
    with pytest.raises(Exception, match="rate_per_s"):
        BidSource(rate_per_s=0)


def test_source_resumes_exactly_after_restore(tmp_path: Path) -> None:
    backend = OperatorStateBackend()
    src = BidSource(None, batch_size=64, seed=9)
    src.open(src_ctx(backend=backend))
    for _ in range(5):
        src.poll_batch(50)
    src.snapshot_state(1)
    handles = backend.snapshot(1).write(tmp_path / "chk-1")
    lost = [r for _ in range(4) for r in src.poll_batch(64).to_pylist()]  # type: ignore[union-attr]

    restored = OperatorStateBackend()
    restored.restore({0: handles}, 0, 1)
    again = cloudpickle.loads(cloudpickle.dumps(BidSource(None, batch_size=64, seed=9)))
    again.open(src_ctx(backend=restored, restored=1))
    assert again.splits == [(0, 250, None)]
    assert [r for _ in range(4) for r in again.poll_batch(64).to_pylist()] == lost


# ---------------------------------------------------------------------------------------------
# The query
# ---------------------------------------------------------------------------------------------


def test_price_stats_window_equals_the_reference() -> None:
    """Two source subtasks interleaved into one keyed subtask, the watermark the minimum of
    both: the windows fired by watermarks and at the end equal expected_window_stats."""
    total, size_ms = 30_000, 2_000
    sources = []
    for s in range(2):
        src = BidSource(total, num_auctions=40, batch_size=512, max_out_of_orderness_ms=300)
        src.open(src_ctx(s, 2))
        sources.append(src)
    window = PriceStatsWindow(size_ms)
    op = KeyedProcess("auction", window, window.on_timer, WINDOW_STATS_SCHEMA)
    op.open(
        OperatorContext(
            vertex_id="v1",
            operator_id="v1.0-process",
            keyed_state=KeyedStateBackend.for_subtask(128, 1, 0),
            key_field="auction",
        )
    )
    out: list[pa.RecordBatch] = []
    fired_before_end = 0
    live = list(sources)
    while live:
        for src in list(live):
            batch = src.poll_batch(1 << 20)
            if batch is None:
                live.remove(src)
                continue
            out.extend(op.process_batch(batch))
        watermark = min(src.current_watermark() for src in sources)
        fired = op.process_watermark(watermark)
        if watermark < MAX_WATERMARK:
            fired_before_end += sum(b.num_rows for b in fired)
        out.extend(fired)
    out.extend(op.end_input())
    result = window_stats_rows(pa.Table.from_batches(out, WINDOW_STATS_SCHEMA))
    expected = expected_window_stats(sources[0], 2, size_ms)
    assert result == expected and max(result.values()) == 1
    assert 0 < fired_before_end < sum(expected.values())  # watermarks fired most windows


# ---------------------------------------------------------------------------------------------
# Flags, data directory
# ---------------------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["demo", *argv])


def test_demo_flags() -> None:
    config = demo_config.config_from_args(parse())
    assert (config.records, config.rate_per_s) == demo_config.SIZES["medium"]
    assert (config.parallelism, config.mode, config.interval_ms, config.window_ms) == (
        2,
        "aligned",
        1000,
        10_000,
    )
    assert config.failure and config.kill_after == pytest.approx(4.8)
    assert config.coordinator is None and config.spark_master == "local[4]"
    assert config.data_dir == "./data/demo"
    config = demo_config.config_from_args(
        parse(
            "--records",
            "small",
            "--mode",
            "unaligned",
            "--no-failure",
            "--coordinator",
            "coordinator:50051",
            "--spark-master",
            "spark://spark-master:7077",
            "--conf",
            "spark.executor.cores=2",
            "--data-dir",
            "/data/demo",
        )
    )
    assert config.records == demo_config.SIZES["small"][0] and not config.failure
    assert (config.coordinator, config.spark_master, config.data_dir) == (
        "coordinator:50051",
        "spark://spark-master:7077",
        "/data/demo",
    )
    assert config.spark_conf == (("spark.executor.cores", "2"),)
    config = demo_config.config_from_args(parse("--records", "1_500k", "--rate", "0"))
    assert config.records == 1_500_000 and config.rate_per_s is None
    assert (
        demo_config.config_from_args(parse("--records", "70000", "--rate", "7000")).kill_after
        == 4.0
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--records", "lots"],
        ["--records", "0"],
        ["--mode", "exactly_once"],
        ["--no-failure", "--kill-after-s", "3"],
    ],
)
def test_demo_flags_rejected(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(*argv)
    assert exit_.value.code == 2
    capsys.readouterr()


def test_data_dir_is_cleaned_only_when_it_is_a_demo_directory(tmp_path: Path) -> None:
    target = tmp_path / "demo"
    demo.prepare_data_dir(str(target))
    (target / "out").mkdir()
    (target / "out" / "part-0-1-0.arrow").write_bytes(b"x")
    (target / "kill.json").write_text("{}")
    demo.prepare_data_dir(str(target))
    assert sorted(os.listdir(target)) == [demo.MARKER]
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("keep me")
    with pytest.raises(ValueError, match="not made by `snapflow demo`"):
        demo.prepare_data_dir(str(foreign))
    assert (foreign / "thesis.tex").read_text() == "keep me"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The demo configures logging for its process: put the test session's back."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        structlog.configure(**saved)
        root.handlers[:] = handlers
        root.setLevel(level)


# ---------------------------------------------------------------------------------------------
# On Spark
# ---------------------------------------------------------------------------------------------


def _summary_value(out: str, name: str) -> str:
    m = re.search(rf"^\s*{name}\s+(.+?)\s*$", out, re.MULTILINE)
    assert m, f"no {name!r} in the summary:\n{out}"
    return m.group(1)


@pytest.mark.spark
def test_demo_on_local_spark_with_a_killed_task(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    data = tmp_path / "demo"
    args = parse(
        "--records", "40k", "--rate", "15000", "--kill-after-s", "0.5", "--interval-ms", "300",
        "--data-dir", str(data),
    )  # fmt: skip
    code = demo.run_demo(args, spark=spark)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "exactly-once: yes" in out, out
    assert _summary_value(out, "restarts").startswith("1 (restored from checkpoint"), out
    assert re.match(r"\d+\.\d+ s from the kill", _summary_value(out, "recovery time")), out
    assert int(_summary_value(out, "checkpoints completed").split()[0]) >= 2
    committed = int(_summary_value(out, "committed rows").split()[0].replace(",", ""))
    assert committed == int(_summary_value(out, "batch Spark rows").replace(",", "")) > 0
    assert (data / "kill.json").is_file() and (data / "checkpoints").is_dir()
    assert not spark.sparkContext._jsc.sc().isStopped()  # the caller's session stays up


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _log_has(path: Path, text: str) -> bool:
    return path.is_file() and text in path.read_text(errors="replace")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("secure", [False, True], ids=["plaintext", "mtls-and-tokens"])
def test_demo_on_a_standalone_spark_cluster_with_a_coordinator_service(
    tmp_path: Path, redis_url: str, secure: bool
) -> None:
    """The compose cluster's setup on one machine: a standalone master and worker from the
    pip-installed pyspark, the coordinator as a service, the demo as the submitting driver.

    ``secure``: every hop with mutual TLS (the coordinator, the agents' control and data
    servers inside the executors, the driver), the driver submitting with an operator token and
    the agents calling as the service identity of their certificate: the settings reach the
    demo, and through it the executors, only as ``SNAPFLOW_*`` environment variables."""
    spark_class = Path(sys.executable).parent / "spark-class"
    if not spark_class.is_file():
        pytest.skip(f"{spark_class} is missing: pyspark's launcher scripts are not installed")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime (java on PATH or JAVA_HOME): Spark cannot start")
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "SPARK_WORKER_DIR": str(tmp_path / "spark-work"),
    }
    coordinator_security: list[str] = []
    driver_env: dict[str, str] = {}
    if secure:
        pki = make_pki(tmp_path / "pki")
        coordinator_security = [
            "--tls-cert-file", str(pki.service_cert), "--tls-key-file", str(pki.service_key),
            "--tls-ca-file", str(pki.ca), "--tls-client-ca-file", str(pki.ca),
            "--auth-tokens-file", str(pki.tokens_file),
            "--auth-identities", f"{SERVICE_NAME}=service",
        ]  # fmt: skip
        # The driver's settings, for the demo process only (each compose service has its own).
        driver_env.update(
            SNAPFLOW_TLS_CA_FILE=str(pki.ca),
            SNAPFLOW_TLS_CERT_FILE=str(pki.service_cert),
            SNAPFLOW_TLS_KEY_FILE=str(pki.service_key),
            SNAPFLOW_TLS_CLIENT_CA_FILE=str(pki.ca),
            SNAPFLOW_AUTH_IDENTITIES=f"{SERVICE_NAME}=service",
            SNAPFLOW_AUTH_TOKENS_FILE=str(pki.tokens_file),
            SNAPFLOW_TOKEN_FILE=str(pki.token_file("operator")),
        )
    master_port, coordinator_port = _free_port(), _free_port()
    logs = {name: tmp_path / f"{name}.log" for name in ("master", "worker", "coordinator")}
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(logs[name], "wb") as log:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    try:
        master_url = f"spark://127.0.0.1:{master_port}"
        start(
            "master",
            [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(master_port), "--webui-port", str(_free_port())],
        )  # fmt: skip
        start(
            "coordinator",
            [sys.executable, "-m", "snapflow.cli", "coordinator", "--host", "127.0.0.1",
             "--port", str(coordinator_port), "--metrics-port", "-1", "--redis-url", redis_url,
             "--storage-root", str(tmp_path / "coordinator-root"), "--log-format", "json",
             *coordinator_security],
        )  # fmt: skip
        wait_until(
            lambda: _log_has(logs["master"], "New state: ALIVE"),
            "the master elected",
            timeout_s=60,
            interval_s=0.2,
            procs=procs,
        )
        start(
            "worker",
            [str(spark_class), "org.apache.spark.deploy.worker.Worker", master_url,
             "--host", "127.0.0.1", "--cores", "4", "--memory", "1g",
             "--webui-port", str(_free_port())],
        )  # fmt: skip
        address = f"127.0.0.1:{coordinator_port}"
        wait_until(
            lambda: is_serving(address, pki.client(cert="service") if secure else None),
            "the coordinator serving",
            timeout_s=30,
            interval_s=0.2,
            procs=procs,
        )
        # The demo waits (bounded) for the worker's executor itself: no wait here.
        run = subprocess.run(
            [sys.executable, "-m", "snapflow.cli", "demo", "--coordinator", address,
             "--spark-master", master_url, "--records", "small",
             "--data-dir", str(tmp_path / "demo")],
            env={**env, **driver_env, "COLUMNS": "160"},
            capture_output=True,
            text=True,
            timeout=180,
        )  # fmt: skip
        out = run.stdout
        worker_log = logs["worker"].read_text(errors="replace")[-2000:]
        assert run.returncode == 0, (
            f"exit {run.returncode}\n{out}\n{run.stderr[-3000:]}\nworker log:\n{worker_log}"
        )
        assert "exactly-once: yes" in out, out
        assert _summary_value(out, "restarts").startswith("1 "), out
        assert f"coordinator {address}" in out and master_url in out
    finally:
        for proc in reversed(procs):
            _stop(proc)
