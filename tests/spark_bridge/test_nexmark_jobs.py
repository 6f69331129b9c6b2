"""A Nexmark query as a job of its own (spark_bridge/nexmark_jobs.py), without Spark: the
pipeline around a query (a source per event kind, handed to the query by kind; exactly-once
files; checkpoints every second) and the command line that builds and executes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from snapflow import NexmarkConfig, NexmarkSource, Pipeline, Stream, TransactionalFileSink
from snapflow.spark_bridge.nexmark_jobs import nexmark_main, nexmark_pipeline


def test_a_source_per_input_kind_handed_to_the_query_by_kind(tmp_path: Path) -> None:
    seen: dict[str, Stream] = {}

    def query(auction: Stream, bid: Stream) -> Stream:
        seen.update(auction=auction, bid=bid)
        times = [s.map_batches(lambda b: b.select(["dateTime"])) for s in (auction, bid)]
        return times[0].union(times[1])

    config = NexmarkConfig(first_event_rate=1000.0)
    out = str(tmp_path / "out")
    p = nexmark_pipeline("qx", ("auction", "bid"), query, 5000, out, parallelism=3, config=config)

    assert p.name == "nexmark-qx" and p.parallelism == 3
    assert p.checkpoint_config.interval_ms == 1000
    vertices = {v.label: v for v in p.graph.vertices}
    assert set(seen) == {"auction", "bid"} <= set(vertices)
    for kind in ("auction", "bid"):
        source = vertices[kind].operators[0].operator
        assert isinstance(source, NexmarkSource)
        assert (source.kind, source.num_events, source.config) == (kind, 5000, config)
    sinks = [o.operator for v in p.graph.vertices for o in v.operators if o.kind == "sink"]
    assert len(sinks) == 1 and isinstance(sinks[0], TransactionalFileSink)
    assert sinks[0].directory == out
    assert sum(v.is_source for v in p.job_graph().vertices) == 2  # a valid job: all sunk


def test_the_command_line_builds_and_executes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[tuple[int, str]] = []
    executed: list[str] = []

    def build(num_events: int, output: str) -> Pipeline:
        built.append((num_events, output))
        return nexmark_pipeline("qy", ("bid",), lambda bid: bid, num_events, output)

    def fake_execute(pipeline: Pipeline, spark: Any = None, **options: Any) -> None:
        executed.append(pipeline.name)

    monkeypatch.setattr("snapflow.spark_bridge.pipeline.execute_pipeline", fake_execute)
    out = str(tmp_path / "out")
    nexmark_main(build, "Nexmark qy, a test.\n\nMore.", ["--events", "300", "--output", out])
    nexmark_main(build, None, ["--output", out])
    assert built == [(300, out), (1_000_000, out)]
    assert executed == ["nexmark-qy", "nexmark-qy"]


def test_the_command_line_needs_an_output_and_its_help_is_the_first_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def build(num_events: int, output: str) -> Pipeline:
        raise AssertionError("not reached")

    doc = "Nexmark qz, a test.\n\nMore."
    with pytest.raises(SystemExit) as exited:
        nexmark_main(build, doc, ["--events", "10"])
    assert exited.value.code == 2
    assert "the following arguments are required: --output" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        nexmark_main(build, doc, ["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "Nexmark qz, a test." in out and "More." not in out
