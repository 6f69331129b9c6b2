"""A Nexmark query of ``examples/nexmark`` as a job of its own: the pipeline around the query
(a Nexmark source per event kind it reads, exactly-once files, checkpoints every second) and
the command line that runs it. Each query file keeps only what is its own (``query``, its
Spark SQL) and builds the rest here."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from snapflow.spark_bridge.pipeline import Pipeline
from snapflow.spark_bridge.streams import Stream
from snapflow.worker.connectors.file_sink import TransactionalFileSink
from snapflow.worker.connectors.nexmark_model import NexmarkConfig
from snapflow.worker.connectors.nexmark_source import NexmarkSource

__all__ = ["nexmark_main", "nexmark_pipeline"]

CHECKPOINT_INTERVAL_MS = 1000
DEFAULT_EVENTS = 1_000_000


def nexmark_pipeline(
    name: str,
    inputs: Sequence[str],
    query: Callable[..., Stream],
    num_events: int,
    output: str,
    parallelism: int = 2,
    config: NexmarkConfig | None = None,
) -> Pipeline:
    """Query ``name`` over the first ``num_events`` Nexmark events: one ``NexmarkSource`` per
    event kind of ``inputs`` (``"person"``, ``"auction"``, ``"bid"``), handed to ``query`` by
    keyword (its parameters are named after the kinds), its result into exactly-once Arrow
    files in ``output``, aligned checkpoints every second."""
    p = Pipeline(f"nexmark-{name}", parallelism=parallelism)
    streams = {k: p.source(NexmarkSource(k, num_events, config=config), name=k) for k in inputs}
    query(**streams).sink(TransactionalFileSink(output))
    p.checkpointing(interval_ms=CHECKPOINT_INTERVAL_MS)
    return p


def nexmark_main(
    build: Callable[[int, str], Pipeline],
    doc: str | None,
    argv: Sequence[str] | None = None,
) -> None:
    """A query file's command line (``python qN.py`` or ``snapflow run qN.py``): ``--events``
    and ``--output``, then ``build(events, output).execute()``; ``doc``, the file's docstring,
    gives the help its first line."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument(
        "--events", type=int, default=DEFAULT_EVENTS, help="Nexmark events (all kinds)"
    )
    parser.add_argument("--output", required=True, help="output directory (Arrow IPC part files)")
    args = parser.parse_args(argv)
    build(args.events, args.output).execute()
